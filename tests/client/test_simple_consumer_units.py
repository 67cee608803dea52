"""SimpleConsumer without a broker: its arguments, the receipt handle (POP_CK) it makes of a
POP_MESSAGE answer as RocketMQ 5's remoting client does, and the check-point text itself."""
import asyncio
import base64
import math
import types
from datetime import timedelta

import pytest

from rmq_core import MessageExt, SimpleConsumer
from tests.codec_oracle import encode_message_record
from rmq_core.common.clock import now_ms
from rmq_core.common.pop_extra_info import (
    ExtraInfo, build_extra_info, build_info, parse_info, pop_retry_topic, retry_mark,
)
from rmq_core.errors import (
    ConfigError, IllegalArgumentError, MQBrokerError, MQClientError, ReceiptHandleExpiredError,
)
from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import RemotingCommand

NS = "127.0.0.1:9876"  # (never contacted: nothing here starts a consumer)


def test_extra_info_text_round_trip_and_its_topic():
    text = build_extra_info(5, 1700000000000, 30000, 3, "%RETRY%G_T", "broker-a", 1, 7)
    assert text == "5 1700000000000 30000 3 1 broker-a 1 7"
    info = ExtraInfo.parse(text)
    assert (info.ck_queue_offset, info.pop_time, info.invisible_time, info.revive_qid, info.retry,
            info.broker_name, info.queue_id, info.queue_offset) == (5, 1700000000000, 30000, 3, "1", "broker-a", 1, 7)
    assert str(info) == text and info.visible_at == 1700000030000 and not info.is_order
    assert info.real_topic("T", "G") == "%RETRY%G_T" == pop_retry_topic("T", "G")
    assert ExtraInfo.parse(text.replace(" 1 broker", " 0 broker")).real_topic("T", "G") == "T"
    assert ExtraInfo.parse(text.replace(" 1 broker", " 2 broker")).real_topic("T", "G") == "%RETRY%G+T"
    assert ExtraInfo.parse(text.replace(" 3 1 ", " 999 1 ")).is_order
    assert [retry_mark(t) for t in ("T", "%RETRY%G_T", "%RETRY%G+T")] == ["0", "1", "2"]


@pytest.mark.parametrize("bad", ["", "1 2 3", "5 x 30000 3 0 broker-a 1 7", "5 1 30000 3 9 broker-a 1 7",
                                 "5 1 30000 3 0 broker-a 1 7 8", "5 1 30000 3 0 broker-a 1 4",
                                 "5 0 30000 3 0 broker-a 1 7", "5 1 30000 3 0 broker-a -1 7", None, 17])
def test_a_bad_receipt_handle_is_named(bad):
    with pytest.raises(IllegalArgumentError, match="receipt handle"):
        ExtraInfo.parse(bad)


def test_offset_info_headers():
    assert parse_info("0 1 5;1 1 2", "startOffsetInfo") == {"0@1": "5", "1@1": "2"}
    assert parse_info(None, "x") == {} and parse_info("", "x") == {}
    assert build_info([("T", 1, [5, 7]), ("%RETRY%G_T", 1, [2])]) == "0 1 5,7;1 1 2"
    with pytest.raises(IllegalArgumentError, match="'0 1' in '0 1'"):
        parse_info("0 1", "msgOffsetInfo")
    with pytest.raises(IllegalArgumentError, match="duplicate"):
        parse_info("0 1 5;0 1 6", "startOffsetInfo")


def _answer(records, **headers):
    body = b"".join(encode_message_record(**r) for r in records)
    return RemotingCommand.create_response(ResponseCode.SUCCESS, ext_fields={
        "popTime": 1700000000000, "invisibleTime": 30000, "reviveQid": 3, "restNum": 0, **headers}, body=body)


