"""RocketMQ 5 timer messages (TIMER_DELIVER_MS / DELIVER_TIME_MS / TIMER_DELAY_SEC) through the
broker's timing wheel: visibility at the due time, due-time order, restart and crash guarantees,
refusal of bad values, interplay with delay levels and transactions; plus the wheel itself."""
import asyncio
import json
import os
import random
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rmq_core.broker.timer import (
    DELIVERY_BATCH, TIMER_OUT_MS, TIMER_TOPIC, TimerMessageError, TimingWheel, parse_due_ms,
)
from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.store import MessageExtBrokerInner
from tests.rawclient import RawClient
from tests.servers import RmqProcess, free_port, write_conf


def _now_ms():
    return int(time.time() * 1000)


def _pull(raw, addr, topic, queue_id=0, offset=0, sub="*"):
    resp = raw.pull(addr, topic, queue_id, offset, sub=sub)
    return decode_messages(resp.body) if resp.code == 0 else []


def _pull_all(raw, addr, topic, queue_id=0):
    out = []
    while True:
        batch = _pull(raw, addr, topic, queue_id, len(out))
        if not batch:
            return out
        out += batch


def _max_offset(raw, addr, topic, queue_id=0):
    r = raw.invoke(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)})
    return int(r.ext_fields["offset"]) if r.code == 0 else 0


