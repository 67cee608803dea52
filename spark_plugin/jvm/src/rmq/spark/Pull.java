package rmq.spark;

import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.logging.Logger;

/**
 * One partition's pulls (the Python source's pull_range): PULL_MESSAGE of up to 8192 messages
 * (a broker sends at most 1024 over the connection),
 * following the broker's suggestWhichBrokerId to a slave, reading from another replica of the
 * group when one is unreachable, skipping what a filter did not match.
 *
 * A local read: a pull asks for it (localRead=true) and a broker on this host answers where the
 * records lie in its commit-log files (localRecordRuns) instead of sending them; they are copied
 * out of the mapped files, each record's physical offset checked against where it was read.  A
 * broker elsewhere, one with pullLocalReadEnable=false, or files this process cannot read (another
 * user's, another container's) mean pulls over the connection, as before.
 */
final class Pull {
    private static final Logger LOG = Logger.getLogger("rmq.spark");
    static final int PULL_BATCH = 8192;
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
    private boolean localRead = true;
    private final Map<String, MappedByteBuffer> segments = new HashMap<>();  // path -> its mapping

    Pull(RmqInputPartition part) {
        this.part = part;
        this.addrs = part.brokerAddrs;
        if (addrs.isEmpty()) throw new RmqException("no address of broker " + Remoting.quote(part.brokerName) + " for " + part);
        this.master = addrs.containsKey(0L) ? addrs.get(0L) : addrs.firstEntry().getValue();
        this.offset = part.fromOffset;
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

    // the pull on the wire: sent as soon as the answer before it named its offset, so the broker
    // reads it while this reader decodes the body before (one only: with more on the wire the
    // broker's answers wait in the socket and cost its one thread more CPU per message, measured)
    private Remoting.Connection pendingConn;
    private int pendingOpaque;
    private long pendingOffset = -1;
    private final Map<String, Remoting.Connection> conns = new java.util.HashMap<>();

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

    private void send(String addr) throws IOException {
        fields.put("queueOffset", Long.toString(offset));
        fields.put("maxMsgNums", Long.toString(Math.min(PULL_BATCH, part.untilOffset - offset)));
        if (localRead) fields.put(LOCAL_READ, "true"); else fields.remove(LOCAL_READ);
        Remoting.Connection c = connection(addr);
        try {
            pendingOpaque = c.send(Remoting.PULL_MESSAGE, fields, null, part.account);
        } catch (IOException e) {
            drop(addr);
            if (e instanceof Remoting.ConnectException) throw e;
            c = connection(addr);  // a pooled connection the broker closed: one fresh one
            pendingOpaque = c.send(Remoting.PULL_MESSAGE, fields, null, part.account);
        }
        pendingConn = c;
        pendingOffset = offset;
    }

    private void drop(String addr) {
        Remoting.Connection c = conns.remove(addr);
        if (c != null) c.close();
    }

    // one buffer for every answer's body: an answer is read only after the body before it is decoded
    private byte[] buf = new byte[1 << 18];
    byte[] body;

    /** Reads the next pull answer with messages: its body is body[0, returned length); -1 when
     * the partition is read. */
    int next() {
        while (offset < part.untilOffset) {
            String addr = address();
            Remoting.Response r;
            try {
                if (pendingConn == null || pendingOffset != offset || !pendingConn.addr.equals(addr)) {
                    if (pendingConn != null) drop(pendingConn.addr);  // an answer no longer wanted
                    send(addr);
                }
                Remoting.Connection c = pendingConn;
                pendingConn = null;
                try {
                    r = c.receive(pendingOpaque, PULL_TIMEOUT_MS, buf);
                    if (r.body.length > buf.length) buf = r.body;  // a larger answer: keep its buffer
                } catch (IOException e) {
                    drop(addr);
                    throw e;
                }
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
                case Remoting.SUCCESS: {
                    String runs = r.ext.get(LOCAL_RECORD_RUNS);
                    int length = r.bodyLength;
                    if (runs != null) {
                        try {
                            length = readLocal(runs);
                        } catch (IOException | RuntimeException | InternalError e) {
                            // (the same pull again, over the connection: offset is unchanged; said once
                            // per broker in this JVM, each partition of each read finding out for itself)
                            java.util.logging.Level level = LOCAL_READ_WARNED.add(addr)
                                ? java.util.logging.Level.WARNING : java.util.logging.Level.FINE;
                            LOG.log(level, "reading " + part + " from " + addr + "'s commit-log files failed (" + e
                                + "); pulling over the connection instead");
                            localRead = false;
                            segments.clear();
                            continue;
                        }
                    }
                    offset = next;
                    if (offset < part.untilOffset) {
                        try {
                            send(address());
                        } catch (IOException e) {
                            pendingConn = null;  // the next call connects again (or moves to a replica)
                        }
                    }
                    if (length > 0) {
                        body = runs != null ? buf : r.body;
                        return length;
                    }
                    continue;
                }
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

    static final String LOCAL_READ = "localRead", LOCAL_RECORD_RUNS = "localRecordRuns";
    private static final Set<String> LOCAL_READ_WARNED = java.util.concurrent.ConcurrentHashMap.newKeySet();

    /** A local read's records copied into buf: localRecordRuns has a line per commit-log segment,
     * "fileFromOffset,start,end[,start,end...]\tpath".  Returns their length. */
    private int readLocal(String runs) throws IOException {
        int total = 0;
        for (String line : runs.split("\n")) {
            int tab = line.indexOf('\t');
            if (tab < 0) throw new IOException("bad localRecordRuns line " + Remoting.quote(line));
            String[] nums = line.substring(0, tab).split(",");
            if (nums.length < 3 || nums.length % 2 == 0) throw new IOException("bad localRecordRuns line " + Remoting.quote(line));
            long fileFrom = Long.parseLong(nums[0]);
            MappedByteBuffer seg = segment(line.substring(tab + 1));
            for (int k = 1; k < nums.length; k += 2) {
                int start = Integer.parseInt(nums[k]), end = Integer.parseInt(nums[k + 1]);
                if (start < 0 || end <= start || end > seg.capacity()) {
                    throw new IOException("run [" + start + ", " + end + ") is outside the segment's " + seg.capacity() + " bytes");
                }
                int n = end - start;
                if (total + n > buf.length) buf = java.util.Arrays.copyOf(buf, Math.max(total + n, buf.length * 2));
                seg.get(start, buf, total, n);
                checkRecords(buf, total, n, fileFrom + start);
                total += n;
            }
        }
        return total;
    }

    /** The records of buf[at, at + n) are whole and each names the commit-log offset it was read
     * at: the file is the broker's (not another store's at the same path). */
    private static void checkRecords(byte[] b, int at, int n, long physical) throws IOException {
        int p = at, end = at + n;
        while (p < end) {
            if (end - p < Records.RECORD_FIXED_V4) throw new IOException("a record is cut at commit-log offset " + physical);
            int size = Records.i32(b, p);
            if (size < Records.RECORD_FIXED_V4 || size > end - p || Records.i32(b, p + 4) != Records.MESSAGE_MAGIC
                || Records.i64(b, p + 28) != physical) {
                throw new IOException("no record of commit-log offset " + physical + " where the broker said (size " + size + ")");
            }
            p += size;
            physical += size;
        }
    }

    private MappedByteBuffer segment(String path) throws IOException {
        MappedByteBuffer m = segments.get(path);
        if (m == null) {
            try (FileChannel ch = FileChannel.open(Path.of(path), StandardOpenOption.READ)) {
                long size = ch.size();
                if (size > Integer.MAX_VALUE) throw new IOException("segment " + path + " is over 2 GiB (" + size + " bytes)");
                m = ch.map(FileChannel.MapMode.READ_ONLY, 0, size);
            }
            segments.put(path, m);
        }
        return m;
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
        segments.clear();  // (unmapped when collected)
        for (Remoting.Connection c : conns.values()) {
            if (c == pendingConn) c.close(); else Remoting.release(c);  // (an unread answer: not reusable)
        }
        conns.clear();
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