def test_a_pop_answer_gives_each_message_its_check_point():
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    sub = c.subscription_inner["T"]
    revived_ck = "2 1699999990000 10000 4 1 broker-a 0 2"
    records = [
        dict(topic="T", body=b"a", queue_id=1, queue_offset=5, properties={"KEYS": "k1"}),
        dict(topic="T", body=b"b", queue_id=1, queue_offset=7),
        dict(topic="%RETRY%G_T", body=b"c", queue_id=1, queue_offset=2, reconsume_times=1,
             properties={"RETRY_TOPIC": "T"}),
        # a message the broker rewrote to its topic carries its own check point (kept as it is)
        dict(topic="T", body=b"d", queue_id=0, queue_offset=2, reconsume_times=2, properties={"POP_CK": revived_ck}),
    ]
    resp = _answer(records, startOffsetInfo="0 1 5;1 1 2", msgOffsetInfo="0 1 5,7;1 1 2")
    msgs = c._popped(resp, "T", "broker-a", sub, "127.0.0.1:10911")
    assert [m.body for m in msgs] == [b"a", b"b", b"c", b"d"]
    assert [m.receipt_handle for m in msgs] == [
        "5 1700000000000 30000 3 0 broker-a 1 5", "5 1700000000000 30000 3 0 broker-a 1 7",
        "2 1700000000000 30000 3 1 broker-a 1 2", revived_ck]
    assert [m.delivery_attempt for m in msgs] == [1, 1, 2, 3]
    assert all(m.topic == "T" and m.broker_name == "broker-a" for m in msgs)
    assert all(m.get_property("1ST_POP_TIME") == "1700000000000" for m in msgs)
    assert msgs[0].keys == "k1"


def test_an_answer_without_start_offsets_and_a_fifo_answers_counts():
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    sub = c.subscription_inner["T"]
    records = [dict(topic="T", body=b"a", queue_id=2, queue_offset=9), dict(topic="T", body=b"b", queue_id=2, queue_offset=10)]
    msgs = c._popped(_answer(records), "T", "broker-a", sub, "x")
    assert [m.receipt_handle for m in msgs] == ["9 1700000000000 30000 3 0 broker-a 2 9",
                                               "9 1700000000000 30000 3 0 broker-a 2 10"]
    fifo = _answer(records, reviveQid=999, startOffsetInfo="0 2 9", msgOffsetInfo="0 2 9,10",
                   orderCountInfo="0 qo2%9 1;0 2 0")
    msgs = c._popped(fifo, "T", "broker-a", sub, "x")
    assert [m.delivery_attempt for m in msgs] == [2, 1]
    assert ExtraInfo.parse(msgs[0].receipt_handle).is_order
    with pytest.raises(MQClientError, match="no check point of 0@2"):
        c._popped(_answer(records, startOffsetInfo="0 1 9", msgOffsetInfo="0 1 9"), "T", "broker-a", sub, "x")
    with pytest.raises(MQClientError, match="more messages of 0@2 than msgOffsetInfo '0 2 9' names"):
        c._popped(_answer(records, startOffsetInfo="0 2 9", msgOffsetInfo="0 2 9"), "T", "broker-a", sub, "x")


def test_a_queue_whose_messages_come_in_two_stretches_takes_its_handles_in_order():
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    sub = c.subscription_inner["T"]
    records = [dict(topic="T", body=b"a", queue_id=1, queue_offset=5), dict(topic="T", body=b"b", queue_id=2, queue_offset=3),
               dict(topic="T", body=b"c", queue_id=1, queue_offset=8)]
    msgs = c._popped(_answer(records, startOffsetInfo="0 1 4;0 2 3", msgOffsetInfo="0 1 5,8;0 2 3"), "T", "b", sub, "x")
    assert [m.receipt_handle for m in msgs] == ["4 1700000000000 30000 3 0 b 1 5", "3 1700000000000 30000 3 0 b 2 3",
                                               "4 1700000000000 30000 3 0 b 1 8"]
    # without startOffsetInfo a queue's check point is its first message in the answer, in both stretches
    msgs = c._popped(_answer(records), "T", "b", sub, "x")
    assert [m.receipt_handle for m in msgs] == ["5 1700000000000 30000 3 0 b 1 5", "3 1700000000000 30000 3 0 b 2 3",
                                               "5 1700000000000 30000 3 0 b 1 8"]


