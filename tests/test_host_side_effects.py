"""A library leaves its host alone: importing rmq and using it (clients over TCP and in-proc, the
record codec, push and pull consumers) must not change the interpreter's pymalloc arena allocator.

Run in a child interpreter, so the allocator is read before rmq_core is first imported."""
import subprocess
import sys
import textwrap

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(r"""
    import ctypes, sys, threading, time

    class ArenaAllocator(ctypes.Structure):  # PyObjectArenaAllocator (Include/cpython/objimpl.h)
        _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]

    def arena_allocator():
        a = ArenaAllocator()
        ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(a))
        return (a.ctx, a.alloc, a.free)

    before = arena_allocator()
    import rmq_core
    from rmq_core import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
    from rmq_core.codec import decode_messages
    from tests.codec_oracle import encode_message_record
    import rmq_core._native.send_pipeline, rmq_core._native.frame, rmq_core._native.send_lane
    import rmq_core._native.commit_log, rmq_core._native.cq, rmq_core._native.group_commit
    import rmq_core._native.mapped, rmq_core._native.index, rmq_core._native.record, rmq_core._native.crc
    assert arena_allocator() == before, "importing rmq_core changed the arena allocator"

    store = sys.argv[1]
    timers = dict(poll_name_server_interval=1.0, heartbeat_broker_interval=1.0, rebalance_interval=1.0)
    with rmq_core.standalone(store=store, config={"registerNameServerPeriod": "1000"}) as cluster:
        for ns in (cluster.namesrv, cluster.tcp_namesrv):
            with Producer("PG", namesrv=ns) as p:
                p.send(Message("HostT", b"x" * 10_000, keys="k"))  # compressed
                p.send_async(Message("HostT", b"y")).result(10)
                p.send_batch([Message("HostT", b"z"), Message("HostT", b"w")])
        got = []
        c = PullConsumer("HostG", namesrv=cluster.tcp_namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **timers)
        c.subscribe("HostT", "*")
        with c:
            deadline = time.monotonic() + 30
            while len(got) < 8 and time.monotonic() < deadline:
                got += c.poll(0.2)
        assert len(got) == 8, len(got)
        pushed = threading.Event()
        pc = PushConsumer("HostPG", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **timers)
        pc.subscribe("HostT", "*")
        pc.register_message_listener(lambda msgs: (pushed.set(), ConsumeStatus.CONSUME_SUCCESS)[1])
        pc.start()
        try:
            assert pushed.wait(30)
        finally:
            pc.shutdown()
    records = b"".join(encode_message_record(topic="T", body=b"b" * 100, queue_offset=i,
                                             properties={"UNIQ_KEY": str(i), "TAGS": "A"}) for i in range(50_000))
    for _ in range(3):
        assert len([m.properties for m in decode_messages(records)]) == 50_000
    assert arena_allocator() == before, "using rmq changed the arena allocator"
    print("unchanged")
""")


def test_rmq_leaves_the_arena_allocator_alone(tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "store")], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("unchanged")
