"""Drive the official RocketMQ C++ client (PyPI rocketmq==0.4.4, bundled librocketmq) in a child
process, so a crash or hang in the native library cannot take the test runner with it.

    python cpp_driver.py produce NAMESRV TOPIC SPEC_JSON        -> one JSON line per send result
    python cpp_driver.py consume NAMESRV TOPIC GROUP EXPR MODEL EXPECT SECONDS [orderly]
                                                                 -> one JSON line per message
    python cpp_driver.py pull NAMESRV TOPIC GROUP EXPR          -> one JSON line per message

With CPP_ACCESS_KEY / CPP_SECRET_KEY in the environment every client signs its requests
(set_session_credentials, RocketMQ ACL).  A produce spec with "catch": true emits a failed send
as {"i": i, "error": "..."} and goes on instead of exiting; a pull that fails emits {"error": ...}.
A produce spec with "stream": {"seconds": S, "prefix": P, "pause": s} sends sync messages keyed
P-000000, P-000001, ... until S seconds have passed or SIGTERM arrives, and emits each outcome with
the CLOCK_MONOTONIC times the send began ("t0") and was answered ("t"; both comparable with the
test's time.monotonic()), then
{"done": n}.  The C API's send result names no broker: the test finds where each key is stored.
"""
import json
import os
import signal
import sys
import threading
import time

# One line per event, written whole: the consume callback (a C++ client thread) and the main
# thread ("started", "done") both emit, and print() writes a line and its newline separately, so
# two threads printing at once could glue lines together and the reader would drop both.  The
# lines go to a private copy of stdout; fd 1 is pointed at stderr so anything the native library
# prints cannot land inside a line either.
_out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
_out_lock = threading.Lock()


def emit(obj):
    line = json.dumps(obj) + "\n"
    with _out_lock:
        _out.write(line)
        _out.flush()


def _msg_json(m):
    props = {}
    for k in ("userProp", "a", "b", "UNIQ_KEY", "RETRY_TOPIC"):
        v = m.get_property(k)
        if v:
            props[k] = v.decode() if isinstance(v, bytes) else v
    dec = lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else v  # noqa: E731
    return {"topic": dec(m.topic), "tags": dec(m.tags), "keys": dec(m.keys), "body": dec(m.body), "id": dec(m.id),
            "queue_id": m.queue_id, "queue_offset": m.queue_offset, "reconsume_times": m.reconsume_times,
            "props": props}


def _credentials(client):
    ak, sk = os.environ.get("CPP_ACCESS_KEY"), os.environ.get("CPP_SECRET_KEY")
    if ak is not None:
        client.set_session_credentials(ak, sk or "", "")


def produce(namesrv, topic, spec):
    from rocketmq.client import Message, Producer

    p = Producer(spec.get("group", "PID_COMPAT"), compress_level=spec.get("compress_level", 5))
    p.set_namesrv_addr(namesrv)
    _credentials(p)
    p.start()
    if "stream" in spec:
        try:
            _stream(p, topic, spec["stream"])
        finally:
            p.shutdown()
        return
    try:
        for i, item in enumerate(spec["messages"]):
            m = Message(topic)
            m.set_body(item["body"])
            if item.get("tags"):
                m.set_tags(item["tags"])
            if item.get("keys"):
                m.set_keys(item["keys"])
            for k, v in (item.get("props") or {}).items():
                m.set_property(k, v)
            if item.get("delay"):
                m.set_delay_time_level(item["delay"])
            mode = item.get("mode", "sync")
            if spec.get("catch"):
                try:
                    r = p.send_sync(m)
                except Exception as e:
                    emit({"i": i, "error": f"{type(e).__name__}: {e}"})
                    continue
                emit({"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset})
                continue
            if mode == "sync":
                r = p.send_sync(m)
                out = {"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}
            elif mode == "oneway":
                p.send_oneway(m)
                out = {"i": i, "status": 0, "msg_id": None, "offset": None}
            elif mode == "orderly":
                r = p.send_orderly(m, item.get("arg", 0))
                out = {"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}
            else:
                raise SystemExit(f"unknown mode {mode}")
            emit(out)
    finally:
        p.shutdown()


def _stream(p, topic, spec):
    from rocketmq.client import Message

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    deadline = time.monotonic() + spec["seconds"]
    i = 0
    while time.monotonic() < deadline and not stop.is_set():
        key = f"{spec['prefix']}-{i:06d}"
        m = Message(topic)
        m.set_keys(key)
        m.set_body(key)
        t0 = time.monotonic()
        try:
            r = p.send_sync(m)
            emit({"i": i, "key": key, "status": int(r.status), "msg_id": r.msg_id, "t0": t0, "t": time.monotonic()})
        except Exception as e:  # a failed send (all its retries spent) is reported, and the stream goes on
            emit({"i": i, "key": key, "error": f"{type(e).__name__}: {e}", "t0": t0, "t": time.monotonic()})
        i += 1
        time.sleep(spec.get("pause", 0.01))
    emit({"done": i})


def consume(namesrv, topic, group, expr, model, expect, seconds, orderly=False):
    from rocketmq.client import MessageModel, PushConsumer

    got = []
    lock = threading.Lock()
    c = PushConsumer(group, orderly=orderly,
                     message_model=MessageModel.BROADCASTING if model == "BROADCASTING" else MessageModel.CLUSTERING)
    c.set_namesrv_addr(namesrv)
    _credentials(c)

    def cb(msg):
        with lock:
            got.append(_msg_json(msg))
            emit(got[-1])
        return None  # the wrapper acks a callback that returns normally; raising = RECONSUME_LATER

    c.subscribe(topic, cb, expr)
    c.start()
    emit({"started": True})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # shut down cleanly: offsets are persisted then
    deadline = time.time() + seconds
    try:
        while time.time() < deadline and not stop.is_set():
            with lock:
                if expect and len(got) >= expect:
                    break
            time.sleep(0.05)
        time.sleep(0.5)  # let the offset commit of the last batch happen at shutdown
    finally:
        c.shutdown()
    emit({"done": len(got)})


def pull(namesrv, topic, group, expr):
    from rocketmq.client import PullConsumer

    c = PullConsumer(group)
    c.set_namesrv_addr(namesrv)
    _credentials(c)
    c.start()
    try:
        for m in c.pull(topic, expr, max_num=32):
            emit(_msg_json(m))
    except Exception as e:
        emit({"error": f"{type(e).__name__}: {e}"})
    finally:
        c.shutdown()


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "produce":
        produce(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    elif cmd == "consume":
        consume(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], int(sys.argv[7]),
                float(sys.argv[8]), len(sys.argv) > 9 and sys.argv[9] == "orderly")
    elif cmd == "pull":
        pull(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        raise SystemExit(f"unknown command {cmd}")