def _wait_until(fn, timeout, step=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def _send_timer(raw, addr, topic, body, due_ms, key="TIMER_DELIVER_MS", **kw):
    r = raw.send(addr, topic, body, props={key: str(due_ms)}, **kw)
    assert r.code == 0, r.remark
    return r


# --- visibility and order ------------------------------------------------------------------------------
def test_invisible_before_due_visible_after(cluster, raw):
    addr = cluster.broker_addr
    due = _now_ms() + 2000
    _send_timer(raw, addr, "T_TIMER", b"at-due", due, tags="TagT", queue_id=1)
    parked = _pull(raw, addr, TIMER_TOPIC, 0)
    assert [m.properties["REAL_TOPIC"] for m in parked] == ["T_TIMER"] and parked[0].properties["REAL_QID"] == "1"
    time.sleep(1.0)
    early = _pull(raw, addr, "T_TIMER", 1)
    if _now_ms() < due:  # (a machine stalled past the due time has nothing to show here)
        assert early == [], "delivered before its due time"
    msgs = _wait_until(lambda: _pull(raw, addr, "T_TIMER", 1), timeout=30)
    assert [m.body for m in msgs] == [b"at-due"]
    m = msgs[0]
    assert m.store_timestamp >= due, "delivered before its due time"
    assert m.properties[TIMER_OUT_MS] == str(due) and m.tags == "TagT"
    for gone in ("TIMER_DELIVER_MS", "REAL_TOPIC", "REAL_QID"):
        assert gone not in m.properties
    # the real tag code came back: a tag-filtered pull finds it
    assert [x.body for x in _pull(raw, addr, "T_TIMER", 1, sub="TagT")] == [b"at-due"]
    info = cluster.broker.runtime_info()
    assert info["timerDequeueCount"] == "1" and info["timerCongestNum"] == "0"


def test_fifty_random_due_times_are_delivered_in_due_order(cluster, raw):
    addr = cluster.broker_addr
    rnd = random.Random(7)
    base = _now_ms()
    dues = [base + rnd.randrange(300, 3000) for _ in range(50)]
    dues[10] = dues[11]  # equal due times keep send order
    for i, due in enumerate(dues):
        _send_timer(raw, addr, "T_ORDER", f"{i}".encode(), due, key=rnd.choice(["TIMER_DELIVER_MS", "DELIVER_TIME_MS"]))
    msgs = _wait_until(lambda: len(_pull_all(raw, addr, "T_ORDER")) >= 50 and _pull_all(raw, addr, "T_ORDER"),
                       timeout=8)
    assert len(msgs) == 50
    order = [int(m.body) for m in msgs]
    assert order == sorted(range(50), key=lambda i: (dues[i], i))
    for m in msgs:
        due = dues[int(m.body)]
        assert int(m.properties[TIMER_OUT_MS]) == due
        assert due <= m.store_timestamp < due + 1000


def test_the_wheel_sleeps_until_the_next_due_time(cluster, raw):
    """No busy polling: one message due in 1.5 s wakes the loop for its arrival and its due time."""
    svc = cluster.broker.timer_service
    time.sleep(0.2)
    idle_start = svc.rounds
    time.sleep(0.5)
    assert svc.rounds == idle_start, "the loop woke while nothing was pending"
    _send_timer(raw, cluster.broker_addr, "T_SLEEP", b"z", _now_ms() + 1500)
    assert _wait_until(lambda: _pull(raw, cluster.broker_addr, "T_SLEEP"), timeout=30)
    assert svc.rounds - idle_start <= 5, f"{svc.rounds - idle_start} wake-ups for one message"


def test_relative_delay_seconds(cluster, raw):
    addr = cluster.broker_addr
    t0 = _now_ms()
    _send_timer(raw, addr, "T_REL", b"in-a-second", 1, key="TIMER_DELAY_SEC")
    assert _pull(raw, addr, "T_REL") == []
    msgs = _wait_until(lambda: _pull(raw, addr, "T_REL"), timeout=30)
    assert [m.body for m in msgs] == [b"in-a-second"]
    assert msgs[0].store_timestamp >= t0 + 1000 and "TIMER_DELAY_SEC" not in msgs[0].properties


def test_past_or_near_due_is_stored_at_once(cluster, raw):
    addr = cluster.broker_addr
    past = _now_ms() - 60_000
    _send_timer(raw, addr, "T_PAST", b"late-already", past)
    _send_timer(raw, addr, "T_PAST", b"within-precision", _now_ms() + 50)
    msgs = _pull(raw, addr, "T_PAST")
    assert [m.body for m in msgs] == [b"late-already", b"within-precision"]
    assert msgs[0].properties[TIMER_OUT_MS] == str(past) and "TIMER_DELIVER_MS" not in msgs[0].properties
    assert _max_offset(raw, addr, TIMER_TOPIC) == 0  # no detour


def test_far_entries_stay_in_the_log_until_the_window_reaches_them(make_cluster, raw):
    """A 500 ms window (5 slots of 100 ms): messages 1-2.5 s ahead are read again when it moves."""
    c = make_cluster(config={"timerRollWindowSlot": "5"})
    addr = c.broker_addr
    base = _now_ms()
    dues = [base + 2500 - 100 * i for i in range(15)]  # sent latest first
    for i, due in enumerate(dues):
        _send_timer(raw, addr, "T_FAR", f"{i}".encode(), due)
    time.sleep(0.3)
    svc = c.broker.timer_service
    assert len(svc.wheel) == 0, "far entries must not be held in memory"
    msgs = _wait_until(lambda: len(_pull_all(raw, addr, "T_FAR")) >= 15 and _pull_all(raw, addr, "T_FAR"), timeout=6)
    assert [int(m.body) for m in msgs] == list(range(14, -1, -1))
    assert all(m.store_timestamp >= dues[int(m.body)] for m in msgs)
    assert svc.rescans >= 2


# --- bad requests ---------------------------------------------------------------------------------------
def test_bad_values_are_refused_naming_property_and_value(make_cluster, raw):
    c = make_cluster(config={"timerMaxDelaySec": "3600"})
    addr = c.broker_addr
    for key, value in [("TIMER_DELIVER_MS", "tomorrow"), ("DELIVER_TIME_MS", "1.5e12"),
                       ("TIMER_DELAY_SEC", "1.5"), ("TIMER_DELAY_SEC", " 10"), ("TIMER_DELIVER_MS", "")]:
        r = raw.send(addr, "T_BAD", b"x", props={key: value})
        assert r.code == ResponseCode.MESSAGE_ILLEGAL, (key, value, r.code)
        assert key in r.remark and repr(value) in r.remark, r.remark
    r = raw.send(addr, "T_BAD", b"x", props={"TIMER_DELAY_SEC": "7200"})
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "timerMaxDelaySec=3600" in r.remark and "'7200'" in r.remark
    # a transaction half is checked at send time, though it is redirected only on commit
    r = raw.send(addr, "T_BAD", b"x", props={"TRAN_MSG": "true", "PGROUP": "PG", "TIMER_DELIVER_MS": "soon"},
                 sys_flag=4)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "'soon'" in r.remark
    # the system topic itself takes no sends
    r = raw.send(addr, TIMER_TOPIC, b"x")
    assert r.code == ResponseCode.NO_PERMISSION and TIMER_TOPIC in r.remark
    r = raw.send(addr, TIMER_TOPIC, b"x", props={"TIMER_DELAY_SEC": "5"})
    assert r.code == ResponseCode.NO_PERMISSION and TIMER_TOPIC in r.remark
    assert _max_offset(raw, addr, "T_BAD") == 0 and _max_offset(raw, addr, TIMER_TOPIC) == 0


def test_batch_with_a_timer_item_is_refused(cluster, raw):
    addr = cluster.broker_addr

    def send_batch(items, header_props=""):
        ext = {"producerGroup": "PG_B", "topic": "T_BATCH", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": "0", "sysFlag": "0", "bornTimestamp": str(_now_ms()), "flag": "0",
               "properties": header_props, "reconsumeTimes": "0", "unitMode": "false", "batch": "true"}
        return raw.invoke(addr, RequestCode.SEND_BATCH_MESSAGE, ext, encode_batch_items(items))

    plain = [(0, b"a", {"TAGS": "x"}), (0, b"TIMER_DELIVER_MS\x01 in a body is just bytes", {"TAGS": "y"})]
    assert send_batch(plain).code == 0
    r = send_batch(plain + [(0, b"c", {"TIMER_DELAY_SEC": "5"})])
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "item 2 carries TIMER_DELAY_SEC='5'" in r.remark, r.remark
    r = send_batch(plain, header_props="DELIVER_TIME_MS\x01123\x02")
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "DELIVER_TIME_MS='123'" in r.remark, r.remark
    assert _max_offset(raw, addr, "T_BATCH") == 2


def test_timer_disabled_refuses_timer_messages(make_cluster, raw):
    c = make_cluster(config={"timerWheelEnable": "false"})
    r = raw.send(c.broker_addr, "T_OFF", b"x", props={"TIMER_DELAY_SEC": "5"})
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "timerWheelEnable=false" in r.remark
    assert raw.send(c.broker_addr, "T_OFF", b"plain").code == 0


def test_parse_due_ms_precedence_and_errors():
    assert parse_due_ms({}, 1000) is None
    assert parse_due_ms({"TIMER_DELIVER_MS": "5000", "TIMER_DELAY_SEC": "2"}, 1000) == 3000
    assert parse_due_ms({"DELIVER_TIME_MS": "7000", "TIMER_DELIVER_MS": "5000"}, 1000) == 5000
    assert parse_due_ms({"DELIVER_TIME_MS": "7000"}, 1000) == 7000
    try:
        parse_due_ms({"TIMER_DELIVER_MS": "5000", "DELIVER_TIME_MS": "x"}, 0, "T")
    except TimerMessageError as e:
        assert "DELIVER_TIME_MS" in str(e) and "'x'" in str(e) and "'T'" in str(e)
    else:
        raise AssertionError("a bad DELIVER_TIME_MS beside a good key must be refused")


# --- delay levels and transactions -------------------------------------------------------------------------
def test_delay_level_wins_over_timer_keys(cluster, raw):
    """RocketMQ 5 (HookUtils.checkIfTimerMessage): with a DELAY level the timer keys are dropped."""
    addr = cluster.broker_addr
    r = raw.send(addr, "T_BOTH", b"both", props={"DELAY": "1", "TIMER_DELAY_SEC": "30"})
    assert r.code == 0
    sched = _pull(raw, addr, "SCHEDULE_TOPIC_XXXX", 0)
    assert [m.properties["REAL_TOPIC"] for m in sched] == ["T_BOTH"]
    assert "TIMER_DELAY_SEC" not in sched[0].properties
    assert _max_offset(raw, addr, TIMER_TOPIC) == 0
    msgs = _wait_until(lambda: _pull(raw, addr, "T_BOTH"), timeout=30)  # level 1 = 1 s in tests
    assert [m.body for m in msgs] == [b"both"]


def _end_tx(raw, addr, r, state, group):
    phys = int(r.ext_fields["msgId"][16:], 16)
    return raw.invoke(addr, RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": r.ext_fields["queueOffset"], "commitLogOffset": str(phys),
        "commitOrRollback": str(state), "fromTransactionCheck": "false", "msgId": "x"})


