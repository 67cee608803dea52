package rmq.spark;

import java.io.Serializable;
import java.util.Arrays;
import java.util.Iterator;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/** The options of format("rmq"), checked at once, each bad one named with its value (the same
 * options and messages as the Python source's ReadOptions). */
final class ReadOptions implements Serializable {
    static final long EARLIEST = -2, LATEST = -1;
    static final Set<String> KNOWN = new TreeSet<>(Arrays.asList(
        "namesrv", "topic", "expression", "expressiontype", "startingoffsets", "endingoffsets", "startingtimestamp",
        "failondataloss", "maxrecordsperbatch", "consumergroup", "accesskey", "secretkey", "columns",
        "maxrecordsperpartition", "includeproperties"));
    static final long DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000L;

    final String namesrv, topic, expression, expressionType, consumerGroup;
    /** null: not given; a map (broker, queue id) -> offset; or EARLIEST/LATEST in `startingAll`. */
    final Positions starting, ending;
    final Long startingTimestamp;
    final boolean failOnDataLoss;
    final Long maxRecordsPerBatch;
    final long maxRecordsPerPartition;
    final Remoting.Account account;
    final String columns;

    /** A parsed startingOffsets / endingOffsets: all queues at one end, or a table. */
    static final class Positions implements Serializable {
        final long all;  // EARLIEST / LATEST when table is null
        final TreeMap<String, TreeMap<Integer, Long>> table;

        Positions(long all, TreeMap<String, TreeMap<Integer, Long>> table) { this.all = all; this.table = table; }

        Long get(String broker, int queueId) {
            if (table == null) return all;
            TreeMap<Integer, Long> q = table.get(broker);
            return q == null ? null : q.get(queueId);
        }
    }

