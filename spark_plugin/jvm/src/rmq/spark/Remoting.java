package rmq.spark;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicInteger;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * RocketMQ's remoting protocol, blocking: a frame is int32 length, int32 (serialize type << 24 |
 * header length), a JSON header, the body.  Requests carry every ext field as a string; with an
 * ACL account they are signed as RocketMQ's AclClientRPCHook signs them (Base64 HMAC-SHA1 of the
 * ext field values ordered by name, then the body).
 */
final class Remoting {
    static final int GET_ROUTEINFO_BY_TOPIC = 105;
    static final int PULL_MESSAGE = 11;
    static final int QUERY_CONSUMER_OFFSET = 14;
    static final int UPDATE_CONSUMER_OFFSET = 15;
    static final int SEARCH_OFFSET_BY_TIMESTAMP = 29;
    static final int GET_MAX_OFFSET = 30;
    static final int GET_MIN_OFFSET = 31;

    static final int SUCCESS = 0;
    static final int TOPIC_NOT_EXIST = 17;
    static final int PULL_NOT_FOUND = 19;
    static final int PULL_RETRY_IMMEDIATELY = 20;
    static final int PULL_OFFSET_MOVED = 21;
    static final int QUERY_NOT_FOUND = 22;

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final AtomicInteger OPAQUE = new AtomicInteger();

    /** A connection that cannot be made (the caller may try another replica). */
    static final class ConnectException extends IOException {
        ConnectException(String message, Throwable cause) { super(message, cause); }
    }

    static final class Response {
        final int code, opaque, flag;
        final String remark;
        final Map<String, String> ext;
        final byte[] body;
        final int bodyLength;  // body may be a reused buffer longer than this answer's body

        Response(int code, int opaque, int flag, String remark, Map<String, String> ext, byte[] body, int bodyLength) {
            this.code = code; this.opaque = opaque; this.flag = flag; this.remark = remark; this.ext = ext;
            this.body = body; this.bodyLength = bodyLength;
        }

        long getLong(String name, long dflt) {
            String v = ext.get(name);
            if (v == null || v.isEmpty()) return dflt;
            return Long.parseLong(v.trim());
        }
    }

