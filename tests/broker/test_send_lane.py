"""The broker's native send lane (rmq_core/_native/send_lane.pyx) against the reference path.

Two embedded brokers get the same pipelined frames over raw TCP sockets: one answers plain
SEND_MESSAGE_V2 requests through the lane, the other with the lane switched off (what
RMQ_NATIVE_SEND=0 does).  Their answers must be byte-identical, apart from the broker's own port
inside the offset message id.  Malformed, truncated and oversize frames, mixed pipelines, stats,
long-polling wake-ups and SYNC_FLUSH durability are checked on the lane's side.
"""
import json
import random
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rmq_core.broker.processors import send as send_module
from rmq_core.codec import decode_messages
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

V2 = int(RequestCode.SEND_MESSAGE_V2)
BORN = 1_700_000_000_000


def v2_fields(topic, queue_id=0, props="UNIQ_KEY\x01ABC\x02WAIT\x01true\x02", **extra):
    ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": "0", "g": str(BORN),
           "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}
    ext.update({k: v for k, v in extra.items() if v is not None})
    for k in [k for k, v in extra.items() if v is None]:
        ext.pop(k, None)
    return ext


def frame(code, ext, body=None, opaque=1, flag=0):
    cmd = RemotingCommand.create_request(code, ext, body)
    cmd.opaque = opaque
    cmd.flag = flag
    return cmd.encode()


class RawSocket:
    """A blocking socket that writes frames and reads whole answer frames (prefix excluded)."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack_from(">i", self.buf)[0]:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.buf += chunk
        (n,) = struct.unpack_from(">i", self.buf)
        f, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
        return f

    def answers(self, n: int) -> dict:
        """n answer frames by opaque (answers may come in any order; opaques match them)."""
        out = {}
        for _ in range(n):
            f = self.recv_frame()
            out[RemotingCommand.decode(f).opaque] = f
        return out

    def closed_by_peer(self, timeout=5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return True
                self.buf += chunk
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def normalized(answer: bytes, broker_port: int):
    """The answer's header with the broker's port (inside an offset msg id: ip, port, offset in
    hex) masked; a pulled body as its messages' queue, offset, body and properties (store times
    and hosts differ between two brokers)."""
    (hl,) = struct.unpack_from(">i", answer)
    header = answer[:4 + hl].replace(f"{broker_port:08X}".encode(), b"PORT____")
    body = answer[4 + hl:]
    if body:
        body = [(m.topic, m.queue_id, m.queue_offset, m.body, sorted(m.properties.items())) for m in decode_messages(body)]
    return header, body


def port_of(cluster) -> int:
    return int(cluster.broker_addr.rsplit(":", 1)[1])


def lanes(cluster):
    """The send lanes of the broker's open TCP connections."""
    out = []
    for ctx in cluster.broker.servers[0].channels:
        lane = getattr(ctx.channel, "_fast_lane", None)
        if lane is not None:
            out.append(lane)
    return out


# No background writes during a comparison: delay levels of hours (a delayed or timer message
# never comes due) and transaction checks an hour apart (no half message is rolled back) — such a
# write lands in the log at a moment that differs between the two brokers.
QUIET = {"messageDelayLevel": " ".join(f"{h}h" for h in range(1, 19)),
         "transactionCheckInterval": "3600000", "transactionTimeOut": "3600000"}


class PerThreadRandom:
    """The `random` module as the send processor sees it in these tests: one generator per
    thread, all seeded alike — each broker's loop thread draws the same queue ids for queueId < 0."""

    def __init__(self, seed: int):
        self._seed, self._local = seed, threading.local()

    def __getattr__(self, name):
        generator = getattr(self._local, "generator", None)
        if generator is None:
            generator = self._local.generator = random.Random(self._seed)
        return getattr(generator, name)


@pytest.fixture
def pair(make_cluster, tmp_path, monkeypatch):
    """(lane broker, reference broker): the same config, the second without the native lane."""
    monkeypatch.setattr(send_module, "random", PerThreadRandom(20261122))
    with_lane = make_cluster(QUIET, store=tmp_path / "lane")
    monkeypatch.setattr(send_module, "NATIVE_SEND", False)
    without = make_cluster(QUIET, store=tmp_path / "ref")
    monkeypatch.setattr(send_module, "NATIVE_SEND", True)
    return with_lane, without


