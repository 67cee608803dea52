"""The walk of a plain sync send from Producer.send to the wire (docs/internals.md, "How a send
travels"), as the interpreter sees it: the rmq modules whose Python code runs on the sending thread (sys.setprofile; the native kernels -
send_pipeline.pyx, frame.pyx, socket_io.pyx - run inside those stays without frames of their own).
A send that left the native first attempt for the general path (SendAttempts, its hooks, its retry
rule) would enter producer.py again and again; the walk stays short and enters no module twice."""
import os
import sys

from rmq_core import Message, Producer
from tests.client.conftest import FAST, wait_until
from tests.rawclient import RawClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _walk(p: Producer, message: Message) -> list[str]:
    """The modules (paths under the project) entered by one p.send(message), in order, each stay
    once, until the request is on the wire: its answer is read (tcp: remoting/frames.py splits it),
    it is handed over (in-proc: a transport's _hand_over), or the producer waits for it
    (Producer._wait).  A send's last steps (its SendResult noted by the fault strategy) come after."""
    rooms: list[str] = []
    done = []

    def profile(frame, event, arg):
        if event != "call" or done:
            return
        path = frame.f_code.co_filename
        if not path.startswith(ROOT):
            return
        room = os.path.relpath(path, ROOT)
        if room == "rmq_core/remoting/frames.py" or frame.f_code.co_qualname == "Producer._wait":
            done.append(True)  # (tcp: the answer is being read)
            return
        if not rooms or rooms[-1] != room:
            rooms.append(room)
        if frame.f_code.co_name == "_hand_over":  # in-proc: the frame is with the broker (its answer, and
            done.append(True)                     # the fault table's note of it, may come before _wait)

    sys.setprofile(profile)
    try:
        p.send(message)
    finally:
        sys.setprofile(None)
    assert done, f"the send never waited for its answer: {rooms}"
    return rooms


def test_a_plain_send_reaches_the_wire_in_few_steps_entering_no_module_twice(cluster, namesrv):
    raw = RawClient("walk")
    try:  # the topic made first (a send to a topic the name server does not know yet takes TBW102's route)
        assert raw.send(cluster.broker_addr, "WalkT", b"made").code == 0
        wait_until(lambda: raw.route(cluster.tcp_namesrv, "WalkT")[0].code == 0, what="WalkT's route")
    finally:
        raw.close()
    with Producer("PG_WALK", namesrv=namesrv, **FAST) as p:
        # the route fetched, the connection open, each queue's send header made and cached (by the
        # general path, which the first send to a queue takes)
        for _ in p.fetch_publish_message_queues("WalkT"):
            p.send(Message("WalkT", b"warm"))
        rooms = _walk(p, Message("WalkT", b"walked"))
    assert rooms[0] == "rmq_core/client/producer.py", rooms
    assert len(rooms) <= 8, rooms
    assert len(set(rooms)) == len(rooms), f"a module entered twice on the way to the wire: {rooms}"
