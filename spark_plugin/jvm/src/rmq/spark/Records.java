package rmq.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Set;
import java.util.zip.DataFormatException;
import java.util.zip.Inflater;

import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;

/**
 * The store's v1 record layout (a PULL body is records back to back) decoded straight into
 * column vectors: only the selected columns are written, strings stay UTF-8 bytes.  Framing is
 * checked as rmq_core's native decoder checks it, with the same reasons.
 */
final class Records {
    static final int MESSAGE_MAGIC = 0xDAA320A7, BLANK_MAGIC = 0xCBD43194;
    static final int RECORD_FIXED_V4 = 91;
    static final int FLAG_COMPRESSED = 0x1, FLAG_BORNHOST_V6 = 0x10, FLAG_STOREHOST_V6 = 0x20, TYPE_MASK = 0x700;
    static final byte[] TAGS = ascii("TAGS"), KEYS = ascii("KEYS"), UNIQ_KEY = ascii("UNIQ_KEY");
    /** The properties RocketMQ owns, left out of the properties column (written by the build from
     * rmq_core.message.MessageConst, so both decoders leave out the same names). */
    static final byte[][] SYSTEM_PROPERTIES = loadSystemProperties();
    private static final byte[] HEX = ascii("0123456789ABCDEF");

    static byte[] ascii(String s) { return s.getBytes(StandardCharsets.US_ASCII); }

