package rmq.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * A streaming read (the Python source's RmqStreamReader, in the JVM): offsets are
 * {"broker": {"queue id": offset}} (the same JSON, so a checkpoint means the same to both);
 * maxRecordsPerBatch splits a micro-batch's messages across queues by backlog; under
 * Trigger.AvailableNow the query stops at the offsets of the moment it started; with
 * consumerGroup, the end of every batch the checkpoint holds becomes the group's broker-side
 * offsets (written when Spark next asks for offsets, and at commit).
 */
final class RmqMicroBatchStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final ReadOptions opts;
    private final int[] columns;
    private final Admin admin;
    private final Map<Admin.Queue, Long> committed = new HashMap<>();
    private Map<Admin.Queue, Long> target;  // availableNow: where the query ends

    RmqMicroBatchStream(ReadOptions opts, int[] columns) {
        this.opts = opts;
        this.columns = columns;
        this.admin = new Admin(opts.namesrv, opts.account);
    }

    static final class Positions extends Offset {
        final TreeMap<Admin.Queue, Long> table;

        Positions(Map<Admin.Queue, Long> table) { this.table = new TreeMap<>(table); }

        @Override
        public String json() {
            TreeMap<String, TreeMap<String, Long>> out = new TreeMap<>();
            for (Map.Entry<Admin.Queue, Long> e : table.entrySet()) {
                out.computeIfAbsent(e.getKey().brokerName, k -> new TreeMap<>()).put(Integer.toString(e.getKey().queueId), e.getValue());
            }
            try {
                return JSON.writeValueAsString(out);
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
        }

        static Positions parse(String json) {
            TreeMap<Admin.Queue, Long> t = new TreeMap<>();
            try {
                JsonNode node = JSON.readTree(json);
                for (Iterator<Map.Entry<String, JsonNode>> b = node.fields(); b.hasNext(); ) {
                    Map.Entry<String, JsonNode> be = b.next();
                    for (Iterator<Map.Entry<String, JsonNode>> q = be.getValue().fields(); q.hasNext(); ) {
                        Map.Entry<String, JsonNode> qe = q.next();
                        t.put(new Admin.Queue(be.getKey(), Integer.parseInt(qe.getKey())), qe.getValue().asLong());
                    }
                }
            } catch (IOException e) {
                throw new IllegalArgumentException("malformed rmq stream offset " + Remoting.quote(json) + ": " + e.getMessage());
            }
            return new Positions(t);
        }
    }

    @Override
    public Offset initialOffset() {
        List<Admin.Queue> queues = admin.queues(opts.topic);
        RmqScan.checkPositionsNameQueues(opts.topic, opts.starting, queues, "start");
        Map<Admin.Queue, Long> initial = new TreeMap<>();
        for (Admin.Queue q : queues) {
            long lo = admin.minOffset(opts.topic, q), hi = admin.maxOffset(opts.topic, q);
            long frm = opts.startingTimestamp != null
                ? Math.min(Math.max(admin.offsetForTimestamp(opts.topic, q, opts.startingTimestamp), lo), hi)
                : RmqScan.resolve(opts.starting, q, ReadOptions.LATEST, lo, hi);  // as Kafka's: from now on
            RmqScan.checkRange(opts.topic, q, frm, hi, hi);
            initial.put(q, frm);
        }
        committed.putAll(initial);  // a new query's start is no progress to write over the group's
        return new Positions(initial);
    }

    @Override
    public Offset deserializeOffset(String json) { return Positions.parse(json); }

    @Override
    public Offset latestOffset() { throw new UnsupportedOperationException("latestOffset(start, limit) is used"); }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return opts.maxRecordsPerBatch != null ? ReadLimit.maxRows(opts.maxRecordsPerBatch) : ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        target = new HashMap<>();
        for (Admin.Queue q : admin.queues(opts.topic)) target.put(q, admin.maxOffset(opts.topic, q));
    }

    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        List<Admin.Queue> queues = admin.queues(opts.topic);
        Map<Admin.Queue, Long> begin = startOffset == null ? new TreeMap<>() : ((Positions) startOffset).table;
        commitGroup(begin);  // every batch before `start` is in the checkpoint
        Map<Admin.Queue, Long> latest = new TreeMap<>();
        for (Admin.Queue q : queues) {
            long max = admin.maxOffset(opts.topic, q);
            if (target != null) max = target.containsKey(q) ? Math.min(max, target.get(q)) : begin.getOrDefault(q, 0L);
            latest.put(q, max);
        }
        Map<Admin.Queue, Long> end = new TreeMap<>(begin);  // a queue that left the route keeps its position
        Map<Admin.Queue, Long> from = new TreeMap<>(), backlog = new TreeMap<>();
        for (Admin.Queue q : queues) {
            Long f = begin.get(q);
            long frm = f != null ? f : admin.minOffset(opts.topic, q);  // a new queue: from its earliest
            from.put(q, frm);
            backlog.put(q, Math.max(0, latest.get(q) - frm));
        }
        Long maxRows = limit instanceof ReadMaxRows ? ((ReadMaxRows) limit).maxRows() : null;
        for (Map.Entry<Admin.Queue, Long> e : splitByBacklog(backlog, maxRows).entrySet()) {
            end.put(e.getKey(), from.get(e.getKey()) + e.getValue());
        }
        return new Positions(end);
    }

    /** How many messages each queue gives to a batch of at most maxRows (the Python source's
     * split_by_backlog): all when everything fits, else shares by backlog, rounding's rest to the
     * largest backlogs. */
    static Map<Admin.Queue, Long> splitByBacklog(Map<Admin.Queue, Long> backlog, Long maxRows) {
        long total = 0;
        for (long b : backlog.values()) total += b;
        if (maxRows == null || total <= maxRows) return backlog;
        Map<Admin.Queue, Long> shares = new TreeMap<>();
        long given = 0;
        for (Map.Entry<Admin.Queue, Long> e : backlog.entrySet()) {
            long s = java.math.BigInteger.valueOf(maxRows).multiply(java.math.BigInteger.valueOf(e.getValue()))
                .divide(java.math.BigInteger.valueOf(total)).longValue();
            shares.put(e.getKey(), s);
            given += s;
        }
        long left = maxRows - given;
        List<Admin.Queue> order = new ArrayList<>(backlog.keySet());
        order.sort((a, b) -> {
            int c = Long.compare(backlog.get(b), backlog.get(a));
            return c != 0 ? c : a.compareTo(b);
        });
        for (Admin.Queue q : order) {
            if (left <= 0) break;
            if (shares.get(q) < backlog.get(q)) {
                shares.put(q, shares.get(q) + 1);
                left--;
            }
        }
        return shares;
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        Map<Admin.Queue, Long> begin = ((Positions) start).table;
        List<Admin.Queue> queues = admin.queues(opts.topic);
        List<InputPartition> out = new ArrayList<>();
        for (Map.Entry<Admin.Queue, Long> e : ((Positions) end).table.entrySet()) {
            Admin.Queue q = e.getKey();
            long until = e.getValue();
            Long f = begin.get(q);
            long frm = f != null ? f : admin.minOffset(opts.topic, q);
            if (until <= frm) continue;
            if (!admin.brokerAddrs.containsKey(q.brokerName) || !queues.contains(q)) {
                throw new RmqException("broker " + Remoting.quote(q.brokerName) + " left the route of topic "
                    + Remoting.quote(opts.topic) + ": cannot read [" + frm + ", " + until + ") of its queue " + q.queueId
                    + " (restart the query once it is back)");
            }
            frm = RmqScan.checkDataLoss(opts.topic, q, frm, until, admin.minOffset(opts.topic, q), opts.failOnDataLoss);
            if (until <= frm) continue;
            out.add(new RmqInputPartition(opts.topic, q.brokerName, q.queueId, frm, until, admin.brokerAddrs.get(q.brokerName),
                opts.expression, opts.expressionType, opts.failOnDataLoss, opts.account));
        }
        return out.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() { return new RmqReaderFactory(columns, null); }

    @Override
    public void commit(Offset end) { commitGroup(((Positions) end).table); }

    private void commitGroup(Map<Admin.Queue, Long> positions) {
        if (opts.consumerGroup == null || opts.consumerGroup.isEmpty()) return;
        if (admin.brokerAddrs.isEmpty()) admin.queues(opts.topic);
        for (Map.Entry<Admin.Queue, Long> e : positions.entrySet()) {
            if (!e.getValue().equals(committed.get(e.getKey()))) {
                admin.commitOffset(opts.consumerGroup, opts.topic, e.getKey(), e.getValue());
                committed.put(e.getKey(), e.getValue());
            }
        }
    }

    @Override
    public void stop() { }
}