def run_both(pair, frames: list[bytes], expect: int, handled: list | None = None):
    """Pipeline `frames` in one write to both brokers; their `expect` answers, normalized (the
    general path picks a random queue for queueId < 0: see PerThreadRandom)."""
    result = []
    for cluster in pair:
        s = RawSocket(cluster.broker_addr)
        try:
            s.send(b"".join(frames))
            got = s.answers(expect)
            if handled is not None:
                handled.append(sum(lane.handled for lane in lanes(cluster)))
        finally:
            s.close()
        result.append({k: normalized(v, port_of(cluster)) for k, v in got.items()})
    return result


def mixed_pipeline():
    """Plain sends around everything the lane must hand back: a new topic (auto-create), delay,
    timer, transaction, batch flag, bad and odd fields, out-of-range queue, pull, heartbeat, oneway."""
    heartbeat = json.dumps({"clientID": "c1", "producerDataSet": [{"groupName": "PG"}], "consumerDataSet": []}).encode()
    items = [
        (V2, v2_fields("LaneT", 0), b"first"),  # new topic: the general path auto-creates it
        (V2, v2_fields("LaneT", 1), b"a" * 128),
        (V2, v2_fields("LaneT", 2, props="KEYS\x01k1 k2\x02TAGS\x01tg\x02UNIQ_KEY\x01U1\x02"), b"b"),
        (V2, v2_fields("LaneT", 3, props="DELAY\x012\x02UNIQ_KEY\x01U2\x02"), b"delayed"),
        (V2, v2_fields("LaneT", 0, props="TIMER_DELAY_SEC\x013600\x02"), b"timer"),
        (V2, v2_fields("LaneT", 0, props="TRAN_MSG\x01true\x02PGROUP\x01PG\x02"), b"half"),
        (V2, v2_fields("LaneT", 0, f="4"), b"prepared-flag"),
        (V2, v2_fields("LaneT", 1, e="1x"), b"bad queue id"),
        (V2, v2_fields("LaneT", 1, g=" 5"), b"bad born"),
        (V2, v2_fields("LaneT", 9), b"queue out of range"),
        (V2, v2_fields("LaneT", -1), b"any queue"),
        (V2, v2_fields("LaneT", 1, e=""), b"empty queue id"),
        (V2, v2_fields("LaneT", 1, m="true"), b"not a batch body"),
        (V2, v2_fields("LaneT", 1, i=None), b"no properties"),
        (V2, v2_fields("LaneT", 2, props="A\x01\u00e9t\u00e9\x02"), b"non-ascii property"),
        (V2, v2_fields("LaneT", 2, props='Q\x01say "hi" \\ /\x02'), b"escapes"),
        (V2, v2_fields("LaneT", 3, l="3"), b"max reconsume"),
        (V2, v2_fields("LaneT", 3, l="x"), b"bad max reconsume"),
        (V2, v2_fields("%RETRY%CG", 0), b"retry topic"),
        (V2, v2_fields("SCHEDULE_TOPIC_XXXX", 0), b"system topic"),
        (V2, v2_fields("bad topic!", 0), b"bad topic name"),
        (int(RequestCode.PULL_MESSAGE), {"consumerGroup": "CG", "topic": "LaneT", "queueId": "1", "queueOffset": "0",
                                         "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
                                         "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
                                         "expressionType": "TAG"}, None),
        (int(RequestCode.HEART_BEAT), {}, heartbeat),
        (V2, v2_fields("LaneT", 1), b""),
        (int(RequestCode.SEND_MESSAGE), {"producerGroup": "PG", "topic": "LaneT", "defaultTopic": "TBW102",
                                         "defaultTopicQueueNums": "4", "queueId": "2", "sysFlag": "0",
                                         "bornTimestamp": str(BORN), "flag": "0", "properties": "",
                                         "reconsumeTimes": "0", "unitMode": "false"}, b"v1"),
    ]
    frames = [frame(code, ext, body, opaque=i + 1) for i, (code, ext, body) in enumerate(items)]
    return frames, len(items)


