package rmq.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;

/** The driver's look-ups: a topic's route from the name server, queue offsets from the brokers. */
final class Admin {
    static final int TIMEOUT_MS = 10_000;

    final String namesrv;
    final Remoting.Account account;
    /** broker name -> (broker id -> host:port), from the last route. */
    final Map<String, TreeMap<Long, String>> brokerAddrs = new TreeMap<>();

    Admin(String namesrv, Remoting.Account account) {
        this.namesrv = namesrv;
        this.account = account;
    }

    /** A readable queue of a topic. */
    static final class Queue implements Comparable<Queue> {
        final String brokerName;
        final int queueId;

        Queue(String brokerName, int queueId) { this.brokerName = brokerName; this.queueId = queueId; }

        @Override
        public int compareTo(Queue o) {
            int c = brokerName.compareTo(o.brokerName);
            return c != 0 ? c : Integer.compare(queueId, o.queueId);
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Queue && ((Queue) o).brokerName.equals(brokerName) && ((Queue) o).queueId == queueId;
        }

        @Override
        public int hashCode() { return brokerName.hashCode() * 31 + queueId; }
    }

    /** The readable queues of `topic`, sorted by broker and queue id (as the Python source orders them). */
    List<Queue> queues(String topic) {
        checkTopic(topic);
        Remoting.Response r = null;
        IOException last = null;
        Map<String, String> ext = new LinkedHashMap<>();
        ext.put("topic", topic);
        for (String addr : namesrv.split(";")) {
            addr = addr.trim();
            if (addr.isEmpty()) continue;
            try {
                r = Remoting.call(addr, Remoting.GET_ROUTEINFO_BY_TOPIC, ext, null, account, TIMEOUT_MS);
                break;
            } catch (IOException e) {
                last = e;
            }
        }
        if (r == null) {
            throw new RmqException("name server " + Remoting.quote(namesrv) + " unreachable while looking up topic "
                + Remoting.quote(topic) + ": " + (last == null ? "no address" : last.getMessage()));
        }
        if (r.code == Remoting.TOPIC_NOT_EXIST) {
            throw new IllegalArgumentException("topic " + Remoting.quote(topic) + " does not exist on name server "
                + Remoting.quote(namesrv));
        }
        if (r.code != Remoting.SUCCESS) {
            throw new RmqException("name server " + Remoting.quote(namesrv) + " refused the route of topic "
                + Remoting.quote(topic) + ": code " + r.code + " " + r.remark);
        }
        JsonNode route;
        try {
            route = Remoting.parseJson(r.body);
        } catch (IOException e) {
            throw new RmqException("the route of topic " + Remoting.quote(topic) + " from " + namesrv + " is not JSON: " + e.getMessage());
        }
        brokerAddrs.clear();
        for (JsonNode bd : route.path("brokerDatas")) {
            TreeMap<Long, String> addrs = new TreeMap<>();
            for (Iterator<Map.Entry<String, JsonNode>> it = bd.path("brokerAddrs").fields(); it.hasNext(); ) {
                Map.Entry<String, JsonNode> e = it.next();
                addrs.put(Long.parseLong(e.getKey()), e.getValue().asText());
            }
            brokerAddrs.put(bd.path("brokerName").asText(), addrs);
        }
        List<Queue> out = new ArrayList<>();
        for (JsonNode qd : route.path("queueDatas")) {
            String broker = qd.path("brokerName").asText();
            if ((qd.path("perm").asInt() & 4) == 0 || !brokerAddrs.containsKey(broker)) continue;
            int n = qd.path("readQueueNums").asInt();
            for (int i = 0; i < n; i++) out.add(new Queue(broker, i));
        }
        if (out.isEmpty() && !route.path("queueDatas").elements().hasNext()) {
            throw new IllegalArgumentException("topic " + Remoting.quote(topic) + " does not exist on name server "
                + Remoting.quote(namesrv));
        }
        out.sort(null);
        return out;
    }