def test_transactional_timer_message_waits_for_commit(cluster, raw):
    addr = cluster.broker_addr
    props = {"TRAN_MSG": "true", "PGROUP": "PG_TT", "TIMER_DELAY_SEC": "1"}
    r1 = raw.send(addr, "T_TXT", b"commit-me", props=props, sys_flag=4, group="PG_TT")
    r2 = raw.send(addr, "T_TXT", b"roll-me-back", props=props, sys_flag=4, group="PG_TT")
    assert r1.code == 0 and r2.code == 0
    assert _max_offset(raw, addr, TIMER_TOPIC) == 0  # halves are not timer entries yet
    time.sleep(0.3)
    committed_at = _now_ms()
    assert _end_tx(raw, addr, r1, 8, "PG_TT").code == 0
    assert _end_tx(raw, addr, r2, 12, "PG_TT").code == 0
    assert _max_offset(raw, addr, TIMER_TOPIC) == 1
    assert _pull(raw, addr, "T_TXT") == []
    msgs = _wait_until(lambda: _pull(raw, addr, "T_TXT"), timeout=30)
    assert [m.body for m in msgs] == [b"commit-me"]
    assert msgs[0].store_timestamp >= committed_at + 1000  # relative to the commit, as RocketMQ 5
    assert (msgs[0].sys_flag & 0xC) == 8
    time.sleep(0.3)
    assert len(_pull(raw, addr, "T_TXT")) == 1