def test_lane_answers_are_byte_identical_to_the_reference_path(pair):
    lane_broker, ref = pair
    frames, n = mixed_pipeline()
    # twice: the second round finds LaneT checked, so its plain sends go through the lane
    first = run_both(pair, frames, n)
    assert first[0] == first[1]
    handled = []
    second = run_both(pair, frames, n, handled)
    assert second[0] == second[1]
    assert handled[0] >= 4 and handled[1] == 0  # the lane answered the plain sends; no lane on the reference
    answers = {o: RemotingCommand.decode(header) for o, (header, _) in second[0].items()}
    assert answers[2].code == ResponseCode.SUCCESS and answers[3].code == ResponseCode.SUCCESS
    assert answers[8].code == ResponseCode.MESSAGE_ILLEGAL and "e" in answers[8].remark
    assert answers[10].code == ResponseCode.SYSTEM_ERROR and "queueId[9]" in answers[10].remark
    assert answers[21].code == ResponseCode.MESSAGE_ILLEGAL
    # both logs hold the same messages in the same queues
    for topic, qid in (("LaneT", 1), ("LaneT", 2), ("LaneT", 3)):
        bodies = [[m.body for m in decode_messages(c.broker.store.get_message("g", topic, qid, 0, 64).buffer)]
                  for c in pair]
        assert bodies[0] == bodies[1] and bodies[0]


def test_the_lane_answers_plain_sends_and_counts_them(cluster):
    s = RawSocket(cluster.broker_addr)
    try:
        s.send(frame(V2, v2_fields("Counted", 0), b"x", opaque=1))  # auto-create (general path)
        s.answers(1)
        s.send(frame(V2, v2_fields("Counted", 0), b"x", opaque=2))  # the check that fills the cache
        s.answers(1)
        s.send(b"".join(frame(V2, v2_fields("Counted", i % 4), b"y" * 100, opaque=10 + i) for i in range(200)))
        got = s.answers(200)
        lane = lane_of(cluster, s)
        # the first puts to queues 1..3 (creating their consume queues) are the store's one put too
        assert lane.handled == 200 and lane.declined == 2
        offsets = {}
        for i in range(200):
            ans = RemotingCommand.decode(got[10 + i])
            assert ans.code == 0 and ans.flag == 1 and ans.ext_fields["queueId"] == str(i % 4)
            offsets.setdefault(i % 4, []).append(int(ans.ext_fields["queueOffset"]))
        assert offsets[0] == list(range(2, 52)) and offsets[1] == list(range(50))
    finally:
        s.close()
    stats = cluster.broker.stats
    assert stats.put_nums["Counted"] == 202
    assert stats.put_size["Counted"] > 202 * 100
    assert cluster.broker.store.get_max_offset_in_queue("Counted", 3) == 50


def test_headers_naming_the_broker_take_the_lane(cluster):
    """Java 4.9 clients and ours add `n` (brokerName) to the V2 header; a 4.x broker does not read
    it, and it must not push every such send off the lane."""
    s = RawSocket(cluster.broker_addr)
    try:
        s.send(frame(V2, v2_fields("NamedBroker", 0, n="broker-a"), b"x", opaque=1))  # auto-create
        s.answers(1)
        s.send(frame(V2, v2_fields("NamedBroker", 0, n="broker-a"), b"x", opaque=2))  # fills the cache
        s.answers(1)
        lane = lane_of(cluster, s)
        before = lane.handled
        s.send(b"".join(frame(V2, v2_fields("NamedBroker", 0, n="broker-a"), b"z", opaque=10 + i) for i in range(20)))
        got = s.answers(20)
        assert lane.handled - before == 20
        assert sorted(got) == list(range(10, 30))
        assert all(RemotingCommand.decode(g).code == 0 for g in got.values())
    finally:
        s.close()


def test_oneway_sends_are_put_without_an_answer(cluster):
    s = RawSocket(cluster.broker_addr)
    try:
        for opaque in (1, 2):
            s.send(frame(V2, v2_fields("OneWay", 0), b"x", opaque=opaque))
            s.answers(1)
        s.send(b"".join(frame(V2, v2_fields("OneWay", 1), b"o", opaque=100 + i, flag=2) for i in range(5))
               + frame(V2, v2_fields("OneWay", 1), b"last", opaque=7))
        got = s.answers(1)
        assert list(got) == [7] and RemotingCommand.decode(got[7]).ext_fields["queueOffset"] == "5"
    finally:
        s.close()


def lane_of(cluster, s: RawSocket):
    """The send lane of the broker's end of raw socket `s`."""
    port = s.sock.getsockname()[1]
    for ctx in cluster.broker.servers[0].channels:
        if ctx.remote_address.endswith(f":{port}"):
            return ctx.channel._fast_lane
    raise LookupError(f"no connection from port {port}")


def _warm(s, topic, queue_id=0):
    """Two sends: the first auto-creates the topic and its queue, the second fills the send cache."""
    for opaque in (1, 2):
        s.send(frame(V2, v2_fields(topic, queue_id), b"w", opaque=opaque))
        assert RemotingCommand.decode(s.recv_frame()).code == 0


