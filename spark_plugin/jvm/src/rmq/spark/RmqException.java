package rmq.spark;

/** A broker or name server failure (bad input is an IllegalArgumentException naming the value). */
public class RmqException extends RuntimeException {
    public RmqException(String message) { super(message); }
    public RmqException(String message, Throwable cause) { super(message, cause); }
}