# --- restart and crash --------------------------------------------------------------------------------------
def test_restart_in_the_middle_delivers_each_once(make_cluster, tmp_path):
    store = tmp_path / "store"
    c = make_cluster(store=store)
    raw = RawClient()
    base = _now_ms()
    dues = {f"r{i}".encode(): base + 400 + 40 * i for i in range(60)}  # 0.4 s .. 2.8 s
    try:
        for body, due in dues.items():
            _send_timer(raw, c.broker_addr, "T_RESTART", body, due)
        _wait_until(lambda: _max_offset(raw, c.broker_addr, "T_RESTART") >= 10, timeout=30)
    finally:
        raw.close()
    c.stop()
    cp = json.loads((store / "config" / "timerCheckpoint.json").read_text())
    assert 10 <= cp["oldestPendingOffset"] < 60
    (below, due, _), = cp["delivered"]
    assert below >= cp["oldestPendingOffset"] and due > base + 400
    c2 = make_cluster(store=store)
    raw = RawClient()
    try:
        msgs = _wait_until(lambda: len(_pull_all(raw, c2.broker_addr, "T_RESTART")) >= 60
                           and _pull_all(raw, c2.broker_addr, "T_RESTART"), timeout=8)
        time.sleep(0.3)
        msgs = _pull_all(raw, c2.broker_addr, "T_RESTART")
    finally:
        raw.close()
    bodies = [m.body for m in msgs]
    assert sorted(bodies) == sorted(dues), "lost or duplicated across a clean restart"
    assert bodies == sorted(dues, key=dues.get)
    cp = json.loads((store / "config" / "timerCheckpoint.json").read_text())
    assert cp["oldestPendingOffset"] == 60