def test_a_malformed_frame_among_good_ones_closes_the_connection_after_the_good_ones(cluster):
    s = RawSocket(cluster.broker_addr)
    try:
        _warm(s, "Bad")
        header = b'{"code":310,"extFields":{"b":"Bad"'  # unterminated JSON
        broken = struct.pack(">ii", 4 + len(header), len(header)) + header
        s.send(frame(V2, v2_fields("Bad", 1), b"g1", opaque=10) + frame(V2, v2_fields("Bad", 1), b"g2", opaque=11)
               + broken + frame(V2, v2_fields("Bad", 1), b"after", opaque=12))
        got = s.answers(2)
        assert sorted(got) == [10, 11]
        assert s.closed_by_peer()
    finally:
        s.close()
    msgs = decode_messages(cluster.broker.store.get_message("g", "Bad", 1, 0, 10).buffer)
    assert [m.body for m in msgs] == [b"g1", b"g2"]


def test_an_oversize_frame_length_closes_the_connection(cluster):
    s = RawSocket(cluster.broker_addr)
    try:
        _warm(s, "Big")
        limit = cluster.broker_config.server_max_frame_length
        s.send(frame(V2, v2_fields("Big", 0), b"g", opaque=10) + struct.pack(">i", limit + 1) + b"\0" * 64)
        assert RemotingCommand.decode(s.recv_frame()).opaque == 10  # the good frame before it
        assert s.closed_by_peer()
    finally:
        s.close()


def test_frames_split_across_reads_are_answered(cluster):
    s = RawSocket(cluster.broker_addr)
    try:
        _warm(s, "Split")
        data = b"".join(frame(V2, v2_fields("Split", 0), b"z" * 50, opaque=10 + i) for i in range(20))
        for cut in range(0, len(data), 37):
            s.send(data[cut:cut + 37])
            time.sleep(0.0005)
        got = s.answers(20)
        assert sorted(got) == list(range(10, 30))
        assert all(RemotingCommand.decode(f).code == 0 for f in got.values())
    finally:
        s.close()


def test_a_held_pull_returns_when_a_lane_send_lands(cluster, raw):
    addr = cluster.broker_addr
    s = RawSocket(addr)
    try:
        _warm(s, "Wake", 3)
        held = raw.invoke_async(addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "CGW", "topic": "Wake", "queueId": "3", "queueOffset": "2", "maxMsgNums": "32",
            "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "20000", "subscription": "*",
            "subVersion": "0", "expressionType": "TAG"})
        deadline = time.monotonic() + 5
        while cluster.broker.pull_hold_service.held_count() == 0:
            assert time.monotonic() < deadline, "the pull was never held"
            time.sleep(0.01)
        s.send(frame(V2, v2_fields("Wake", 3), b"wake up", opaque=50))
        assert RemotingCommand.decode(s.recv_frame()).code == 0
        answer = held.result(10)
        assert answer.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_messages(answer.body)] == [b"wake up"]
        assert lane_of(cluster, s).handled == 1
    finally:
        s.close()


def test_sync_flush_answers_only_once_the_message_is_durable(make_cluster, tmp_path):
    cluster = make_cluster({"flushDiskType": "SYNC_FLUSH"}, store=tmp_path / "sync")
    store = cluster.broker.store
    s = RawSocket(cluster.broker_addr)
    try:
        _warm(s, "Durable")
        s.send(b"".join(frame(V2, v2_fields("Durable", i % 2), b"d" * 64, opaque=10 + i) for i in range(50)))
        for _ in range(50):
            ans = RemotingCommand.decode(s.recv_frame())
            assert ans.code == ResponseCode.SUCCESS, ans.remark
            # the answer came after the group commit that covered the message's bytes
            phys = int(ans.ext_fields["msgId"][16:], 16)
            assert store.commit_log.mapped_file_queue.flushed_where > phys
        lane = lane_of(cluster, s)
        # the lane put all 50 (the warm-up took the general path); their answers waited for the flush
        assert lane.deferred == 50 and lane.handled == 0 and lane.declined == 2
    finally:
        s.close()
    assert cluster.broker.stats.put_nums["Durable"] == 52


