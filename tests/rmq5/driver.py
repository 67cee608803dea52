"""Drive Apache's RocketMQ 5 Python client (PyPI rocketmq-python-client, gRPC) in a child process
running in its own virtual environment (.venv-rmq5: its package `rocketmq` is also the name of the
4.x C++ client in the main one).

    .venv-rmq5/bin/python driver.py ENDPOINT

ENDPOINT is the broker's gRPC host:port.  With RMQ5_ACCESS_KEY / RMQ5_SECRET_KEY in the environment
the client signs its requests.  The driver reads one JSON command a line on stdin and answers each
with one JSON line {"id": <the command's id>, "ok": true, ...} or {"id": ..., "ok": false, "error":
"<exception type>: <text>", "log": [the client's error lines]}.  Lines with "event" instead of "id"
come on their own: a push consumer's messages, a producer's transaction check-backs.

    {"op": "producer", "topics": [...], "checks": {"<body>": "COMMIT"|"ROLLBACK"|"UNKNOWN"}}
        start the producer (checks: what its TransactionChecker answers for a half message with
        that body; UNKNOWN for one not named)
    {"op": "send", "messages": [MSG, ...], "async": false}     -> "receipts": [{"message_id",
        "offset", "queue_id"} or {"error"}, one per message]
        MSG: {"topic", "body", "tag", "keys": [...], "properties": {...}, "message_group",
              "delivery_timestamp": <seconds, as the client's 5.1.2 puts it into the request>}
    {"op": "transaction", "messages": [MSG + {"end": "commit"|"rollback"|"none"}]}
        each a half message, then ended as told ("none": left unknown for the check-back)
    {"op": "simple_consumer", "group", "subscriptions": {topic: tag expression}, "await": seconds}
    {"op": "receive", "max", "invisible"}                      -> "messages": [MESSAGE, ...]
    {"op": "ack", "refs": [...]}                               -> "acked": [ref...], "failed": {ref: error}
    {"op": "change_invisible", "ref", "invisible"}             -> "asked_ms", "changed_ms"
    {"op": "drain", "count", "seconds", "max", "invisible", "ack": true, "idle": null}
        receive until `count` messages came (acking each when told), `seconds` passed or
        none came for `idle` seconds -> "messages"
    {"op": "churn", "count", "seconds", "ack_ratio", "seed", "max", "invisible"}
        receive, acking each delivery with probability ack_ratio, until `count` messages were acked
        -> "deliveries": [{"message_id", "delivery_attempt", "body", "acked"}]
    {"op": "push_consumer", "group", "subscriptions": {...}, "fail_first": [...]}
        messages come as {"event": "message", ...MESSAGE}; a body in fail_first is answered FAILURE
        on its first delivery
    {"op": "shutdown"}                                          shut every client down and exit

MESSAGE: {"ref" (names it for ack/change_invisible), "topic", "body", "tag", "keys", "properties",
"message_group", "message_id", "delivery_attempt", "delivery_timestamp" (ms), "born_timestamp",
"message_type", "corrupted", "asked_ms" / "received_ms" (this process's wall clock when the receive
that brought it was sent / returned), and from a drain "acking_ms" / "acked_ms" (its ack sent /
answered)}.  Times are wall clock ms as floats, comparable with the broker's timestamps.
"""
import itertools
import json
import os
import random
import sys
import threading
import time
import traceback

# One JSON line per answer or event, written whole: push consumer and transaction checker threads
# emit too.  The lines go to a private copy of stdout; fd 1 points at stderr so nothing the client
# prints can land inside a line.
_out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
_out_lock = threading.Lock()


def emit(obj):
    line = json.dumps(obj) + "\n"
    with _out_lock:
        _out.write(line)
        _out.flush()


from rocketmq import (ClientConfiguration, ConsumeResult, Credentials,  # noqa: E402
                      FilterExpression, Message, MessageListener, Producer,
                      PushConsumer, SimpleConsumer, TransactionChecker,
                      TransactionResolution)
from rocketmq.v5.util import Misc  # noqa: E402

# The client finds its "local IP" (born host, user agent) by routing a UDP socket to 8.8.8.8; the
# tests stay on loopback, so it is given the loopback address before it looks.
Misc._Misc__LOCAL_IP = "127.0.0.1"

LOG = os.path.expanduser("~/logs/rocketmq_python/rocketmq_client.log")