    /** An answer's JSON header, read with Jackson's streaming parser (no tree: it is read once per pull). */
    static Response parseHeader(byte[] h, int hl, byte[] body, int bodyLength) throws IOException {
        int code = 0, opaque = 0, flag = 0;
        String remark = null;
        Map<String, String> ext = new HashMap<>();
        try (JsonParser p = JSON.getFactory().createParser(h, 0, hl)) {
            if (p.nextToken() != JsonToken.START_OBJECT) throw new IOException("bad answer header: not a JSON object");
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.getCurrentName();
                JsonToken t = p.nextToken();
                switch (name) {
                    case "code": code = p.getValueAsInt(); break;
                    case "opaque": opaque = p.getValueAsInt(); break;
                    case "flag": flag = p.getValueAsInt(); break;
                    case "remark": remark = t == JsonToken.VALUE_NULL ? null : p.getValueAsString(); break;
                    case "extFields":
                        if (t == JsonToken.START_OBJECT) {
                            while (p.nextToken() == JsonToken.FIELD_NAME) {
                                String k = p.getCurrentName();
                                JsonToken vt = p.nextToken();
                                if (vt.isStructStart()) p.skipChildren();
                                ext.put(k, vt == JsonToken.VALUE_NULL ? null : p.getValueAsString());
                            }
                        } else {
                            p.skipChildren();
                        }
                        break;
                    default: p.skipChildren();
                }
            }
        }
        return new Response(code, opaque, flag, remark, ext, body, bodyLength);
    }

    /** One blocking connection to host:port. */
    static final class Connection implements AutoCloseable {
        final String addr;
        private final Socket socket;
        private final DataInputStream in;
        private final DataOutputStream out;

        Connection(String addr, int connectTimeoutMs) throws IOException {
            this.addr = addr;
            int colon = addr.lastIndexOf(':');
            if (colon < 0) throw new IllegalArgumentException("bad address " + quote(addr) + ": expected host:port");
            String host = addr.substring(0, colon);
            if (host.startsWith("[") && host.endsWith("]")) host = host.substring(1, host.length() - 1);
            int port;
            try {
                port = Integer.parseInt(addr.substring(colon + 1));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("bad address " + quote(addr) + ": expected host:port");
            }
            Socket s = new Socket();
            try {
                s.setTcpNoDelay(true);
                s.setReceiveBufferSize(1 << 20);
                s.connect(new InetSocketAddress(host, port), connectTimeoutMs);
            } catch (IOException e) {
                try { s.close(); } catch (IOException ignored) { }
                throw new ConnectException("connect to " + addr + " failed: " + e.getMessage(), e);
            }
            socket = s;
            in = new DataInputStream(new BufferedInputStream(s.getInputStream(), 1 << 16));
            out = new DataOutputStream(new BufferedOutputStream(s.getOutputStream(), 1 << 14));
        }

        Response invoke(int code, Map<String, String> ext, byte[] body, Account account, int timeoutMs)
                throws IOException {
            return receive(send(code, ext, body, account), timeoutMs);
        }

        /** Write a request; its answer is read by receive(opaque) (a pull is sent while the one
         * before it is still being decoded). */
        int send(int code, Map<String, String> ext, byte[] body, Account account) throws IOException {
            int opaque = OPAQUE.incrementAndGet();
            Map<String, String> fields = ext;
            if (account != null) {
                fields = new TreeMap<>(ext);
                fields.put("AccessKey", account.accessKey);
                fields.put("Signature", account.sign(fields, body));
            }
            byte[] header = requestHeader(code, opaque, fields);
            int bodyLen = body == null ? 0 : body.length;
            out.writeInt(4 + header.length + bodyLen);
            out.writeInt(header.length);  // serialize type 0: JSON
            out.write(header);
            if (bodyLen > 0) out.write(body);
            out.flush();
            return opaque;
        }

        Response receive(int opaque, int timeoutMs) throws IOException {
            return receive(opaque, timeoutMs, null);
        }

        /** The answer to `opaque`; its body is read into `reuse` when it fits (a puller keeps one
         * buffer for all its pulls: Response.bodyLength tells how much of it is this body). */
        Response receive(int opaque, int timeoutMs, byte[] reuse) throws IOException {
            socket.setSoTimeout(timeoutMs);
            while (true) {
                int len = in.readInt();
                int hl = in.readInt() & 0xFFFFFF;
                if (len < 4 + hl || hl <= 0) throw new IOException("bad frame from " + addr + ": length " + len + ", header " + hl);
                if (header.length < hl) header = new byte[Math.max(hl, header.length * 2)];
                in.readFully(header, 0, hl);
                int bl = len - 4 - hl;
                byte[] b = reuse != null && reuse.length >= bl ? reuse : new byte[bl];
                in.readFully(b, 0, bl);
                Response r = parseHeader(header, hl, b, bl);
                if (r.opaque != opaque || (r.flag & 1) == 0) {
                    continue;  // a late answer to a request that timed out, or a request of the broker's
                }
                return r;
            }
        }

        private byte[] header = new byte[1024];

        @Override
        public void close() {
            try { socket.close(); } catch (IOException ignored) { }
        }
    }

    static byte[] requestHeader(int code, int opaque, Map<String, String> ext) {
        // "PYTHON": the broker grants rmq's own clients (this reader is one) pulls of up to 1024
        // messages and serves LZ4/ZSTD bodies as stored; other languages get RocketMQ 4.x's limits.
        StringBuilder sb = new StringBuilder(256);
        sb.append("{\"code\":").append(code).append(",\"language\":\"PYTHON\",\"version\":407,\"opaque\":")
          .append(opaque).append(",\"flag\":0,\"extFields\":{");
        boolean first = true;
        for (Map.Entry<String, String> e : ext.entrySet()) {
            if (!first) sb.append(',');
            first = false;
            jsonString(sb, e.getKey());
            sb.append(':');
            jsonString(sb, e.getValue());
        }
        sb.append("}}");
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    static void jsonString(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') sb.append('\\').append(c);
            else if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
            else sb.append(c);
        }
        sb.append('"');
    }

    static String quote(String s) {
        if (s == null) return "None";
        return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'";
    }

    static JsonNode parseJson(byte[] body) throws IOException {
        return JSON.readTree(body);
    }

    /** The ACL account requests are signed with (options accessKey / secretKey). */
    static final class Account implements java.io.Serializable {
        final String accessKey;
        private final String secretKey;

        Account(String accessKey, String secretKey) { this.accessKey = accessKey; this.secretKey = secretKey; }

        static Account of(String accessKey, String secretKey) {
            boolean ak = accessKey != null && !accessKey.isEmpty(), sk = secretKey != null && !secretKey.isEmpty();
            if (!ak && !sk) return null;
            if (!ak || !sk) {
                throw new IllegalArgumentException("option '" + (ak ? "secretKey" : "accessKey")
                    + "' is missing: ACL credentials need both accessKey and secretKey");
            }
            return new Account(accessKey, secretKey);
        }

        /** RocketMQ's signature: the values of every field but Signature, by name, then the body. */
        String sign(Map<String, String> fields, byte[] body) {
            TreeMap<String, String> sorted = fields instanceof TreeMap ? (TreeMap<String, String>) fields : new TreeMap<>(fields);
            StringBuilder content = new StringBuilder();
            for (Map.Entry<String, String> e : sorted.entrySet()) {
                if (e.getKey().equals("Signature") || e.getKey().equals("_UNIQUE_KEY_QUERY")) continue;
                content.append(e.getValue());
            }
            try {
                Mac mac = Mac.getInstance("HmacSHA1");
                mac.init(new SecretKeySpec(secretKey.getBytes(StandardCharsets.UTF_8), "HmacSHA1"));
                mac.update(content.toString().getBytes(StandardCharsets.UTF_8));
                if (body != null) mac.update(body);
                return Base64.getEncoder().encodeToString(mac.doFinal());
            } catch (java.security.GeneralSecurityException e) {
                throw new IllegalStateException("HmacSHA1 unavailable: " + e, e);
            }
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Account && ((Account) o).accessKey.equals(accessKey) && ((Account) o).secretKey.equals(secretKey);
        }

        @Override
        public int hashCode() { return accessKey.hashCode() * 31 + secretKey.hashCode(); }

        @Override
        public String toString() { return "Account(" + accessKey + ")"; }
    }

    // --- idle connections, one set per process: kept across partitions, never shared by two readers at once
    private static final Map<String, ArrayDeque<Connection>> IDLE = new HashMap<>();

    static Connection borrow(String addr) throws IOException {
        synchronized (IDLE) {
            ArrayDeque<Connection> q = IDLE.get(addr);
            if (q != null && !q.isEmpty()) return q.pop();
        }
        return new Connection(addr, 5000);
    }

    static void release(Connection c) {
        synchronized (IDLE) {
            ArrayDeque<Connection> q = IDLE.computeIfAbsent(c.addr, k -> new ArrayDeque<>());
            if (q.size() < 4) {
                q.push(c);
                return;
            }
        }
        c.close();
    }

    /** One request over a pooled connection (a failed connection is dropped, not pooled). */
    static Response call(String addr, int code, Map<String, String> ext, byte[] body, Account account, int timeoutMs)
            throws IOException {
        Connection c = borrow(addr);
        boolean ok = false;
        try {
            Response r = c.invoke(code, ext, body, account, timeoutMs);
            ok = true;
            return r;
        } catch (ConnectException e) {
            throw e;
        } catch (IOException e) {
            // a pooled connection the broker closed (a restart): one fresh attempt
            c.close();
            c = new Connection(addr, 5000);
            Response r = c.invoke(code, ext, body, account, timeoutMs);
            ok = true;
            return r;
        } finally {
            if (ok) release(c); else c.close();
        }
    }

    private Remoting() { }
}