def test_write_permission_and_topic_changes_are_seen_by_the_lane(cluster, raw):
    addr = cluster.broker_addr
    s = RawSocket(addr)
    try:
        _warm(s, "Perm")
        r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                       {"topic": "Perm", "readQueueNums": "4", "writeQueueNums": "4", "perm": "4"})
        assert r.code == 0
        s.send(frame(V2, v2_fields("Perm", 0), b"x", opaque=20))
        ans = RemotingCommand.decode(s.recv_frame())
        assert ans.code == ResponseCode.NO_PERMISSION and "Perm" in ans.remark
        cluster.broker.broker_config.broker_permission = 4  # read only
        try:
            s.send(frame(V2, v2_fields("Counted2", 0), b"x", opaque=21))
            assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.NO_PERMISSION
        finally:
            cluster.broker.broker_config.broker_permission = 6
    finally:
        s.close()


ascii_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)
prop_names = st.sampled_from(["UNIQ_KEY", "KEYS", "TAGS", "DELAY", "TIMER_DELAY_SEC", "TIMER_x", "TRAN_MSG",
                              "DELIVER_TIME_MS", "WAIT", "p\u00e9", "X"])
int_texts = st.one_of(st.integers(-5, 2**31 + 5).map(str), st.sampled_from(["", "007", "-0", " 1", "+1", "1e3", "x"]))


# values of the timing properties: never due during a test (see QUIET)
timing_values = st.sampled_from(["", "x", "3600", "99999", "4000000000000"])


@st.composite
def sends(draw):
    props = ""
    for _ in range(draw(st.integers(0, 3))):
        name = draw(prop_names)
        timing = name.startswith(("DELAY", "TIMER_"))
        props += f"{name}\x01{draw(timing_values if timing else ascii_text)}\x02"
    ext = v2_fields(draw(st.sampled_from(["PropT", "PropT", "PropU", "Prop\u00e9"])), 0, props=props)
    ext["e"] = draw(st.one_of(st.integers(-1, 5).map(str), int_texts))
    for key in draw(st.lists(st.sampled_from("dfghjl"), max_size=2)):
        ext[key] = draw(int_texts)
    if draw(st.booleans()):
        ext["m"] = draw(st.sampled_from(["false", "true", "False", ""]))
    return ext, draw(st.binary(max_size=40))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(sends(), min_size=1, max_size=6))
def test_any_send_header_gets_the_same_answer_with_and_without_the_lane(pair, batch):
    frames = [frame(V2, ext, body, opaque=i + 1) for i, (ext, body) in enumerate(batch)]
    with_lane, reference = run_both(pair, frames, len(frames))
    assert with_lane == reference


@pytest.mark.parametrize("status", ["PUT_OK", "FLUSH_DISK_TIMEOUT", "SERVICE_NOT_AVAILABLE"])
def test_sync_flush_answers_match_the_reference_for_every_flush_outcome(make_cluster, tmp_path, monkeypatch, status):
    """SYNC_FLUSH sends wait on the group commit's Future; the lane answers a whole group when it
    resolves.  The Futures are held here and resolved with `status`: both brokers answer alike."""
    from concurrent.futures import Future

    from rmq_core.store import PutMessageStatus

    brokers = [make_cluster({"flushDiskType": "SYNC_FLUSH"}, store=tmp_path / "lane")]
    monkeypatch.setattr(send_module, "NATIVE_SEND", False)
    brokers.append(make_cluster({"flushDiskType": "SYNC_FLUSH"}, store=tmp_path / "ref"))
    monkeypatch.setattr(send_module, "NATIVE_SEND", True)
    frames = [frame(V2, v2_fields("Held", i % 2), b"h%d" % i, opaque=10 + i) for i in range(6)]
    frames.append(frame(V2, v2_fields("Held", 0), b"oneway", opaque=99, flag=2))
    results = []
    for cluster in brokers:
        store = cluster.broker.store
        s = RawSocket(cluster.broker_addr)
        try:
            _warm(s, "Held", 0)
            _warm(s, "Held", 1)
            held: list[Future] = []

            def request_flush(next_offset, store_timestamp=0, held=held):
                fut = Future()
                held.append(fut)
                return fut

            monkeypatch.setattr(store.commit_log, "request_flush", request_flush)
            s.send(b"".join(frames))
            deadline = time.monotonic() + 10
            while len(held) < 7:
                assert time.monotonic() < deadline, f"only {len(held)} puts"
                time.sleep(0.005)
            s.sock.settimeout(0.2)
            with pytest.raises(socket.timeout):  # nothing is answered before the flush
                s.recv_frame()
            s.sock.settimeout(10)
            for fut in held:
                fut.set_result(PutMessageStatus[status])
            results.append({k: normalized(v, port_of(cluster)) for k, v in s.answers(6).items()})
            if cluster is brokers[0]:
                assert lane_of(cluster, s).deferred == 2 + 7  # (both warm-up sends to queue 1 too)
        finally:
            s.close()
            monkeypatch.undo()
    assert results[0] == results[1]
    codes = {RemotingCommand.decode(h).code for h, _ in results[0].values()}
    assert codes == {{"PUT_OK": 0, "FLUSH_DISK_TIMEOUT": 10, "SERVICE_NOT_AVAILABLE": 14}[status]}
    counted = 7 if status != "SERVICE_NOT_AVAILABLE" else 0
    assert [b.broker.stats.put_nums["Held"] for b in brokers] == [4 + counted] * 2