def test_the_pop_answer_kernels_take_plain_values_and_name_a_mismatch():
    from rmq_core.codec import decode_messages, queue_runs, stamp_popped

    body = b"".join(encode_message_record(**r) for r in [
        dict(topic="T", body=b"a", queue_id=1, queue_offset=5), dict(topic="T", body=b"b", queue_id=1, queue_offset=6),
        dict(topic="%RETRY%G_T", body=b"c", queue_id=1, queue_offset=0),
        dict(topic="T", body=b"d", queue_id=1, queue_offset=7, properties={"POP_CK": "own"}),
        dict(topic="T", body=b"e", queue_id=1, queue_offset=8, properties={"1ST_POP_TIME": "9"})])
    msgs = decode_messages(body)
    assert queue_runs(msgs, "POP_CK") == [("T", 1, 0, 2), ("%RETRY%G_T", 1, 2, 3), ("T", 1, 4, 5)]
    assert queue_runs([], "POP_CK") == []
    stamp_popped(msgs, ["h0", "h1", "h2", None, "h4"], "POP_CK", "1ST_POP_TIME", "100", "T")
    assert [m.get_property("POP_CK") for m in msgs] == ["h0", "h1", "h2", "own", "h4"]
    assert [m.get_property("1ST_POP_TIME") for m in msgs] == ["100", "100", "100", "100", "9"]
    assert {m.topic for m in msgs} == {"T"}
    with pytest.raises(ValueError, match="5 messages but 4 handles"):
        stamp_popped(msgs, ["h"] * 4, "POP_CK", "1ST_POP_TIME", "100", "T")
    with pytest.raises(TypeError):
        queue_runs(["not a message"], "POP_CK")


def test_messages_of_a_pop_whose_receives_gave_up_go_to_the_receives_waiting_next():
    from rmq_core.client.futures import LeanFuture
    from rmq_core.client.simple_consumer import _PopLane, _PopWaiter

    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    msgs = [MessageExt(topic="T", body=str(i).encode()) for i in range(5)]
    far = now_ms() + 60_000

    def waiter(n, cancelled=False):
        w = _PopWaiter(n, far, LeanFuture())
        if cancelled:
            w.future.cancel()
        return w

    lane = _PopLane(False)
    gone, w1, w_cancelled, w2, w3 = waiter(32, True), waiter(2), waiter(8, True), waiter(8), waiter(8)
    lane.waiting = [w1, w_cancelled, w2, w3]
    c._hand_out(("T", "b", 30000), lane, [gone], 32, msgs, None)
    assert [m.body for m in w1.future.result(0)] == [b"0", b"1"]
    assert [m.body for m in w2.future.result(0)] == [b"2", b"3", b"4"]
    assert lane.waiting == [w3] and not w3.future.done()  # (it waits for the lane's next pop)
    # an orderly lane keeps a queue's messages with one receive: they are not handed around
    ordered = _PopLane(True)
    w4 = waiter(8)
    ordered.waiting = [w4]
    c._hand_out(("T", "b", 30000), ordered, [waiter(32, True)], 32, msgs, None)
    assert ordered.waiting == [w4] and not w4.future.done()


@pytest.mark.parametrize("num", [0, 1025, -1, True, "4", 2.0])
def test_a_bad_max_message_num_is_named(num):
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    with pytest.raises(IllegalArgumentError, match=f"bad max_message_num {num!r}"):
        c.receive(num, 10)


@pytest.mark.parametrize("duration", [0, -1, math.nan, math.inf, "10", None, timedelta(0), 0.0001])
def test_a_bad_invisible_duration_is_named(duration):
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    with pytest.raises(IllegalArgumentError, match="bad invisible_duration"):
        c.receive(1, duration)
    m = MessageExt(topic="T", properties={"POP_CK": build_extra_info(1, now_ms(), 60000, 0, "0", "b", 0, 1)})
    with pytest.raises(IllegalArgumentError, match="bad invisible_duration"):
        c.change_invisible_duration(m, duration)