def _kill_mid_delivery_and_recover(tmp_path, dues: list[int], kill_after: int) -> tuple[list, int]:
    """Send timer messages k0.. with `dues` to a broker process, SIGKILL it once `kill_after` are
    delivered, restart it on the same store and collect T_KILL until every body is there.
    Returns (bodies in queue order, messages delivered when the kill was sent)."""
    port = free_port()
    conf = write_conf(tmp_path / "broker.conf", {
        "brokerName": "broker-t", "listenPort": port, "brokerIP1": "127.0.0.1", "storePathRootDir": tmp_path / "store",
        "mappedFileSizeCommitLog": 16 * 1024 * 1024, "mappedFileSizeConsumeQueue": 6000 * 20,
        "maxHashSlotNum": 10000, "maxIndexNum": 40000})
    args = ["broker", "-n", f"127.0.0.1:{free_port()}", "-c", conf, "--listen-host", "127.0.0.1"]
    addr = f"127.0.0.1:{port}"
    n = len(dues)
    p = RmqProcess(args)
    raw = RawClient()
    try:
        p.wait_boot()
        for i, due in enumerate(dues):
            _send_timer(raw, addr, "T_KILL", f"k{i}".encode(), due)
        delivered_at_kill = _wait_until(lambda: (lambda m: m >= kill_after and m)(_max_offset(raw, addr, "T_KILL")),
                                        timeout=15, step=0.001)
    finally:
        p.kill()
        raw.close()
    p2 = RmqProcess(args)
    raw = RawClient()
    try:
        p2.wait_boot()
        _wait_until(lambda: len({m.body for m in _pull_all(raw, addr, "T_KILL")}) >= n, timeout=20, step=0.1)
        time.sleep(0.3)
        bodies = [m.body for m in _pull_all(raw, addr, "T_KILL")]
    finally:
        raw.close()
        p2.terminate()
    assert {f"k{i}".encode() for i in range(n)} == set(bodies), "timer messages lost across a crash"
    return bodies, delivered_at_kill


def test_broker_process_killed_mid_delivery_loses_nothing(tmp_path):
    """SIGKILL while due messages are being re-put; the restarted broker (recovering the store
    from an unclean stop) delivers the rest: no loss, duplicates only from the batches in flight."""
    base = _now_ms() + 1200
    dues = [base + 5 * i for i in range(400)]  # due over 2 s, one every 5 ms
    bodies, _ = _kill_mid_delivery_and_recover(tmp_path, dues, kill_after=100)
    duplicates = len(bodies) - len(set(bodies))
    # at most the batch in flight and the one whose checkpoint was being written
    assert duplicates <= 2 * DELIVERY_BATCH, f"{duplicates} duplicates: more than the batches in flight"


@pytest.mark.slow
def test_broker_process_killed_in_a_burst_loses_nothing(tmp_path):
    """3000 messages due at the same millisecond (full delivery batches), killed mid-burst."""
    due = _now_ms() + 4000
    bodies, at_kill = _kill_mid_delivery_and_recover(tmp_path, [due] * 3000, kill_after=300)
    duplicates = len(bodies) - len(set(bodies))
    assert duplicates <= 2 * DELIVERY_BATCH, f"{duplicates} duplicates (killed after {at_kill} delivered)"


def test_rebuilt_entry_due_time_comes_from_the_record(cluster, raw):
    """After an unclean stop the store rebuilds consume-queue entries with a tag hash; such an
    entry's due time is read from the record's TIMER_OUT_MS (put here the way a rebuild leaves it)."""
    addr = cluster.broker_addr
    r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                   {"topic": "T_REBUILT", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})
    assert r.code == 0, r.remark
    due = _now_ms() + 800
    inner = MessageExtBrokerInner(topic=TIMER_TOPIC, queue_id=0, body=b"rebuilt", properties={
        "TAGS": "TagX", TIMER_OUT_MS: str(due), "REAL_TOPIC": "T_REBUILT", "REAL_QID": "0"})
    # put in the broker's loop thread, as every put is
    asyncio.run_coroutine_threadsafe(cluster.broker.put_message(inner), cluster.loop).result(5)
    entry = cluster.broker.store.consume_queue_table[TIMER_TOPIC][0].get_entry(0)
    assert entry[2] < 1 << 32  # a tag hash, not a time
    time.sleep(0.4)
    assert _pull(raw, addr, "T_REBUILT") == []
    msgs = _wait_until(lambda: _pull(raw, addr, "T_REBUILT"), timeout=30)
    assert [m.body for m in msgs] == [b"rebuilt"] and msgs[0].store_timestamp >= due


