package rmq.spark;

/**
 * A name server or broker that cannot serve the read the options ask for (unreachable, refusing,
 * a queue ending early).  An IllegalArgumentException, as the options' own errors are, so PySpark
 * shows the message as it shows theirs rather than as a raw Java error.
 */
public class RmqException extends IllegalArgumentException {
    public RmqException(String message) { super(message); }
    public RmqException(String message, Throwable cause) { super(message, cause); }
}