def test_the_constructor_names_a_bad_setting():
    with pytest.raises(IllegalArgumentError, match="bad await_duration -1"):
        SimpleConsumer("G", namesrv=NS, await_duration=-1)
    with pytest.raises(ConfigError, match="bad fifo 'yes'"):
        SimpleConsumer("G", namesrv=NS, fifo="yes")
    with pytest.raises(ConfigError, match="unknown setting 'await_durations'.*await_duration"):
        SimpleConsumer("G", namesrv=NS, await_durations=3)
    with pytest.raises(IllegalArgumentError, match="bad subscription expression 5"):
        SimpleConsumer("G", namesrv=NS, subscriptions={"T": 5})
    with pytest.raises(MQClientError, match="subscribe to a topic before start"):
        SimpleConsumer("G", namesrv=NS).start()
    c = SimpleConsumer("G", namesrv=NS, await_duration=timedelta(seconds=2))
    assert c.await_duration == 2.0


def test_ack_refuses_a_message_without_handle_or_with_an_expired_one():
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    with pytest.raises(IllegalArgumentError, match="has no receipt handle"):
        c.ack(MessageExt(topic="T"))
    expired = MessageExt(topic="T", properties={
        "POP_CK": build_extra_info(4, now_ms() - 5000, 1000, 0, "0", "broker-a", 1, 6), "UNIQ_KEY": "ID1"})
    with pytest.raises(ReceiptHandleExpiredError, match=r"message ID1 \(T, queue 1, offset 6\) expired 4\.\d+ s ago"):
        c.ack(expired)
    with pytest.raises(ReceiptHandleExpiredError):
        c.change_invisible_duration(expired, 10)
    live = MessageExt(topic="T", properties={"POP_CK": build_extra_info(4, now_ms(), 60000, 0, "0", "broker-a", 1, 6)})
    with pytest.raises(MQClientError, match="not started"):
        c.ack(live)


def test_a_batch_acks_offsets_as_a_java_bit_set():
    from rmq_core.client.simple_consumer import _bit_set

    # BitSet.toByteArray(): bit i in byte i // 8 at (1 << i % 8); fastjson writes byte[] as base64
    assert base64.b64decode(_bit_set([0, 2, 9])) == bytes([0b101, 0b10])
    assert base64.b64decode(_bit_set([31])) == bytes([0, 0, 0, 0x80])


def test_receipt_handles_are_grouped_by_checkpoint_in_the_order_first_seen():
    from rmq_core._native.receipt import group_by_checkpoint

    a, b = "5 1700000000000 30000 3 0 broker-a 1", "2 1700000000000 30000 3 1 broker-a 1"
    handles = [f"{a} 5", f"{a} 7", f"{b} 2", f"{a} 6", f"{a} 9"]
    assert group_by_checkpoint(handles, ["T", "T", "T", "T", "U"]) == {
        ("T", a): [0, [5, 7, 6]], ("T", b): [2, [2]], ("U", a): [4, [9]]}
    assert list(group_by_checkpoint(handles, ["T"] * 5)) == [("T", a), ("T", b)]
    assert group_by_checkpoint([], []) == {}
    assert group_by_checkpoint([f"{a} 9223372036854775807"], ["T"]) == {("T", a): [0, [(1 << 63) - 1]]}
    for bad in (f"{a} x7", f"{a} ", "nospace", f"{a} -1", f"{a} 9223372036854775808", f"{a} 12345678901234567890"):
        with pytest.raises(ValueError) as e:
            group_by_checkpoint([f"{a} 5", bad], ["T", "T"])
        assert e.value.args == (1,)
    with pytest.raises(TypeError):
        group_by_checkpoint([None], ["T"])


def test_ack_of_a_list_names_a_bad_receipt_handle():
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    live = build_extra_info(4, now_ms(), 60000, 0, "0", "broker-a", 1, 6)
    bad = MessageExt(topic="T", properties={"POP_CK": live[:-1] + "x"})
    with pytest.raises(IllegalArgumentError, match="bad receipt handle '4 .* 1 x'"):
        c.ack([MessageExt(topic="T", properties={"POP_CK": live}), bad])
    early = MessageExt(topic="T", properties={"POP_CK": live[:-1] + "3"})  # (before its check point's start, 4)
    with pytest.raises(IllegalArgumentError, match=r"bad receipt handle offsets \[6, 3\] .* before its start 4"):
        c.ack([MessageExt(topic="T", properties={"POP_CK": live}), early])