# --- the wheel ----------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=0, max_size=200), st.integers(1, 250),
       st.lists(st.integers(0, 6000), min_size=1, max_size=8), st.integers(1, 64))
def test_wheel_pops_in_due_order_and_tracks_the_oldest_pending(dues, precision, nows, limit):
    wheel = TimingWheel(precision)
    for qoff, due in enumerate(dues):
        wheel.add(due, qoff, 1000 + qoff, 10)
    expected = sorted((due, qoff, 1000 + qoff, 10) for qoff, due in enumerate(dues))
    popped = []
    for now in sorted(nows):
        while True:
            batch = wheel.pop_due(now, limit)
            assert len(batch) <= limit and all(e[0] <= now for e in batch)
            popped += batch
            if len(batch) < limit:
                break
        left = [e for e in expected if e not in popped]
        assert len(wheel) == len(left)
        assert wheel.next_due_ms() == (min(e[0] for e in left) if left else None)
        assert wheel.oldest_pending_offset() == (min(e[1] for e in left) if left else None)
    assert popped == expected[:len(popped)]


def test_wheel_re_added_entry_stays_pending():
    wheel = TimingWheel(100)
    wheel.add(150, 7, 0, 1)
    wheel.add(250, 9, 0, 1)
    (e,) = wheel.pop_due(200, 10)
    assert wheel.oldest_pending_offset() == 9
    wheel.add(*e)  # a failed re-put goes back
    assert wheel.oldest_pending_offset() == 7 and wheel.next_due_ms() == 150
    assert [x[1] for x in wheel.pop_due(300, 10)] == [7, 9]
    assert wheel.oldest_pending_offset() is None and len(wheel) == 0


def test_checkpoint_file_is_written(cluster, raw):
    _send_timer(raw, cluster.broker_addr, "T_CP", b"x", _now_ms() + 300)
    assert _wait_until(lambda: _pull(raw, cluster.broker_addr, "T_CP"), timeout=30)
    path = os.path.join(cluster.store_path, "config", "timerCheckpoint.json")
    cp = _wait_until(lambda: os.path.exists(path) and json.load(open(path)), timeout=30)
    assert cp["oldestPendingOffset"] == 1 and [b[0] for b in cp["delivered"]] == [1]


