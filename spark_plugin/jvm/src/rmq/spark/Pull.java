package rmq.spark;

import java.io.IOException;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.logging.Logger;

/**
 * One partition's pulls (the Python source's pull_range): PULL_MESSAGE of up to 1024 messages,
 * following the broker's suggestWhichBrokerId to a slave, reading from another replica of the
 * group when one is unreachable, skipping what a filter did not match.
 */
final class Pull {
    private static final Logger LOG = Logger.getLogger("rmq.spark");
    static final int PULL_BATCH = 1024;
    static final int PULL_TIMEOUT_MS = 30_000;
    /** The group named in pulls: pulls neither commit nor suspend, so it owns no offsets. */
    static final String READER_GROUP = "SPARK_RMQ_READER";
    static final String SYS_FLAG = Integer.toString(4 | 16);  // subscription in the request, lite pull

    private final RmqInputPartition part;
    private final Map<String, String> fields = new LinkedHashMap<>();
    private final TreeMap<Long, String> addrs;
    private final String master;
    private final Set<String> unreachable = new HashSet<>();
    private long brokerId = 0;
    long offset;

    Pull(RmqInputPartition part) {
        this.part = part;
        this.addrs = part.brokerAddrs;
        if (addrs.isEmpty()) throw new RmqException("no address of broker " + Remoting.quote(part.brokerName) + " for " + part);
        this.master = addrs.containsKey(0L) ? addrs.get(0L) : addrs.firstEntry().getValue();
        this.offset = part.fromOffset;
        this.depth = part.expressionType.equals("TAG") && splitTags(part.expression).isEmpty() ? PULLS_IN_FLIGHT : 1;
        fields.put("consumerGroup", READER_GROUP);
        fields.put("topic", part.topic);
        fields.put("queueId", Integer.toString(part.queueId));
        fields.put("queueOffset", "");
        fields.put("maxMsgNums", "");
        fields.put("sysFlag", SYS_FLAG);
        fields.put("commitOffset", "0");
        fields.put("suspendTimeoutMillis", "0");
        fields.put("subscription", part.expression);
        fields.put("subVersion", "0");
        fields.put("expressionType", part.expressionType);
    }

    static TreeSet<String> splitTags(String expression) {
        TreeSet<String> out = new TreeSet<>();
        if (expression == null) return out;
        for (String t : expression.split("\\|\\|")) {
            String s = t.trim();
            if (!s.isEmpty() && !s.equals("*")) out.add(s);
        }
        return out;
    }

    // The pulls on the wire, oldest first: {queue offset, max messages, opaque}, all on pendingConn.
    // The next pull goes out before the body before it is decoded, so the broker reads while this
    // reader decodes.  Without a filter a queue's offsets are dense, so PULLS_IN_FLIGHT pulls go
    // out ahead, each starting where the one before it asked to end; an answer that ends short
    // (at a consume-queue file's end) makes the ones after it moot: their answers are read and dropped.
    static final int PULLS_IN_FLIGHT = 3;
    private final java.util.ArrayDeque<long[]> inflight = new java.util.ArrayDeque<>();
    private final int depth;
    private Remoting.Connection pendingConn;
    private final Map<String, Remoting.Connection> conns = new java.util.HashMap<>();
    // one buffer for every answer's body: an answer is read only after the body before it is decoded
    private byte[] buf = new byte[1 << 18];
    byte[] body;

    private Remoting.Connection connection(String addr) throws IOException {
        Remoting.Connection c = conns.get(addr);
        if (c == null) {
            c = Remoting.borrow(addr);
            conns.put(addr, c);
        }
        return c;
    }

    private String address() {
        String addr = addrs.getOrDefault(brokerId, master);
        if (unreachable.contains(addr)) {
            for (String a : addrs.values()) if (!unreachable.contains(a)) { addr = a; break; }
        }
        return addr;
    }

    /** Pulls sent until `depth` are on the wire or the partition's end is asked for. */
    private void fill(String addr) throws IOException {
        boolean fresh = false;
        while (inflight.size() < depth) {
            long[] last = inflight.peekLast();
            long at = last == null ? offset : last[0] + last[1];
            if (at >= part.untilOffset) return;
            long n = Math.min(PULL_BATCH, part.untilOffset - at);
            fields.put("queueOffset", Long.toString(at));
            fields.put("maxMsgNums", Long.toString(n));
            Remoting.Connection c = connection(addr);
            try {
                int opaque = c.send(Remoting.PULL_MESSAGE, fields, null, part.account);
                pendingConn = c;
                inflight.addLast(new long[] {at, n, opaque});
            } catch (IOException e) {
                cancel();
                drop(addr);
                if (e instanceof Remoting.ConnectException || fresh) throw e;
                fresh = true;  // a pooled connection the broker closed: one fresh one
            }
        }
    }

    /** Reads and drops the answers of pulls that no longer start at `offset`. */
    private void dropMoot() throws IOException {
        while (!inflight.isEmpty() && inflight.peekFirst()[0] != offset) {
            pendingConn.receive((int) inflight.pollFirst()[2], PULL_TIMEOUT_MS, buf);
        }
    }

    /** Pulls on the wire no longer wanted: their connection is closed (its answers unread). */
    private void cancel() {
        if (pendingConn != null && !inflight.isEmpty()) drop(pendingConn.addr);
        inflight.clear();
        pendingConn = null;
    }

    private void drop(String addr) {
        Remoting.Connection c = conns.remove(addr);
        if (c != null) c.close();
    }