def test_ack_of_a_list_names_what_is_not_a_message():
    c = SimpleConsumer("G", namesrv=NS, subscriptions={"T": "*"})
    with pytest.raises(IllegalArgumentError, match="ack takes a received message or a list of them, not 5"):
        c.ack(5)
    with pytest.raises(IllegalArgumentError, match="has no receipt handle"):
        c.ack([MessageExt(topic="T")])
    expired = MessageExt(topic="T", properties={
        "POP_CK": build_extra_info(4, now_ms() - 5000, 1000, 0, "0", "broker-a", 1, 6), "UNIQ_KEY": "ID1"})
    with pytest.raises(ReceiptHandleExpiredError, match=r"1 of 1 messages not acked: .*message ID1"):
        c.ack([expired])


# --- receives made while a pop of theirs is in flight go as one pop ----------------------------------
class _Pops:
    """A SimpleConsumer's _pop_once that waits for the test: calls [(max_nums, poll_ms, future)];
    `ordered` what its answers tell of the group (None: nothing, as an answer without messages)."""

    def __init__(self, ordered: bool | None = False):
        self.calls = []
        self.ordered = ordered

    async def __call__(self, topic, broker_name, max_nums, invisible_ms, poll_ms, lane=None):
        future = asyncio.get_running_loop().create_future()
        self.calls.append((max_nums, poll_ms, future))
        try:
            return await future
        finally:
            if lane is not None and self.ordered is not None:
                lane.ordered = self.ordered

    def sizes(self) -> list:
        return [m for m, _, _ in self.calls]

    def answer(self, i: int, outcome) -> None:
        """Pop i answers: its messages, or the exception it raises."""
        future = self.calls[i][2]
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


async def _settle():
    for _ in range(5):
        await asyncio.sleep(0)


def _pop(c, max_nums, poll_ms=10_000, invisible_ms=30_000):
    return asyncio.ensure_future(c._pop("T", "broker-a", max_nums, invisible_ms, poll_ms))


async def _behind_a_pop(first_max: int, waiting, *, ordered: bool | None = False, **options):
    """A consumer (its pops faked) with a receive of `first_max` popping, and receives of `waiting`
    maxima made meanwhile: (pops, consumer, the first receive, the waiting ones)."""
    pops = _Pops(ordered)
    c = SimpleConsumer("CG", NS, subscriptions={"T": "*"}, **options)
    c._pop_once = pops
    c.instance = types.SimpleNamespace(spawn=lambda coro: asyncio.get_running_loop().create_task(coro))
    first = _pop(c, first_max)
    await _settle()
    waiters = [_pop(c, *w) if isinstance(w, tuple) else _pop(c, w) for w in waiting]
    await _settle()
    return pops, c, first, waiters


def test_receives_waiting_for_a_pop_in_flight_go_as_one_and_share_its_messages_in_order():
    async def scenario():
        pops, c, first, waiting = await _behind_a_pop(5, [5, 5, 3])
        other = _pop(c, 4, invisible_ms=60_000)  # another invisible time: a pop of its own, at once
        await _settle()
        assert pops.sizes() == [5, 4]
        pops.answer(0, list(range(5)))
        await _settle()
        assert first.result() == [0, 1, 2, 3, 4]
        assert pops.sizes()[2] == 13  # the three that waited: one pop of their maxima summed
        pops.answer(2, list(range(100, 113)))
        await _settle()
        assert [w.result() for w in waiting] == [[100, 101, 102, 103, 104], [105, 106, 107, 108, 109],
                                                 [110, 111, 112]]
        pops.answer(1, [7])
        assert await other == [7] and len(pops.calls) == 3

    asyncio.run(scenario())


def test_a_receive_whose_share_is_empty_waits_for_the_next_pop_while_its_poll_lasts():
    async def scenario():
        pops, c, first, (a, b, quick) = await _behind_a_pop(5, [5, 5, (5, 0)])
        pops.answer(0, [1])
        await _settle()
        assert pops.calls[1][:2] == (15, 0)  # (polled as long as the shortest poll)
        pops.answer(1, [2, 3, 4, 5, 6, 7])
        await _settle()
        assert (await first, await a, await b, await quick) == ([1], [2, 3, 4, 5, 6], [7], [])
        assert len(pops.calls) == 2

        # a share left empty by a pop that found messages: the receive pops again
        pops, c, first, (a, b) = await _behind_a_pop(2, [2, 2])
        pops.answer(0, [1])
        await _settle()
        pops.answer(1, [2, 3])
        await _settle()
        assert a.result() == [2, 3] and not b.done() and pops.sizes()[2] == 2
        pops.answer(2, [4])
        assert await b == [4]

    asyncio.run(scenario())