# --- the rmq client end to end ---------------------------------------------------------------------------
def test_client_producer_and_push_consumer(make_cluster):
    from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
    from rmq_core.errors import MQBrokerError

    c = make_cluster()
    got = []
    fast = dict(poll_name_server_interval=1.0, heartbeat_broker_interval=1.0, persist_consumer_offset_interval=0.5)
    with Producer("PG_TIMER_E2E", namesrv=c.namesrv, **fast) as p:
        consumer = PushConsumer("CG_TIMER_E2E", namesrv=c.namesrv, rebalance_interval=1.0,
                                consume_from_where="CONSUME_FROM_FIRST_OFFSET", **fast)
        consumer.subscribe("T_E2E", "*")
        consumer.register_message_listener(lambda msgs: (got.extend((m, _now_ms()) for m in msgs),
                                                         ConsumeStatus.CONSUME_SUCCESS)[1])
        consumer.start()
        try:
            t0 = _now_ms()
            p.send(Message("T_E2E", b"second", tags="A", properties={"TIMER_DELIVER_MS": str(t0 + 1600)}))
            p.send(Message("T_E2E", b"first", tags="A", properties={"TIMER_DELAY_SEC": "1"}))
            p.send(Message("T_E2E", b"now", tags="A"))
            try:
                p.send(Message("T_E2E", b"bad", properties={"TIMER_DELIVER_MS": "noon"}))
            except MQBrokerError as e:
                assert "TIMER_DELIVER_MS" in str(e) and "'noon'" in str(e)
            else:
                raise AssertionError("a non-numeric TIMER_DELIVER_MS must be refused at send")
            assert _wait_until(lambda: len(got) >= 3, timeout=10)
            time.sleep(0.3)
        finally:
            consumer.shutdown()
    assert sorted(m.body for m, _ in got) == [b"first", b"now", b"second"]  # each once
    by_body = {m.body: (m, seen) for m, seen in got}
    # (the three may sit in different queues, so consumption order is not the delivery order)
    assert by_body[b"now"][0].store_timestamp < t0 + 1000
    assert t0 + 1000 <= by_body[b"first"][0].store_timestamp < by_body[b"second"][0].store_timestamp
    assert by_body[b"second"][0].store_timestamp >= t0 + 1600 and by_body[b"second"][1] - (t0 + 1600) < 2000


# --- the checkpoint rule, model-checked --------------------------------------------------------------------
class _Broker:
    """What TimerMessageService needs of a broker: a store, the configs, a topic table."""

    def __init__(self, store, store_config):
        from rmq_core.config import BrokerConfig

        self.store = store
        self.store_config = store_config
        self.broker_config = BrokerConfig()
        self.topic_manager = type("Topics", (), {"select": staticmethod(lambda topic: topic)})()


_step = st.one_of(
    st.tuples(st.just("put"), st.lists(st.integers(-300, 4000), min_size=1, max_size=6), st.booleans()),
    st.tuples(st.just("tick"), st.integers(-400, 1500), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("crash")),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, min_size=1, max_size=30), st.integers(2, 40))
# a round cut short by its batch limit, checkpointed, then a crash: the rest is still pending
@example([("put", [0, 0, 0], False), ("tick", 0, 1, True), ("crash",)], 10)
# an entry read after a checkpoint, due before its bound: it was never delivered
@example([("put", [0], False), ("tick", 0, 1, True), ("put", [-5], False), ("crash",)], 10)
# the clock steps back between rounds
@example([("put", [0], False), ("tick", 100, 1, False), ("tick", -300, 1, False), ("put", [0, 1], False),
          ("tick", 0, 1, True), ("crash",), ("tick", 500, 4, False)], 3)