    /** Reads the next pull answer with messages: its body is body[0, returned length); -1 when
     * the partition is read. */
    int next() {
        while (offset < part.untilOffset) {
            String addr = address();
            Remoting.Response r;
            try {
                if (pendingConn != null && !pendingConn.addr.equals(addr)) cancel();
                try {
                    dropMoot();
                    fill(addr);
                    r = pendingConn.receive((int) inflight.pollFirst()[2], PULL_TIMEOUT_MS, buf);
                } catch (IOException e) {
                    cancel();
                    drop(addr);
                    throw e;
                }
                if (r.body.length > buf.length) buf = r.body;  // a larger answer: keep its buffer
            } catch (Remoting.ConnectException e) {
                unreachable.add(addr);
                if (!unreachable.containsAll(addrs.values())) {
                    LOG.warning("pulling " + part + " from " + addr + " failed (" + e.getMessage() + "); reading from another broker of its group");
                    continue;
                }
                throw new RmqException("pulling " + part + " at offset " + offset + " from " + addr + " failed: " + e.getMessage(), e);
            } catch (IOException e) {
                throw new RmqException("pulling " + part + " at offset " + offset + " from " + addr + " failed: " + e, e);
            }
            long suggested = r.getLong("suggestWhichBrokerId", 0);
            brokerId = addrs.containsKey(suggested) ? suggested : 0;
            long next = r.getLong("nextBeginOffset", 0);
            switch (r.code) {
                case Remoting.SUCCESS:
                    offset = next;
                    if (inflight.isEmpty() || inflight.peekFirst()[0] == offset) {
                        try {
                            fill(address());
                        } catch (IOException e) {
                            cancel();  // the next call connects again (or moves to a replica)
                        }
                    }
                    if (r.bodyLength > 0) {
                        body = r.body;
                        return r.bodyLength;
                    }
                    continue;
                case Remoting.PULL_RETRY_IMMEDIATELY:  // the filter matched nothing in what was scanned
                    offset = next;
                    continue;
                case Remoting.PULL_OFFSET_MOVED: {
                    long min = r.getLong("minOffset", 0);
                    if (offset < min) {
                        offset = RmqScan.checkDataLoss(part.topic, new Admin.Queue(part.brokerName, part.queueId), offset,
                            part.untilOffset, min, part.failOnDataLoss);
                        continue;
                    }
                    break;
                }
                case Remoting.PULL_NOT_FOUND:
                    if (next > offset) {  // a consume-queue file gone missing: skip past it
                        offset = next;
                        continue;
                    }
                    break;
                default:
                    throw new RmqException("pulling " + part + " at offset " + offset + " from " + addr + " failed: code "
                        + r.code + " " + r.remark);
            }
            if ((brokerId != 0 || !addr.equals(master)) && !unreachable.contains(master)) {
                brokerId = 0;  // a slave behind its master: ask the master
                continue;
            }
            throw new RmqException(part + " ends at offset " + r.getLong("maxOffset", 0) + ", before the partition's until offset "
                + part.untilOffset + " (pull at " + offset + ": code " + r.code + ")");
        }
        return -1;
    }

    /** The partition's first offset retention kept (GET_MIN_OFFSET; failOnDataLoss decides
     * about a lost head), for a read that needs no message. */
    long firstKeptOffset() {
        Map<String, String> f = new LinkedHashMap<>();
        f.put("topic", part.topic);
        f.put("queueId", Integer.toString(part.queueId));
        IOException last = null;
        for (String addr : addrs.values()) {
            try {
                Remoting.Response r = Remoting.call(addr, Remoting.GET_MIN_OFFSET, f, null, part.account, PULL_TIMEOUT_MS);
                if (r.code != Remoting.SUCCESS) {
                    throw new RmqException("broker " + Remoting.quote(part.brokerName) + " refused the min offset of " + part
                        + ": code " + r.code + " " + r.remark);
                }
                long min = Math.max(0, r.getLong("offset", 0));
                return RmqScan.checkDataLoss(part.topic, new Admin.Queue(part.brokerName, part.queueId), part.fromOffset,
                    part.untilOffset, min, part.failOnDataLoss);
            } catch (IOException e) {
                last = e;
            }
        }
        throw new RmqException("broker " + Remoting.quote(part.brokerName) + " unreachable for " + part + ": "
            + (last == null ? "no address" : last.getMessage()));
    }

    void close() {
        for (Remoting.Connection c : conns.values()) {
            if (c == pendingConn && !inflight.isEmpty()) c.close(); else Remoting.release(c);  // (unread answers: not reusable)
        }
        conns.clear();
        inflight.clear();
        pendingConn = null;
    }

    /** A SQL92 expression the broker cannot parse fails planning (one pull of one message). */
    static void checkExpression(Admin admin, ReadOptions o, Admin.Queue q, String expression) {
        Map<String, String> f = new LinkedHashMap<>();
        f.put("consumerGroup", READER_GROUP);
        f.put("topic", o.topic);
        f.put("queueId", Integer.toString(q.queueId));
        f.put("queueOffset", "0");
        f.put("maxMsgNums", "1");
        f.put("sysFlag", SYS_FLAG);
        f.put("commitOffset", "0");
        f.put("suspendTimeoutMillis", "0");
        f.put("subscription", expression);
        f.put("subVersion", "0");
        f.put("expressionType", o.expressionType);
        Remoting.Response r;
        try {
            r = Remoting.call(admin.addrsOf(q.brokerName).get(0), Remoting.PULL_MESSAGE, f, null, o.account, Admin.TIMEOUT_MS);
        } catch (IOException e) {
            throw new RmqException("broker " + Remoting.quote(q.brokerName) + " unreachable: " + e.getMessage());
        }
        if (r.code == 23 || r.code == 24) {  // SUBSCRIPTION_PARSE_FAILED / _NOT_EXIST
            throw new IllegalArgumentException("bad " + o.expressionType + " expression " + Remoting.quote(expression) + ": " + r.remark);
        }
    }
}