    private static byte[][] loadSystemProperties() {
        List<byte[]> out = new ArrayList<>();
        try (InputStream in = Records.class.getResourceAsStream("system-properties.txt")) {
            if (in == null) throw new IllegalStateException("rmq/spark/system-properties.txt missing from the rmq jar");
            BufferedReader r = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
            for (String line; (line = r.readLine()) != null; ) if (!line.isEmpty()) out.add(line.getBytes(StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
        return out.toArray(new byte[0][]);
    }

    static final class DecodeException extends RmqException {
        final long offset;
        final String reason;

        DecodeException(long offset, String reason) {
            super("bad message data at offset " + offset + ": " + reason);
            this.offset = offset;
            this.reason = reason;
        }
    }

    // big-endian views of a byte[]: one load each where the JIT can (the record's fields are big-endian)
    private static final VarHandle I16 = MethodHandles.byteArrayViewVarHandle(short[].class, ByteOrder.BIG_ENDIAN);
    private static final VarHandle I32 = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.BIG_ENDIAN);
    private static final VarHandle I64 = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.BIG_ENDIAN);

    static int i32(byte[] b, int p) { return (int) I32.get(b, p); }

    static long i64(byte[] b, int p) { return (long) I64.get(b, p); }

    static int i16(byte[] b, int p) { return (short) I16.get(b, p); }

    /** Where the selected columns go: column cols[k] (Columns indexes) into column(k) - the body
     * into a BodyVector (ranges of the decoded buffer, no copy), every other into an
     * OnHeapColumnVector; topic and broker_name (constants of a read) into none. */
    static final class Sink {
        final int[] cols;
        final WritableColumnVector[] vectors;  // null for the body and the constants
        final BodyVector body;  // null when the body is not selected
        final Set<String> exactTags;  // the pushed tag filter, re-checked exactly (the broker filters by hash)
        int rows;

        Sink(int[] cols, int capacity, Set<String> exactTags) {
            this.cols = cols;
            this.exactTags = exactTags;
            this.vectors = new WritableColumnVector[cols.length];
            BodyVector b = null;
            for (int k = 0; k < cols.length; k++) {
                if (cols[k] == Columns.BODY) b = new BodyVector(capacity);
                else if (cols[k] != Columns.TOPIC && cols[k] != Columns.BROKER_NAME) {
                    vectors[k] = new OnHeapColumnVector(capacity, RmqTableProvider.SCHEMA.fields()[cols[k]].dataType());
                }
            }
            this.body = b;
        }

        /** The vector of column cols[k]; null for a constant column. */
        ColumnVector column(int k) { return cols[k] == Columns.BODY ? body : vectors[k]; }

        void reserve(int capacity) {
            for (WritableColumnVector v : vectors) if (v != null) v.reserve(capacity);
            if (body != null) body.reserve(capacity);
        }

        /** Before the next batch: the rows of the one before are no longer read. */
        void reset() {
            for (WritableColumnVector v : vectors) if (v != null) v.reset();
            rows = 0;
        }

        void close() {
            for (WritableColumnVector v : vectors) if (v != null) v.close();
            if (body != null) body.close();
        }
    }

    /** Decode `size` bytes of `buf` into the sink; records at or past untilOffset (when >= 0) and
     * BLANK records are left out.  Returns the rows added. */
    static int decode(byte[] buf, int size, long untilOffset, Sink sink) {
        int pos = 0, added = 0;
        final int[] cols = sink.cols;
        final WritableColumnVector[] vec = sink.vectors;
        while (pos < size) {
            final int at = pos, avail = size - pos;
            if (avail < 8) throw new DecodeException(at, "truncated record: " + avail + " bytes left, a record header needs 8");
            int total = i32(buf, at), magic = i32(buf, at + 4);
            if (magic == BLANK_MAGIC) {
                if (total < 8 || total > avail) {
                    throw new DecodeException(at, "BLANK record size " + total + " is outside 8.." + avail + " (bytes left)");
                }
                pos += total;
                continue;
            }
            if (magic != MESSAGE_MAGIC) {
                throw new DecodeException(at, String.format("magic code 0x%08X is neither a message (0xDAA320A7) nor BLANK (0xCBD43194)", magic));
            }
            if (total < RECORD_FIXED_V4) throw new DecodeException(at, "record size " + total + " is below the minimum " + RECORD_FIXED_V4);
            if (total > avail) {
                throw new DecodeException(at, "record size " + total + " runs past the end of the buffer (" + avail + " bytes left)");
            }
            int sysFlag = i32(buf, at + 36);
            int need = RECORD_FIXED_V4 + ((sysFlag & FLAG_BORNHOST_V6) != 0 ? 12 : 0) + ((sysFlag & FLAG_STOREHOST_V6) != 0 ? 12 : 0);
            if (total < need) {
                throw new DecodeException(at, "record size " + total + " is below the minimum " + need + " for sysFlag 0x"
                    + Integer.toHexString(sysFlag).toUpperCase());
            }
            int q = at + 48 + ((sysFlag & FLAG_BORNHOST_V6) != 0 ? 16 : 4);
            int bornPort = i32(buf, q);
            long storeTs = i64(buf, q + 4);
            q += 12;
            int storeIp = q;
            boolean storeV6 = (sysFlag & FLAG_STOREHOST_V6) != 0;
            q += storeV6 ? 16 : 4;
            int storePort = i32(buf, q);
            if (bornPort < 0 || bornPort > 65535 || storePort < 0 || storePort > 65535) {
                throw new DecodeException(at, "host port out of 0..65535 (born " + bornPort + ", store " + storePort + ")");
            }
            int reconsume = i32(buf, q + 4);
            int bodyLen = i32(buf, q + 16);
            q += 20;
            if (bodyLen < 0 || bodyLen > total - need) {
                throw new DecodeException(at, "body length " + bodyLen + " does not fit in record size " + total);
            }
            int bodyPos = q;
            q += bodyLen;
            int topicLen = buf[q] & 0xFF;
            q += 1;
            if (topicLen > 127) throw new DecodeException(at, "topic length " + topicLen + " is over 127 (a 1-byte signed length)");
            if (need + bodyLen + topicLen > total) {
                throw new DecodeException(at, "topic length " + topicLen + " does not fit in record size " + total);
            }
            q += topicLen;
            int propsLen = i16(buf, q);
            q += 2;
            if (propsLen < 0) throw new DecodeException(at, "properties length " + propsLen + " is negative");
            if (need + bodyLen + topicLen + propsLen != total) {
                throw new DecodeException(at, "record size " + total + " does not match its parts: " + need + " fixed + body "
                    + bodyLen + " + topic " + topicLen + " + properties " + propsLen);
            }
            final int props = q;
            pos += total;
            long queueOffset = i64(buf, at + 20);
            if (untilOffset >= 0 && queueOffset >= untilOffset) continue;
            if (sink.exactTags != null) {
                long tv = propValue(buf, props, propsLen, TAGS);
                String tag = tv < 0 ? null : new String(buf, (int) (tv >>> 32), (int) tv, StandardCharsets.UTF_8);
                if (tag == null || !sink.exactTags.contains(tag)) continue;
            }
            final int row = sink.rows;
            if (sink.body != null) {
                if ((sysFlag & FLAG_COMPRESSED) != 0) {
                    byte[] plain = decompress(buf, bodyPos, bodyLen, sysFlag, at);
                    sink.body.put(row, plain, 0, plain.length);
                } else {
                    sink.body.put(row, buf, bodyPos, bodyLen);
                }
            }
            for (int k = 0; k < cols.length; k++) {
                WritableColumnVector v = vec[k];
                if (v == null) continue;
                switch (cols[k]) {
                    case Columns.QUEUE_ID: v.putInt(row, i32(buf, at + 12)); break;
                    case Columns.QUEUE_OFFSET: v.putLong(row, queueOffset); break;
                    case Columns.BORN_TIMESTAMP: v.putLong(row, i64(buf, at + 40) * 1000); break;
                    case Columns.STORE_TIMESTAMP: v.putLong(row, storeTs * 1000); break;
                    case Columns.RECONSUME_TIMES: v.putInt(row, reconsume); break;
                    case Columns.TAGS: putProp(v, row, buf, props, propsLen, TAGS); break;
                    case Columns.KEYS: putProp(v, row, buf, props, propsLen, KEYS); break;
                    case Columns.MSG_ID: {
                        long uv = propValue(buf, props, propsLen, UNIQ_KEY);
                        if (uv >= 0) {
                            v.putByteArray(row, buf, (int) (uv >>> 32), (int) uv);
                        } else {
                            byte[] id = offsetMsgId(buf, storeIp, storeV6, storePort, i64(buf, at + 28));
                            v.putByteArray(row, id, 0, id.length);
                        }
                        break;
                    }
                    case Columns.PROPERTIES: putProperties(v, row, buf, props, propsLen); break;
                    default: break;
                }
            }
            sink.rows++;
            added++;
        }
        return added;
    }

    /** The value of property `name` as (position << 32 | length), -1 when absent. */
    static long propValue(byte[] b, int p, int len, byte[] name) {
        int i = 0;
        while (i < len) {
            int k = i;
            while (i < len && b[p + i] != 1) i++;
            if (i >= len) return -1;
            int v = i + 1;
            i = v;
            while (i < len && b[p + i] != 2) i++;
            if (v - 1 - k == name.length && Arrays.equals(b, p + k, p + v - 1, name, 0, name.length)) {
                return ((long) (p + v) << 32) | (i - v);
            }
            i++;
        }
        return -1;
    }

    private static void putProp(WritableColumnVector v, int row, byte[] b, int p, int len, byte[] name) {
        long pv = propValue(b, p, len, name);
        if (pv < 0) v.putNull(row); else v.putByteArray(row, b, (int) (pv >>> 32), (int) pv);
    }

    private static boolean isSystem(byte[] b, int from, int to) {
        for (byte[] s : SYSTEM_PROPERTIES) {
            if (s.length == to - from && Arrays.equals(b, from, to, s, 0, s.length)) return true;
        }
        return false;
    }

    private static void putProperties(WritableColumnVector v, int row, byte[] b, int p, int len) {
        WritableColumnVector keys = v.getChild(0), values = v.getChild(1);
        int start = keys.getElementsAppended(), n = 0, i = 0;
        while (i < len) {
            int k = i;
            while (i < len && b[p + i] != 1) i++;
            if (i >= len) break;  // a trailing name without a value (never written by RocketMQ): ignored
            int vs = i + 1;
            i = vs;
            while (i < len && b[p + i] != 2) i++;
            if (!isSystem(b, p + k, p + vs - 1)) {
                keys.appendByteArray(b, p + k, vs - 1 - k);
                values.appendByteArray(b, p + vs, i - vs);
                n++;
            }
            i++;
        }
        v.putArray(row, start, n);
    }

    /** The offset message id: store host address, port, commit-log offset, as upper-case hex. */
    static byte[] offsetMsgId(byte[] b, int ip, boolean v6, int port, long commitLogOffset) {
        int n = v6 ? 16 : 4;
        byte[] raw = new byte[n + 12];
        System.arraycopy(b, ip, raw, 0, n);
        for (int i = 0; i < 4; i++) raw[n + i] = (byte) (port >>> (24 - 8 * i));
        for (int i = 0; i < 8; i++) raw[n + 4 + i] = (byte) (commitLogOffset >>> (56 - 8 * i));
        byte[] out = new byte[raw.length * 2];
        for (int i = 0; i < raw.length; i++) {
            out[2 * i] = HEX[(raw[i] >> 4) & 15];
            out[2 * i + 1] = HEX[raw[i] & 15];
        }
        return out;
    }

    /** The plain body of a compressed record: zlib (type 0 or 0x300), LZ4 frame (0x100), zstd (0x200). */
    static byte[] decompress(byte[] b, int pos, int len, int sysFlag, int at) {
        int type = sysFlag & TYPE_MASK;
        try {
            if (type == 0 || type == 0x300) return inflate(b, pos, len);
            InputStream in;
            if (type == 0x100) {
                in = new net.jpountz.lz4.LZ4FrameInputStream(new ByteArrayInputStream(b, pos, len));
            } else if (type == 0x200) {
                in = new com.github.luben.zstd.ZstdInputStream(new ByteArrayInputStream(b, pos, len));
            } else {
                throw new DecodeException(at, "compressed body does not decompress: sysFlag 0x" + Integer.toHexString(sysFlag).toUpperCase()
                    + " names unknown compression type 0x" + Integer.toHexString(type).toUpperCase());
            }
            try (InputStream s = in) {
                return s.readAllBytes();
            }
        } catch (IOException | DataFormatException | RuntimeException e) {
            if (e instanceof DecodeException) throw (DecodeException) e;
            throw new DecodeException(at, "compressed body does not decompress: " + e);
        }
    }

    private static byte[] inflate(byte[] b, int pos, int len) throws DataFormatException {
        Inflater inf = new Inflater();
        try {
            inf.setInput(b, pos, len);
            byte[] out = new byte[Math.max(64, len * 4)];
            int n = 0;
            while (!inf.finished()) {
                if (n == out.length) out = Arrays.copyOf(out, out.length * 2);
                int got = inf.inflate(out, n, out.length - n);
                if (got == 0 && (inf.needsInput() || inf.needsDictionary())) throw new DataFormatException("truncated zlib stream");
                n += got;
            }
            return n == out.length ? out : Arrays.copyOf(out, n);
        } finally {
            inf.end();
        }
    }

    private Records() { }
}