def test_restart_from_any_checkpoint_loses_nothing_and_repeats_only_unsaved_deliveries(tmp_path_factory, steps,
                                                                                        window_slots):
    """Random puts (some with rebuilt hash tag codes), clock steps (also backwards), partial
    delivery rounds, checkpoints and crashes.  A crash restarts from the last saved checkpoint; in
    the end every message is delivered, and one is delivered twice only if its first delivery
    came after the checkpoint the restart used."""
    from rmq_core.broker import timer as timer_mod
    from rmq_core.config import MessageStoreConfig
    from rmq_core.store import DefaultMessageStore

    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path_factory.mktemp("timer-model")),
                             mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 16,
                             message_index_enable=False, timer_precision_ms=100, timer_roll_window_slot=window_slots)
    store = DefaultMessageStore(cfg)
    store.load()
    store.start()
    clock = [10_000_000]
    broker = _Broker(store, cfg)

    def boot(checkpoint):
        svc = timer_mod.TimerMessageService(broker)
        if checkpoint is not None:
            svc.restore(json.loads(json.dumps(checkpoint)))  # as it travels through the file
        svc.recover(clock[0])
        return svc

    deliveries = []  # (queue offset, due) in delivery order, across restarts
    saved = None  # (checkpoint, len(deliveries) when it was taken)
    allowed_repeats: dict[int, int] = {}
    dues: dict[int, int] = {}

    async def round_(svc, batch):
        got = await svc.collect_due(clock[0], batch)
        deliveries.extend((e[1], e[0]) for e in got)
        if got:
            svc.delivered_through(clock[0])
        return got

    svc = boot(None)
    try:
        for step in steps:
            if step[0] == "put":
                for d in step[1]:
                    due = clock[0] + d
                    hashed = d % 3 == 0  # as a rebuilt consume queue leaves it
                    r = store.put_message(MessageExtBrokerInner(
                        TIMER_TOPIC, 0, b"m", properties={TIMER_OUT_MS: str(due), "REAL_TOPIC": "T", "REAL_QID": "0"},
                        tags_code=None if hashed else due))
                    dues[r.append_result.logics_offset] = due
            elif step[0] == "tick":
                clock[0] += step[1]
                asyncio.run(round_(svc, step[2]))
                if step[3]:
                    saved = (svc.checkpoint(), len(deliveries))
            else:
                unsaved = deliveries[saved[1] if saved else 0:]
                for qoff, _ in unsaved:
                    allowed_repeats[qoff] = allowed_repeats.get(qoff, 0) + 1
                svc = boot(saved[0] if saved else None)
        clock[0] += 10 * 4000 + window_slots * 100 * 4  # everything is due
        for _ in range(10_000):
            if not asyncio.run(round_(svc, 64)) and svc._far_low is None and len(svc.wheel) == 0:
                break
    finally:
        store.shutdown()
    counts: dict[int, int] = {}
    for qoff, due in deliveries:
        counts[qoff] = counts.get(qoff, 0) + 1
        assert due == dues[qoff]
    assert set(counts) == set(dues), f"lost: {sorted(set(dues) - set(counts))}"
    for qoff, n in counts.items():
        assert n - 1 <= allowed_repeats.get(qoff, 0), f"queue offset {qoff} delivered {n} times"


def test_lenient_redirect_for_commits_and_send_backs(tmp_path):
    """A transaction commit or a consumer send-back cannot be refused: a bad timer value is dropped
    (stored at once), a delay beyond timerMaxDelaySec is clamped to it."""
    from rmq_core.broker.timer import TimerMessageService
    from rmq_core.config import MessageStoreConfig

    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path), timer_max_delay_sec=60)
    svc = TimerMessageService(_Broker(None, cfg))
    bad = svc.redirect_if_timer(MessageExtBrokerInner("T", 2, b"x", properties={"TIMER_DELIVER_MS": "x"}), strict=False)
    assert (bad.topic, bad.queue_id, bad.properties) == ("T", 2, {})
    t0 = _now_ms()
    far = svc.redirect_if_timer(MessageExtBrokerInner("T", 2, b"x", properties={"TIMER_DELAY_SEC": "3600"}),
                                strict=False)
    assert far.topic == TIMER_TOPIC and far.properties["REAL_TOPIC"] == "T" and far.properties["REAL_QID"] == "2"
    assert t0 + 60_000 <= far.tags_code <= _now_ms() + 60_000 and far.properties[TIMER_OUT_MS] == str(far.tags_code)
    try:
        svc.redirect_if_timer(MessageExtBrokerInner("T", 2, b"x", properties={"TIMER_DELAY_SEC": "3600"}))
    except TimerMessageError as e:
        assert "timerMaxDelaySec=60" in str(e)
    else:
        raise AssertionError("a producer's send beyond timerMaxDelaySec must be refused")
    # prepared halves are left alone (redirected on commit); a delay level wins
    half = MessageExtBrokerInner("T", 0, b"x", properties={"TIMER_DELAY_SEC": "5"}, sys_flag=4)
    assert svc.redirect_if_timer(half).properties == {"TIMER_DELAY_SEC": "5"}
    both = svc.redirect_if_timer(MessageExtBrokerInner("T", 0, b"x", properties={"DELAY": "3", "TIMER_DELAY_SEC": "5"}))
    assert both.topic == "T" and both.properties == {"DELAY": "3"}