def client_errors(limit=20):
    """The client's ERROR/WARNING lines: where it puts what a server said when it swallows it (a
    refused QueryRoute surfaces to the caller only as "failed to fetch topic:X route.")."""
    try:
        with open(LOG, errors="replace") as f:
            lines = [line.rstrip("\n") for line in f if "[ERROR]" in line or "[WARNING]" in line]
    except OSError:
        return []
    return lines[-limit:]


def describe(e):
    return f"{type(e).__name__}: {e}"


class Session:
    def __init__(self, endpoint):
        ak, sk = os.environ.get("RMQ5_ACCESS_KEY"), os.environ.get("RMQ5_SECRET_KEY")
        creds = Credentials(ak, sk) if ak is not None else Credentials()
        # 5 s per request rather than the client's 3: the tests share two cores with the broker
        self.config = ClientConfiguration(endpoint, creds, request_timeout=5)
        self.producer = None
        self.consumer = None
        self.push = None
        self.held = {}  # ref -> received Message, for ack / change_invisible
        self.refs = itertools.count(1)

    # --- producing --------------------------------------------------------------------------------------
    def op_producer(self, topics=(), checks=None):
        checks = dict(checks or {})

        class Checker(TransactionChecker):
            def check(self, message):
                body = message.body.decode("utf-8", "replace")
                resolution = checks.get(body, "UNKNOWN")
                emit({"event": "check", "message_id": message.message_id, "body": body, "topic": message.topic,
                      "resolution": resolution, "properties": dict(message.properties)})
                if resolution == "UNKNOWN":
                    return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
                return getattr(TransactionResolution, resolution)

        self.producer = Producer(self.config, topics or None, checker=Checker())
        self.producer.startup()
        return {}

    @staticmethod
    def _message(spec):
        m = Message()
        m.topic = spec["topic"]
        m.body = spec["body"].encode("utf-8")
        if spec.get("tag"):
            m.tag = spec["tag"]
        for k in spec.get("keys") or ():
            m.keys = k  # (the client's setter adds one key per assignment)
        for k, v in (spec.get("properties") or {}).items():
            m.add_property(k, v)
        if spec.get("message_group"):
            m.message_group = spec["message_group"]
        if spec.get("delivery_timestamp"):
            m.delivery_timestamp = spec["delivery_timestamp"]
        return m

    @staticmethod
    def _receipt(r):
        return {"message_id": r.message_id, "offset": r.offset, "queue_id": r.message_queue.message_queue0().id,
                "transaction_id": r.transaction_id}

    def op_send(self, messages, **kw):
        out = []
        if kw.get("async"):
            futures = [self.producer.send_async(self._message(s)) for s in messages]
            for f in futures:
                try:
                    out.append(self._receipt(f.result(30)))
                except Exception as e:
                    out.append({"error": describe(e)})
            return {"receipts": out}
        for s in messages:
            try:
                out.append(self._receipt(self.producer.send(self._message(s))))
            except Exception as e:
                out.append({"error": describe(e), "log": client_errors(5)})
        return {"receipts": out}

    def op_transaction(self, messages):
        out = []
        for s in messages:
            tx = self.producer.begin_transaction()
            r = self.producer.send(self._message(s), tx)
            end = s.get("end", "commit")
            if end == "commit":
                tx.commit()
            elif end == "rollback":
                tx.rollback()
            out.append(self._receipt(r))
        return {"receipts": out}

    # --- consuming --------------------------------------------------------------------------------------
    def _json(self, m, asked_ms, now_ms):
        ref = next(self.refs)
        self.held[ref] = m
        return {"ref": ref, "topic": m.topic, "body": m.body.decode("utf-8", "backslashreplace"), "tag": m.tag,
                "keys": sorted(m.keys), "properties": dict(m.properties), "message_group": m.message_group,
                "message_id": m.message_id, "delivery_attempt": m.delivery_attempt,
                "delivery_timestamp": m.delivery_timestamp, "born_timestamp": m.born_timestamp,
                "message_type": m.message_type, "corrupted": m.corrupted, "asked_ms": asked_ms, "received_ms": now_ms}

    def op_simple_consumer(self, group, subscriptions, **kw):
        subs = {t: FilterExpression(e) for t, e in subscriptions.items()}
        self.consumer = SimpleConsumer(self.config, group, subs, await_duration=kw.get("await", 5))
        self.consumer.startup()
        return {"client_id": self.consumer.client_id}

    def op_receive(self, max=32, invisible=15):
        asked = time.time() * 1000
        msgs = self.consumer.receive(max, invisible)
        now = time.time() * 1000
        return {"messages": [self._json(m, asked, now) for m in msgs]}

    def op_ack(self, refs):
        acked, failed = [], {}
        for ref in refs:
            try:
                self.consumer.ack(self.held[ref])
                acked.append(ref)
                del self.held[ref]
            except Exception as e:
                failed[ref] = describe(e)
        return {"acked": acked, "failed": failed, "acked_ms": time.time() * 1000}

    def op_change_invisible(self, ref, invisible):
        # the client puts the new receipt handle into the message: a later ack uses it
        asked = time.time() * 1000
        self.consumer.change_invisible_duration(self.held[ref], invisible)
        return {"asked_ms": asked, "changed_ms": time.time() * 1000}

    def op_drain(self, count, seconds, max=32, invisible=15, ack=True, idle=None):
        got, errors = [], []
        start = last = time.monotonic()
        while len(got) < count and time.monotonic() < start + seconds:
            if idle is not None and time.monotonic() - last >= idle:
                break
            asked = time.time() * 1000
            try:
                msgs = self.consumer.receive(max, invisible)
            except Exception as e:  # kept: a failed receive shows in the answer, and the drain goes on
                errors.append(describe(e))
                time.sleep(0.2)
                continue
            now = time.time() * 1000
            if msgs:
                last = time.monotonic()
            for m in msgs:
                j = self._json(m, asked, now)
                if ack:
                    j["acking_ms"] = time.time() * 1000
                    try:
                        self.consumer.ack(m)
                        del self.held[j["ref"]]
                        j["acked_ms"] = time.time() * 1000
                    except Exception as e:
                        j["ack_error"] = describe(e)
                got.append(j)
        return {"messages": got, "errors": errors[-10:]}

    def op_churn(self, count, seconds, ack_ratio, seed=7, max=32, invisible=15):
        """Receive, acking each delivery with probability ack_ratio, until `count` messages were
        acked (the others come back once their invisible time is over) or `seconds` passed."""
        rnd = random.Random(seed)
        deliveries, acked, errors = [], set(), []
        deadline = time.monotonic() + seconds
        while len(acked) < count and time.monotonic() < deadline:
            try:
                msgs = self.consumer.receive(max, invisible)
            except Exception as e:  # kept: a failed receive shows in the answer, and the churn goes on
                errors.append(describe(e))
                time.sleep(0.2)
                continue
            for m in msgs:
                d = {"message_id": m.message_id, "delivery_attempt": m.delivery_attempt, "body": m.body.decode(),
                     "acked": False}
                if rnd.random() < ack_ratio:
                    try:
                        self.consumer.ack(m)
                        d["acked"] = True
                        acked.add(m.message_id)
                    except Exception as e:
                        d["ack_error"] = describe(e)
                deliveries.append(d)
        return {"deliveries": deliveries, "errors": errors[-10:]}

    def op_push_consumer(self, group, subscriptions, fail_first=(), **kw):
        fail = set(fail_first)
        session = self

        class Listener(MessageListener):
            def consume(self, message):
                now = time.time() * 1000
                j = session._json(message, now, now)
                session.held.pop(j["ref"], None)  # the push consumer acks itself
                emit({"event": "message", **j})
                failed = j["body"] in fail and j["delivery_attempt"] == 1
                return ConsumeResult.FAILURE if failed else ConsumeResult.SUCCESS

        subs = {t: FilterExpression(e) for t, e in subscriptions.items()}
        self.push = PushConsumer(self.config, group, Listener(), subs,
                                 consumption_thread_count=kw.get("threads", 4))
        self.push.startup()
        return {"client_id": self.push.client_id}

    def op_shutdown(self):
        for c in (self.push, self.consumer, self.producer):
            if c is not None:
                try:
                    c.shutdown()
                except Exception as e:  # reported, and the others are still shut down
                    emit({"event": "shutdown_error", "error": describe(e)})
        return {}


def main():
    session = Session(sys.argv[1])
    emit({"event": "ready", "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        cid, op = cmd.pop("id", None), cmd.pop("op")
        try:
            answer = getattr(session, f"op_{op}")(**cmd)
            emit({"id": cid, "ok": True, **answer})
        except Exception as e:
            emit({"id": cid, "ok": False, "error": describe(e), "log": client_errors(),
                  "trace": traceback.format_exc(limit=4)})
        if op == "shutdown":
            break
    _out.flush()
    os._exit(0)  # the client's scheduler and gRPC threads are not all daemons


if __name__ == "__main__":
    main()