    static void checkTopic(String topic) {
        if (topic == null || topic.isEmpty()) throw new IllegalArgumentException("the rmq source needs option 'topic'");
        if (topic.length() > 127 || !topic.matches("[%|a-zA-Z0-9_-]+")) {
            throw new IllegalArgumentException("bad topic " + Remoting.quote(topic)
                + ": a topic name is 1..127 characters of letters, digits, '%', '|', '-' and '_'");
        }
    }

    /** The queue's master, else another replica (reads go on while a master is down). */
    List<String> addrsOf(String broker) {
        TreeMap<Long, String> addrs = brokerAddrs.get(broker);
        if (addrs == null) throw new RmqException("no address of broker " + Remoting.quote(broker));
        return new ArrayList<>(addrs.values());
    }

    private Remoting.Response brokerCall(String topic, Queue q, int code, Map<String, String> ext) {
        IOException last = null;
        for (String addr : addrsOf(q.brokerName)) {
            try {
                return Remoting.call(addr, code, ext, null, account, TIMEOUT_MS);
            } catch (IOException e) {
                last = e;
            }
        }
        throw new RmqException("broker " + Remoting.quote(q.brokerName) + " unreachable for queue " + q.queueId
            + " of topic " + Remoting.quote(topic) + ": " + (last == null ? "no address" : last.getMessage()));
    }

    private long offsetCall(String topic, Queue q, int code, String timestamp) {
        Map<String, String> ext = new LinkedHashMap<>();
        ext.put("topic", topic);
        ext.put("queueId", Integer.toString(q.queueId));
        if (timestamp != null) ext.put("timestamp", timestamp);
        Remoting.Response r = brokerCall(topic, q, code, ext);
        if (r.code != Remoting.SUCCESS) {
            throw new RmqException("broker " + Remoting.quote(q.brokerName) + " refused an offset query of queue "
                + q.queueId + " of topic " + Remoting.quote(topic) + ": code " + r.code + " " + r.remark);
        }
        return r.getLong("offset", 0);
    }

    long minOffset(String topic, Queue q) { return Math.max(0, offsetCall(topic, q, Remoting.GET_MIN_OFFSET, null)); }

    long maxOffset(String topic, Queue q) { return Math.max(0, offsetCall(topic, q, Remoting.GET_MAX_OFFSET, null)); }

    long offsetForTimestamp(String topic, Queue q, long ms) {
        return offsetCall(topic, q, Remoting.SEARCH_OFFSET_BY_TIMESTAMP, Long.toString(ms));
    }

    void commitOffset(String group, String topic, Queue q, long offset) {
        Map<String, String> ext = new LinkedHashMap<>();
        ext.put("consumerGroup", group);
        ext.put("topic", topic);
        ext.put("queueId", Integer.toString(q.queueId));
        ext.put("commitOffset", Long.toString(offset));
        IOException last = null;
        TreeMap<Long, String> addrs = brokerAddrs.get(q.brokerName);
        String master = addrs == null ? null : addrs.get(0L);
        if (master == null) throw new RmqException("broker " + Remoting.quote(q.brokerName) + " has no master to commit offsets to");
        try {
            Remoting.Response r = Remoting.call(master, Remoting.UPDATE_CONSUMER_OFFSET, ext, null, account, TIMEOUT_MS);
            if (r.code != Remoting.SUCCESS) {
                throw new RmqException("broker " + Remoting.quote(q.brokerName) + " refused the offset of group "
                    + Remoting.quote(group) + ": code " + r.code + " " + r.remark);
            }
        } catch (IOException e) {
            throw new RmqException("broker " + Remoting.quote(q.brokerName) + " unreachable: " + e.getMessage());
        }
    }

    Map<String, Map<Long, String>> addrTable() { return new HashMap<>(brokerAddrs); }
}