def _json_str(draw, text: str) -> str:
    """`text` as a JSON string literal, each character written plainly or as a \\u escape."""
    out = []
    for ch in text:
        if ch in '"\\' or ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}" if ch not in '"\\' or draw(st.booleans()) else "\\" + ch)
        elif draw(st.integers(0, 5)) == 0:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else ch)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@st.composite
def send_headers(draw):
    """A SEND_MESSAGE_V2 header as any JSON writer may lay it out: key order, whitespace,
    escapes, extra or repeated keys, a remark, a oneway flag."""
    ext, body = draw(sends())
    ws = st.sampled_from(["", "", " ", "\n", " \t"])
    items = list(ext.items())
    items = draw(st.permutations(items))
    if draw(st.integers(0, 4)) == 0:  # a repeated field: the last one wins
        k = draw(st.sampled_from([k for k, _ in items]))
        items.append((k, draw(st.sampled_from(["0", "1", "", "PropT", "false"]))))
    ext_json = "{" + ",".join(f"{draw(ws)}{_json_str(draw, k)}{draw(ws)}:{draw(ws)}{_json_str(draw, v)}"
                              for k, v in items) + "}"
    oneway = draw(st.integers(0, 5)) == 0
    top = [("code", "310"), ("extFields", ext_json), ("flag", "2" if oneway else "0"),
           ("language", _json_str(draw, draw(st.sampled_from(["JAVA", "CPP", "PYTHON"])))),
           ("serializeTypeCurrentRPC", '"JSON"'), ("version", str(draw(st.integers(0, 500))))]
    if draw(st.booleans()):
        top.append(("remark", draw(st.sampled_from(["null", '"hello"']))))
    if draw(st.integers(0, 5)) == 0:
        top.append(("extra", draw(st.sampled_from(["1", "true", '"x"', "null"]))))
    top = draw(st.permutations(top))
    return top, oneway, body, ws


@st.composite
def send_frames(draw):
    """1..4 frames of send_headers, with their opaques; and how many get an answer."""
    frames, answered = [], 0
    for opaque in range(1, draw(st.integers(1, 4)) + 1):
        top, oneway, body, ws = draw(send_headers())
        fields = top + [("opaque", str(opaque))]
        header = ("{" + ",".join(f"{draw(ws)}\"{k}\"{draw(ws)}:{draw(ws)}{v}" for k, v in fields)
                  + draw(ws) + "}").encode("utf-8")
        frames.append(struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body)
        answered += not oneway
    return frames, answered


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=send_frames())
def test_any_json_layout_of_a_send_header_gets_the_same_answer(pair, batch):
    frames, answered = batch
    with_lane, reference = run_both(pair, frames, answered)
    assert with_lane == reference