    ReadOptions(Map<String, String> options, boolean streaming) {
        Map<String, String> o = new TreeMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) o.put(e.getKey().toLowerCase(), e.getValue());
        TreeSet<String> unknown = new TreeSet<>(o.keySet());
        unknown.removeAll(KNOWN);
        unknown.remove("path");
        if (!unknown.isEmpty()) {
            throw new IllegalArgumentException("unknown option(s) of the rmq source: " + pyList(unknown) + " (known: "
                + pyList(KNOWN) + ")");
        }
        namesrv = o.get("namesrv");
        if (namesrv == null || namesrv.isEmpty()) {
            throw new IllegalArgumentException("the name server address (option 'namesrv') is missing: got None");
        }
        if (namesrv.startsWith("inproc://")) {
            throw new IllegalArgumentException("name server " + Remoting.quote(namesrv) + " is in-proc, which Spark's "
                + "executors cannot reach: pass the TCP address (cluster.tcp_namesrv)");
        }
        topic = o.get("topic");
        if (topic == null || topic.isEmpty()) throw new IllegalArgumentException("the rmq source needs option 'topic'");
        String et = o.get("expressiontype");
        expressionType = et == null || et.isEmpty() ? "TAG" : et.toUpperCase();
        if (!expressionType.equals("TAG") && !expressionType.equals("SQL92")) {
            throw new IllegalArgumentException("bad expressionType " + Remoting.quote(et) + ": expected TAG or SQL92");
        }
        String ex = o.get("expression");
        expression = ex == null || ex.isEmpty() ? "*" : ex;
        starting = parsePositions(o.get("startingoffsets"), "startingOffsets");
        ending = parsePositions(o.get("endingoffsets"), "endingOffsets");
        if (streaming && ending != null) {
            throw new IllegalArgumentException("endingOffsets is a batch option; a streaming query reads on");
        }
        String ts = o.get("startingtimestamp");
        if (ts != null) {
            long v;
            try {
                v = Long.parseLong(ts.trim());
            } catch (NumberFormatException e) {
                v = -1;
            }
            if (v < 0) {
                throw new IllegalArgumentException("bad startingTimestamp " + Remoting.quote(ts)
                    + ": expected epoch milliseconds >= 0");
            }
            if (starting != null) throw new IllegalArgumentException("give startingOffsets or startingTimestamp, not both");
            startingTimestamp = v;
        } else {
            startingTimestamp = null;
        }
        failOnDataLoss = flag(o.get("failondataloss"), "failOnDataLoss", true);
        flag(o.get("includeproperties"), "includeProperties", false);  // (it shapes the schema; checked here under a user schema)
        maxRecordsPerBatch = positiveLong(o.get("maxrecordsperbatch"), "maxRecordsPerBatch");
        Long mp = positiveLong(o.get("maxrecordsperpartition"), "maxRecordsPerPartition");
        maxRecordsPerPartition = mp == null ? DEFAULT_MAX_RECORDS_PER_PARTITION : mp;
        consumerGroup = o.get("consumergroup");
        account = Remoting.Account.of(o.get("accesskey"), o.get("secretkey"));
        columns = o.get("columns");
    }

    /** The true/false option `name` (its value `text`, null when not given); another value is refused naming it. */
    static boolean flag(String text, String name, boolean dflt) {
        if (text == null) return dflt;
        String v = text.trim().toLowerCase();
        if (!v.equals("true") && !v.equals("false")) {
            throw new IllegalArgumentException("bad " + name + " " + Remoting.quote(text) + ": expected true or false");
        }
        return v.equals("true");
    }

    private static Long positiveLong(String text, String name) {
        if (text == null) return null;
        try {
            long v = Long.parseLong(text.trim());
            if (v > 0) return v;
        } catch (NumberFormatException ignored) { }
        throw new IllegalArgumentException("bad " + name + " " + Remoting.quote(text) + ": expected an integer > 0");
    }

    static String pyList(Set<String> names) {
        StringBuilder sb = new StringBuilder("[");
        for (String n : names) {
            if (sb.length() > 1) sb.append(", ");
            sb.append(Remoting.quote(n));
        }
        return sb.append(']').toString();
    }

    static Positions parsePositions(String value, String option) {
        if (value == null) return null;
        String text = value.trim();
        if (text.equalsIgnoreCase("earliest")) return new Positions(EARLIEST, null);
        if (text.equalsIgnoreCase("latest")) return new Positions(LATEST, null);
        JsonNode node;
        try {
            node = new ObjectMapper().readTree(text);
        } catch (Exception e) {
            throw new IllegalArgumentException("malformed " + option + " " + Remoting.quote(text)
                + ": expected 'earliest', 'latest' or JSON like {\"broker-a\": {\"0\": 23, \"1\": -2}} ("
                + e.getMessage().split("\n")[0] + ")");
        }
        if (node == null || !node.isObject()) {
            throw new IllegalArgumentException("malformed " + option + " " + Remoting.quote(text)
                + ": expected a JSON object of brokers");
        }
        TreeMap<String, TreeMap<Integer, Long>> table = new TreeMap<>();
        for (Iterator<Map.Entry<String, JsonNode>> it = node.fields(); it.hasNext(); ) {
            Map.Entry<String, JsonNode> b = it.next();
            if (!b.getValue().isObject()) {
                throw new IllegalArgumentException("malformed " + option + ": broker " + Remoting.quote(b.getKey())
                    + " maps to " + b.getValue() + ", expected an object of queue id -> offset");
            }
            TreeMap<Integer, Long> qs = new TreeMap<>();
            for (Iterator<Map.Entry<String, JsonNode>> qi = b.getValue().fields(); qi.hasNext(); ) {
                Map.Entry<String, JsonNode> q = qi.next();
                int qid;
                try {
                    qid = Integer.parseInt(q.getKey().trim());
                } catch (NumberFormatException e) {
                    throw new IllegalArgumentException("malformed " + option + ": queue id " + Remoting.quote(q.getKey())
                        + " of broker " + Remoting.quote(b.getKey()) + " is not an integer");
                }
                JsonNode off = q.getValue();
                if (!off.isIntegralNumber() || off.asLong() < -2 || qid < 0) {
                    throw new IllegalArgumentException("bad " + option + ": offset " + off + " of " + b.getKey() + ":"
                        + q.getKey() + " (expected an offset >= 0, -2 = earliest or -1 = latest)");
                }
                qs.put(qid, off.asLong());
            }
            table.put(b.getKey(), qs);
        }
        return new Positions(0, table);
    }
}