def test_a_failed_pop_fails_each_receive_of_it_and_a_cancelled_one_is_passed_over():
    async def scenario():
        pops, c, first, (gone, a, b) = await _behind_a_pop(5, [5, 5, 5])
        gone.cancel()
        pops.answer(0, [0])
        await _settle()
        assert pops.sizes()[1] == 10  # (the cancelled receive is not asked for)
        pops.answer(1, MQClientError("broker gone"))
        await _settle()
        for w in (a, b):
            with pytest.raises(MQClientError, match="broker gone"):
                w.result()
        assert await first == [0]
        assert not c._pop_lanes[("T", "broker-a", 30_000)].in_flight  # the next receive pops at once
        nxt = _pop(c, 1)
        await _settle()
        assert len(pops.calls) == 3
        pops.answer(2, [9])
        assert await nxt == [9]

    asyncio.run(scenario())


def test_pops_over_32_refused_by_a_rocketmq_broker_go_at_32_from_then_on():
    async def scenario():
        pops, c, first, waiting = await _behind_a_pop(32, [32, 32, 32])
        pops.answer(0, [0])
        await _settle()
        assert pops.sizes()[1] == 96
        pops.answer(1, MQBrokerError(ResponseCode.SYSTEM_ERROR, "pop message num over 32", "b"))
        await _settle()
        assert pops.sizes()[2:] == [32]  # the same receives again, a pop of 32 at most each
        for i in range(3):
            pops.answer(2 + i, [i])
            await _settle()
        assert [w.result() for w in waiting] == [[0], [1], [2]] and await first == [0]
        # a pop of 32 or less that fails: its receives fail
        more = [_pop(c, 8) for _ in range(2)]
        await _settle()
        assert pops.sizes()[5] == 8
        pops.answer(5, [])
        await _settle()
        pops.answer(6, MQBrokerError(ResponseCode.SYSTEM_ERROR, "no", "b"))
        await _settle()
        with pytest.raises(MQBrokerError):
            more[1].result()

    asyncio.run(scenario())


def test_an_orderly_group_pops_for_one_receive_at_a_time():
    async def scenario():
        # fifo=True: never shared, each receive pops at once
        pops, c, first, (a, b) = await _behind_a_pop(5, [5, 5], fifo=True)
        assert pops.sizes() == [5, 5, 5]
        # the broker's answer was orderly (reviveQid 999): one receive per pop
        pops, c, first, (a, b) = await _behind_a_pop(5, [5, 5], ordered=True)
        for i in range(3):  # (each pop's answer lets the next receive's pop go)
            assert pops.sizes() == [5] * (i + 1)
            pops.answer(i, [i])
            await _settle()
        assert (await first, await a, await b) == ([0], [1], [2])

    asyncio.run(scenario())


def test_before_an_answer_tells_whether_the_group_is_orderly_receives_are_not_shared():
    async def scenario():
        # fifo=None: the broker decides by the group; a poll that ended with no message tells nothing
        pops, c, first, (a, b) = await _behind_a_pop(5, [5, 5], ordered=None)
        pops.answer(0, [])
        await _settle()
        assert pops.sizes() == [5, 5]
        pops.answer(1, [1])
        await _settle()
        pops.answer(2, [2])
        assert (await first, await a, await b) == ([], [1], [2])
        # fifo=False asks the broker for a pop that is not orderly: shared from the start
        pops, c, first, (a, b) = await _behind_a_pop(5, [5, 5], ordered=None, fifo=False)
        pops.answer(0, [])
        await _settle()
        assert pops.sizes() == [5, 10]
        pops.answer(1, [1, 2])
        await _settle()
        assert await first == [] and await a == [1, 2] and not b.done()  # b pops again while its poll lasts
        pops.answer(2, [3])
        assert await b == [3]

    asyncio.run(scenario())