def test_broker_steps_see_every_send_in_the_lane_and_may_refuse_one(make_cluster, tmp_path):
    """With broker-side request steps registered, the lane still answers plain sends - each one
    passing the steps once, before its put and on its answer - and a refusal (RequestRefused) is
    answered with its code and remark, nothing stored, the connection serving on."""
    from rmq_core.plugins import get_plugin_manager, hookimpl
    from rmq_core.remoting import RequestRefused

    seen = []

    class Hooks:
        @hookimpl
        def rmq_broker_before_request(self, remote_addr, request, connection):
            if request.code == V2:
                seen.append(("before", request.opaque))
                if request.body == b"refuse-me":
                    raise RequestRefused("no entry for you", code=ResponseCode.NO_PERMISSION)

        @hookimpl
        def rmq_broker_after_response(self, remote_addr, request, response, connection):
            if request.code == V2:
                seen.append(("after", response.opaque, response.code))

    pm = get_plugin_manager()
    hooks = Hooks()
    pm.register(hooks)
    try:
        cluster = make_cluster(store=tmp_path / "hooked")
        s = RawSocket(cluster.broker_addr)
        try:
            _warm(s, "Hooked")
            lane = lane_of(cluster, s)
            before = lane.handled
            s.send(b"".join(frame(V2, v2_fields("Hooked", 0), b"h", opaque=10 + i) for i in range(5)))
            assert sorted(s.answers(5)) == list(range(10, 15))
            assert lane.handled - before == 5  # answered by the lane, the steps part of it
            offset = cluster.broker.store.get_max_offset_in_queue("Hooked", 0)
            s.send(frame(V2, v2_fields("Hooked", 0), b"refuse-me", opaque=20))
            refusal = RemotingCommand.decode(s.recv_frame())
            assert (refusal.opaque, refusal.code, refusal.remark) == (20, ResponseCode.NO_PERMISSION, "no entry for you")
            assert cluster.broker.store.get_max_offset_in_queue("Hooked", 0) == offset  # nothing put
            s.send(frame(V2, v2_fields("Hooked", 0), b"after", opaque=21))  # the connection serves on
            assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
        finally:
            s.close()
    finally:
        pm.unregister(hooks)
    for opaque in range(10, 15):
        assert seen.count(("before", opaque)) == 1 and seen.count(("after", opaque, 0)) == 1
    assert seen.count(("before", 20)) == 1 and not [e for e in seen if e[0] == "after" and e[1] == 20]


def test_a_put_that_raises_is_answered_like_the_reference(pair, monkeypatch):
    """A store write failing under the lane: SYSTEM_ERROR naming it, the connection kept."""
    results = []
    for cluster in pair:
        store = cluster.broker.store
        s = RawSocket(cluster.broker_addr)
        try:
            _warm(s, "Fails")

            def broken_put(msg, wait=False):
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(store, "put_nowait", broken_put)
            s.send(b"".join(frame(V2, v2_fields("Fails", 0), b"f", opaque=10 + i) for i in range(3)))
            got = s.answers(3)
            monkeypatch.undo()
            s.send(frame(V2, v2_fields("Fails", 0), b"after", opaque=20))  # the connection lives on
            assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
            if cluster is pair[0]:
                assert lane_of(cluster, s).failed == 3
        finally:
            s.close()
        results.append({k: normalized(v, port_of(cluster)) for k, v in got.items()})
    assert results[0] == results[1]
    answer = RemotingCommand.decode(results[0][10][0])
    assert answer.code == ResponseCode.SYSTEM_ERROR and "No space left" in answer.remark


def test_sends_waiting_for_their_flush_count_as_in_flight(make_cluster, tmp_path, monkeypatch):
    """At the connection's in-flight limit a send is answered SYSTEM_BUSY, whether the sends
    waiting for their flush are Tasks (reference) or the lane's waiting groups."""
    from concurrent.futures import Future

    from rmq_core.store import PutMessageStatus

    brokers = [make_cluster({"flushDiskType": "SYNC_FLUSH"}, store=tmp_path / "lane-sync")]
    monkeypatch.setattr(send_module, "NATIVE_SEND", False)
    brokers.append(make_cluster({"flushDiskType": "SYNC_FLUSH"}, store=tmp_path / "ref-sync"))
    monkeypatch.setattr(send_module, "NATIVE_SEND", True)
    results = []
    for cluster in brokers:
        store = cluster.broker.store
        server = cluster.broker.servers[0]
        server.max_inflight_per_connection = 4  # for the connection made next
        s = RawSocket(cluster.broker_addr)
        try:
            _warm(s, "Busy", 0)
            (ctx,) = [c for c in server.channels if c.remote_address.endswith(f":{s.sock.getsockname()[1]}")]
            deadline = time.monotonic() + 5
            while ctx.inflight:  # a finished task leaves the set one loop iteration after its answer
                assert time.monotonic() < deadline
                time.sleep(0.005)
            held: list[Future] = []

            def request_flush(next_offset, store_timestamp=0, held=held):
                held.append(Future())
                return held[-1]

            monkeypatch.setattr(store.commit_log, "request_flush", request_flush)
            s.send(b"".join(frame(V2, v2_fields("Busy", 0), b"b%d" % i, opaque=10 + i) for i in range(7)))
            busy = s.answers(3)  # beyond the 4 waiting ones
            assert len(held) == 4 and ctx.inflight == 4
            for fut in held:
                fut.set_result(PutMessageStatus.PUT_OK)
            done = s.answers(4)
            results.append({k: normalized(v, port_of(cluster)) for k, v in {**busy, **done}.items()})
        finally:
            s.close()
            monkeypatch.undo()
    assert results[0] == results[1]
    codes = {o: RemotingCommand.decode(h).code for o, (h, _) in results[0].items()}
    assert codes == {**{o: 0 for o in range(10, 14)}, **{o: ResponseCode.SYSTEM_BUSY for o in range(14, 17)}}


