package rmq.spark;

import java.util.TreeMap;

import org.apache.spark.sql.connector.read.InputPartition;

/** Messages [fromOffset, untilOffset) of one queue, with what it takes to pull them. */
final class RmqInputPartition implements InputPartition {
    final String topic, brokerName, expression, expressionType;
    final int queueId;
    final long fromOffset, untilOffset;
    final TreeMap<Long, String> brokerAddrs;  // broker id -> host:port (a pull follows suggestWhichBrokerId)
    final boolean failOnDataLoss;
    final Remoting.Account account;

    RmqInputPartition(String topic, String brokerName, int queueId, long fromOffset, long untilOffset,
                      TreeMap<Long, String> brokerAddrs, String expression, String expressionType,
                      boolean failOnDataLoss, Remoting.Account account) {
        this.topic = topic; this.brokerName = brokerName; this.queueId = queueId;
        this.fromOffset = fromOffset; this.untilOffset = untilOffset;
        this.brokerAddrs = new TreeMap<>(brokerAddrs);
        this.expression = expression; this.expressionType = expressionType;
        this.failOnDataLoss = failOnDataLoss; this.account = account;
    }

    @Override
    public String toString() {
        return topic + "@" + brokerName + ":" + queueId + " [" + fromOffset + ", " + untilOffset + ")";
    }
}
