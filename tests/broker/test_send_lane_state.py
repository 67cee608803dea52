"""The send lane as a kernel: it needs no broker, only a SendLaneState of plain values (owned and
refreshed by its user) and a real store's put."""
import struct

from rmq_core._native.send_lane import SendLane, SendLaneState
from rmq_core.broker.processors.send import put_outcome
from rmq_core.config import MessageStoreConfig
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.store import DefaultMessageStore, MessageExtBrokerInner, PutMessageStatus

from .test_send_lane import frame, v2_fields

V2 = int(RequestCode.SEND_MESSAGE_V2)


def test_lane_answers_from_its_state_alone(tmp_path):
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=str(tmp_path / "store"),
                                                   mapped_file_size_commit_log=1 << 20))
    store.load()
    store.start()
    try:
        # a queue with a message in it already
        assert store.put(MessageExtBrokerInner("T", 1, b"warm", properties_bytes=b"",
                                               born_host=("127.0.0.1", 5555))).is_ok()
        version_token = object()  # what the topic cache was checked under (a DataVersion for a broker)
        knobs = {"writable": True, "token": version_token}
        refreshes, puts = [], []

        def refresh(state):
            refreshes.append(1)
            state.put = store.put_nowait
            state.data_version, state.counter = knobs["token"], 7
            state.writable = knobs["writable"]

        state = SendLaneState({"T": (version_token, 7, 4, 4)}, b"CLUSTER\x01c1\x02", 401,
                              PutMessageStatus.PUT_OK, lambda topic, n, size: puts.append((topic, n)),
                              put_outcome, refresh)
        handed, emitted, deferred = [], [], []
        lane = SendLane(state, ("127.0.0.1", 5555), set(), 1000,
                        lambda *a: deferred.append(a))
        assert lane.state is state

        def deliver(data):
            return lane.deliver(data, 1 << 20, lambda view: handed.append(bytes(view)) or True, emitted.append)

        two = frame(V2, v2_fields("T", 1), b"a", opaque=1) + frame(V2, v2_fields("T", 1), b"b", opaque=2)
        assert deliver(two) == (len(two), None)
        assert state.put is not None, "lane put off"
        assert lane.handled == 2, (lane.declined, lane.deferred, lane.failed, handed[:1], deferred[:1])
        assert not handed and not deferred and puts == [("T", 2)]
        data = b"".join(emitted)
        answers = []
        while data:
            n = struct.unpack_from(">i", data)[0]
            answers.append(RemotingCommand.decode(data[4:4 + n]))
            data = data[4 + n:]
        assert [(a.code, a.opaque, a.ext_fields["queueOffset"], a.version) for a in answers] == \
            [(ResponseCode.SUCCESS, 1, "1", 401), (ResponseCode.SUCCESS, 2, "2", 401)]
        got = store.get_message("g", "T", 1, 0, 8)
        assert got.message_count == 3

        # what the lane may do comes from the state's owner: not writeable, or a topic table
        # changed since the topic was checked, hands the send to the general path untouched
        for change in ({"writable": False}, {"token": object()}):
            knobs.update(change)
            one = frame(V2, v2_fields("T", 1), b"c", opaque=3)
            handed.clear()
            deliver(one)
            assert handed == [one[4:]] and lane.declined >= 1
            knobs.update({"writable": True, "token": version_token})
        assert refreshes and store.get_message("g", "T", 1, 0, 8).message_count == 3
    finally:
        store.shutdown()


def test_lane_refreshes_only_before_a_send(tmp_path):
    """A chunk of pops and acks costs the lane no refresh of its state; a send after a frame the
    general path handled is checked against the state as that frame left it."""
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=str(tmp_path / "store"),
                                                   mapped_file_size_commit_log=1 << 20))
    store.load()
    store.start()
    try:
        token = object()
        knobs = {"writable": True}
        refreshes = []

        def refresh(state):
            refreshes.append(1)
            state.put = store.put_nowait
            state.data_version, state.counter = token, 7
            state.writable = knobs["writable"]

        state = SendLaneState({"T": (token, 7, 4, 4)}, b"", 401, PutMessageStatus.PUT_OK,
                              lambda topic, n, size: None, put_outcome, refresh)
        lane = SendLane(state, ("127.0.0.1", 5555), set(), 1000, lambda *a: None)
        handed, emitted = [], []

        def on_frame(view):  # the general path: a pop here takes the broker's writes away
            handed.append(bytes(view))
            knobs["writable"] = False
            return True

        pop = frame(int(RequestCode.POP_MESSAGE), {"consumerGroup": "g", "topic": "T", "queueId": "-1"}, b"", opaque=1)
        ack = frame(int(RequestCode.BATCH_ACK_MESSAGE), {}, b'{"acks":[]}', opaque=2)
        chunk = pop + ack
        assert lane.deliver(chunk, 1 << 20, on_frame, emitted.append) == (len(chunk), None)
        assert refreshes == [] and len(handed) == 2 and not emitted

        knobs["writable"] = True
        send = frame(V2, v2_fields("T", 1), b"a", opaque=3)
        chunk = send + pop + send
        handed.clear()
        assert lane.deliver(chunk, 1 << 20, on_frame, emitted.append) == (len(chunk), None)
        # the first send answered here; the one after the pop sees the broker unwriteable and goes
        # to the general path (which names the refusal)
        assert lane.handled == 1 and handed == [pop[4:], send[4:]] and len(refreshes) == 2
    finally:
        store.shutdown()