def test_batches_to_a_checked_topic_are_answered_like_the_general_path(make_cluster, tmp_path, monkeypatch):
    """SEND_BATCH_MESSAGE to a topic in the send cache skips send_message's coroutine
    (SendMessageProcessor._process_batch): answers and stored messages match the general path."""
    import zlib

    from tests.codec_oracle import encode_batch_items

    monkeypatch.setattr(send_module, "random", PerThreadRandom(7))
    fast = make_cluster(QUIET, store=tmp_path / "fast")
    general = make_cluster(QUIET, store=tmp_path / "general")
    processor = general.broker.servers[0]._table._processors[V2][1].__self__
    monkeypatch.setattr(processor, "_process_batch", lambda ctx, request, *rest: processor.send_message(ctx, request))
    fast_processor = fast.broker.servers[0]._table._processors[V2][1].__self__
    fast_batches = []

    def counted(ctx, request, *rest, original=fast_processor._process_batch):
        fast_batches.append(request.opaque)
        return original(ctx, request, *rest)

    monkeypatch.setattr(fast_processor, "_process_batch", counted)

    def batch(n, tag, props=None):
        return encode_batch_items((0, b"%s-%d" % (tag, i), props or f"UNIQ_KEY\x01{tag.decode()}{i:08d}\x02TAGS\x01t\x02")
                                 for i in range(n))

    code = int(RequestCode.SEND_BATCH_MESSAGE)
    plain = batch(5, b"p")
    items = [
        (code, v2_fields("BatchT", 0, props="WAIT\x01true\x02", m="true"), plain),  # auto-create
        (code, v2_fields("BatchT", 0, props="WAIT\x01true\x02", m="true"), plain),  # fills the cache
        (code, v2_fields("BatchT", 1, props="WAIT\x01true\x02", m="true"), batch(3, b"q")),
        (code, v2_fields("BatchT", 1, props="WAIT\x01false\x02K\x01v\x02", m="true"), batch(2, b"r")),
        (code, v2_fields("BatchT", 2, props="TIMER_DELAY_SEC\x015\x02", m="true"), plain),
        (code, v2_fields("BatchT", 2, m="true"), batch(2, b"s", "TIMER_DELAY_SEC\x0110\x02")),
        (code, v2_fields("BatchT", 2, m="true", f="1"), zlib.compress(batch(4, b"z"))),
        (code, v2_fields("BatchT", 7, m="true"), plain),
        (code, v2_fields("BatchT", -1, m="true"), batch(2, b"any")),
        (code, v2_fields("BatchT", 3, m="true"), b"\x00\x01broken"),
        (V2, v2_fields("BatchT", 3, m="true"), batch(2, b"v2")),  # a V2 send with the batch flag
    ]
    results = []
    for cluster in (fast, general):
        s = RawSocket(cluster.broker_addr)
        try:
            got = {}
            for opaque, (c, ext, body) in enumerate(items, 1):  # one at a time: the first two create
                s.send(frame(c, ext, body, opaque=opaque))
                got.update(s.answers(1))
        finally:
            s.close()
        stored = [[(m.queue_offset, m.body, sorted(m.properties.items()), m.flag, m.sys_flag) for m in decode_messages(
            cluster.broker.store.get_message("g", "BatchT", q, 0, 64).buffer)] for q in range(4)]
        results.append(({k: normalized(v, port_of(cluster)) for k, v in got.items()}, stored,
                        cluster.broker.stats.put_nums["BatchT"]))
    assert results[0] == results[1]
    answers = {o: RemotingCommand.decode(h) for o, (h, _) in results[0][0].items()}
    assert answers[3].code == 0 and answers[3].ext_fields["msgId"].count(",") == 2
    assert answers[5].code == answers[6].code == ResponseCode.MESSAGE_ILLEGAL and "timer" in answers[6].remark
    assert answers[7].code == 0 and answers[8].code == ResponseCode.SYSTEM_ERROR
    # every batch after the cache was filled but the one to a queue out of range (8): the kernel
    # check sends it to the general path, which names the queue
    assert fast_batches == [3, 4, 5, 6, 7, 9, 10, 11]
