package rmq.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.logging.Logger;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;

/** A batch read: one partition per queue range (ranges over maxRecordsPerPartition split). */
final class RmqScan implements Scan, Batch {
    private static final Logger LOG = Logger.getLogger("rmq.spark");

    private final RmqScanBuilder b;
    private final ReadOptions opts;
    private final int[] columns;

    RmqScan(RmqScanBuilder builder) {
        this.b = builder;
        this.opts = new ReadOptions(builder.options.asCaseSensitiveMap(), false);
        this.columns = Columns.indexesOf(builder.required);
    }

    @Override
    public StructType readSchema() { return b.required; }

    @Override
    public String description() {
        String p = b.pushed.toString();
        return "rmq topic=" + opts.topic + " columns=" + Arrays.toString(b.required.fieldNames())
            + (p.isEmpty() ? "" : " pushed=[" + p + "]");
    }

    @Override
    public Batch toBatch() { return this; }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return new RmqMicroBatchStream(new ReadOptions(b.options.asCaseSensitiveMap(), true), columns);
    }

    /** The tag expression sent to the brokers (the pushed tags, else the option). */
    private String expression() {
        if (b.pushed.tags == null) return opts.expression;
        return String.join(" || ", b.pushed.tags);
    }

    @Override
    public InputPartition[] planInputPartitions() {
        if (b.pushed.empty()) return new InputPartition[0];
        String expression = expression();
        Admin admin = new Admin(opts.namesrv, opts.account);
        List<Admin.Queue> queues = admin.queues(opts.topic);
        checkPositionsNameQueues(opts.topic, opts.starting, queues, "start");
        checkPositionsNameQueues(opts.topic, opts.ending, queues, "end");
        if (opts.expressionType.equals("SQL92")) Pull.checkExpression(admin, opts, queues.get(0), expression);
        List<InputPartition> out = new ArrayList<>();
        for (Admin.Queue q : queues) {
            if (b.pushed.brokers != null && !b.pushed.brokers.contains(q.brokerName)) continue;
            if (b.pushed.queueIds != null && !b.pushed.queueIds.contains(q.queueId)) continue;
            long lo = admin.minOffset(opts.topic, q), hi = admin.maxOffset(opts.topic, q);
            long frm = opts.startingTimestamp != null
                ? Math.min(Math.max(admin.offsetForTimestamp(opts.topic, q, opts.startingTimestamp), lo), hi)
                : resolve(opts.starting, q, ReadOptions.EARLIEST, lo, hi);
            long until = resolve(opts.ending, q, ReadOptions.LATEST, lo, hi);
            checkRange(opts.topic, q, frm, until, hi);
            if (until > frm) frm = checkDataLoss(opts.topic, q, frm, until, lo, opts.failOnDataLoss);
            // the pushed offset and store-time bounds narrow the range further
            frm = Math.max(frm, b.pushed.minOffset);
            until = Math.min(until, b.pushed.maxOffsetExclusive);
            if (b.pushed.storeTimeFrom >= 0 && until > frm) {
                frm = Math.max(frm, admin.offsetForTimestamp(opts.topic, q, b.pushed.storeTimeFrom));
            }
            if (until <= frm) continue;
            TreeMap<Long, String> addrs = admin.brokerAddrs.get(q.brokerName);
            for (long s = frm; s < until; s += opts.maxRecordsPerPartition) {
                out.add(new RmqInputPartition(opts.topic, q.brokerName, q.queueId, s,
                    Math.min(until, s + opts.maxRecordsPerPartition), addrs, expression, opts.expressionType,
                    opts.failOnDataLoss, opts.account));
            }
        }
        return out.toArray(new InputPartition[0]);
    }

    static long resolve(ReadOptions.Positions p, Admin.Queue q, long dflt, long lo, long hi) {
        Long pos = p == null ? null : p.get(q.brokerName, q.queueId);
        long v = pos == null ? dflt : pos;
        if (v == ReadOptions.EARLIEST) return lo;
        if (v == ReadOptions.LATEST) return hi;
        return v;
    }

    static void checkPositionsNameQueues(String topic, ReadOptions.Positions p, List<Admin.Queue> queues, String option) {
        if (p == null || p.table == null) return;
        java.util.TreeSet<String> known = new java.util.TreeSet<>();
        java.util.Set<Admin.Queue> set = new java.util.HashSet<>(queues);
        for (Admin.Queue q : queues) known.add("('" + q.brokerName + "', " + q.queueId + ")");
        for (Map.Entry<String, TreeMap<Integer, Long>> b : p.table.entrySet()) {
            for (Integer qid : b.getValue().keySet()) {
                if (!set.contains(new Admin.Queue(b.getKey(), qid))) {
                    throw new IllegalArgumentException(option + " names queue " + qid + " of broker " + Remoting.quote(b.getKey())
                        + ", which topic " + Remoting.quote(topic) + " does not have (queues: [" + String.join(", ", known) + "])");
                }
            }
        }
    }

    static String queueName(String topic, Admin.Queue q) {
        return "queue " + q.queueId + " of broker " + Remoting.quote(q.brokerName) + " (topic " + Remoting.quote(topic) + ")";
    }

    static void checkRange(String topic, Admin.Queue q, long frm, long until, long max) {
        String name = queueName(topic, q);
        if (frm < 0 || until < 0) throw new IllegalArgumentException("negative offset range [" + frm + ", " + until + ") of " + name);
        if (until < frm) throw new IllegalArgumentException("reversed offset range of " + name + ": from " + frm + " > until " + until);
        if (until > max) {
            throw new IllegalArgumentException("offset range [" + frm + ", " + until + ") of " + name
                + " runs past the queue's max offset " + max);
        }
    }

    static long checkDataLoss(String topic, Admin.Queue q, long frm, long until, long min, boolean fail) {
        if (frm >= min || frm >= until) return frm;
        long lostUntil = Math.min(min, until);
        String msg = "data loss in queue " + q.queueId + " of broker " + Remoting.quote(q.brokerName) + " (topic "
            + Remoting.quote(topic) + "): offsets [" + frm + ", " + lostUntil + ") were deleted by retention (the queue now starts at "
            + min + ")";
        if (fail) throw new DataLossException(msg + "; set failOnDataLoss=false to continue from the first kept offset");
        LOG.warning(msg + "; continuing from offset " + lostUntil + " (failOnDataLoss=false)");
        return lostUntil;
    }

    @Override
    public PartitionReaderFactory createReaderFactory() { return new RmqReaderFactory(columns, b.pushed.tags); }

    /** Retention deleted part of a requested range (failOnDataLoss=true). */
    static final class DataLossException extends IllegalArgumentException {
        DataLossException(String m) { super(m); }
    }

}
