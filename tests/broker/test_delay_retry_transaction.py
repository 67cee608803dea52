"""Delay levels, consumer retries (send-back → %RETRY% → %DLQ%), transactional messages."""
import json
import time

from rmq_core.codec import decode_messages
from rmq_core.remoting.codes import RequestCode, ResponseCode


def _pull_all(raw, addr, topic, queue_id=0, offset=0, sub="*"):
    resp = raw.pull(addr, topic, queue_id, offset, sub=sub)
    return decode_messages(resp.body) if resp.code == 0 else []


def _wait_for(fn, timeout=10.0, step=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def test_delay_level_not_visible_before_and_visible_after(cluster, raw):
    addr = cluster.broker_addr
    t0 = time.time()
    r = raw.send(addr, "T_DELAY", b"later", tags="TagD", queue_id=2, props={"DELAY": "2"})  # 2s in tests
    assert r.code == 0
    time.sleep(1.0)
    assert _pull_all(raw, addr, "T_DELAY", 2) == []
    msgs = _wait_for(lambda: _pull_all(raw, addr, "T_DELAY", 2), timeout=30)
    delivered_after = time.time() - t0
    assert [m.body for m in msgs] == [b"later"]
    assert msgs[0].tags == "TagD" and "DELAY" not in msgs[0].properties and "REAL_TOPIC" not in msgs[0].properties
    assert delivered_after >= 1.9  # never before its level's time (how late depends on the machine)
    # the tag code was restored: a tag-filtered pull finds it
    assert [m.body for m in _pull_all(raw, addr, "T_DELAY", 2, sub="TagD")] == [b"later"]


def test_level_above_max_is_clamped(cluster, raw):
    r = raw.send(cluster.broker_addr, "T_CLAMP", b"x", queue_id=0, props={"DELAY": "99"})
    assert r.code == 0
    sched = _pull_all(raw, cluster.broker_addr, "SCHEDULE_TOPIC_XXXX", 17)
    assert [m.properties["REAL_TOPIC"] for m in sched] == ["T_CLAMP"]


def test_delayed_messages_survive_restart_once(make_cluster, raw, tmp_path):
    c = make_cluster()
    for i in range(3):
        assert raw.send(c.broker_addr, "T_DR", f"m{i}".encode(), queue_id=0, props={"DELAY": "3"}).code == 0
    c.stop()
    raw.close()
    c2 = make_cluster(store=tmp_path / "store")
    from tests.rawclient import RawClient
    r2 = RawClient()
    try:
        # (level 3 is 3 s here; the wait is a bound, long enough for a loaded machine's restart)
        msgs = _wait_for(lambda: len(_pull_all(r2, c2.broker_addr, "T_DR")) >= 3 and _pull_all(r2, c2.broker_addr, "T_DR"), 30)
        time.sleep(0.5)
        msgs = _pull_all(r2, c2.broker_addr, "T_DR")
        assert sorted(m.body for m in msgs) == [b"m0", b"m1", b"m2"]
    finally:
        r2.close()


def test_send_back_goes_to_retry_with_growing_delay_then_dlq(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    raw.heartbeat(addr, "c1", "CG_R", "T_R")
    r = raw.send(addr, "T_R", b"fail-me", tags="TagR", queue_id=0)
    phys = int(r.ext_fields["msgId"][16:], 16)
    sb = raw.invoke(addr, RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": str(phys), "group": "CG_R", "delayLevel": "0",
                                                               "originMsgId": "ORIG1", "maxReconsumeTimes": "2"})
    assert sb.code == 0, sb.remark
    # level 3 + reconsumeTimes(0) = 3 → 3 s in tests; stored in the schedule topic queue 2
    sched = _pull_all(raw, addr, "SCHEDULE_TOPIC_XXXX", 2)
    assert sched and sched[0].properties["REAL_TOPIC"] == "%RETRY%CG_R" and sched[0].reconsume_times == 1
    retry = _wait_for(lambda: _pull_all(raw, addr, "%RETRY%CG_R"), timeout=30)
    assert retry[0].body == b"fail-me" and retry[0].properties["RETRY_TOPIC"] == "T_R"
    assert retry[0].properties["ORIGIN_MESSAGE_ID"] == "ORIG1" and retry[0].reconsume_times == 1
    # out of attempts (reconsume_times >= max) → DLQ, no delay
    retry_phys = retry[0].commit_log_offset
    sb = raw.invoke(addr, RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": str(retry_phys), "group": "CG_R",
                                                               "delayLevel": "0", "maxReconsumeTimes": "1"})
    assert sb.code == 0
    dlq = _wait_for(lambda: _pull_all(raw, addr, "%DLQ%CG_R"), timeout=30)
    assert [m.body for m in dlq] == [b"fail-me"] and dlq[0].reconsume_times == 2


def _half(raw, addr, body, group="PG_TX"):
    props = {"TRAN_MSG": "true", "PGROUP": group}
    r = raw.send(addr, "T_TX", body, queue_id=0, props=props, sys_flag=4, group=group)
    assert r.code == 0, r.remark
    return r


def _end(raw, addr, r, state, group="PG_TX"):
    phys = int(r.ext_fields["msgId"][16:], 16)
    return raw.invoke(addr, RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": r.ext_fields["queueOffset"], "commitLogOffset": str(phys),
        "commitOrRollback": str(state), "fromTransactionCheck": "false", "msgId": "x"})


def test_transaction_commit_visible_once_rollback_never(cluster, raw):
    addr = cluster.broker_addr
    r1 = _half(raw, addr, b"commit-me")
    r2 = _half(raw, addr, b"roll-me-back")
    assert _pull_all(raw, addr, "T_TX") == []  # halves are invisible
    assert _end(raw, addr, r1, 8).code == 0
    assert _end(raw, addr, r2, 12).code == 0
    assert _end(raw, addr, r1, 8).code == 0  # a repeated commit does not duplicate
    msgs = _pull_all(raw, addr, "T_TX")
    assert [m.body for m in msgs] == [b"commit-me"]
    assert "TRAN_MSG" not in msgs[0].properties and (msgs[0].sys_flag & 0xC) == 8


def test_transaction_unknown_is_checked_back_and_resolved(cluster, raw):
    """A live producer of the group gets CHECK_TRANSACTION_STATE and answers COMMIT."""
    addr = cluster.broker_addr
    checks = []

    class Checker:
        async def process_request(self, ctx, request):
            checks.append(request)
            msg = decode_messages(request.body)[0]
            assert msg.topic == "T_TX2"
            end = type(request).create_request(RequestCode.END_TRANSACTION, {
                "producerGroup": "PG_TX2", "tranStateTableOffset": request.ext_fields["tranStateTableOffset"],
                "commitLogOffset": request.ext_fields["commitLogOffset"], "commitOrRollback": "8",
                "fromTransactionCheck": "true", "msgId": request.ext_fields["msgId"]})
            await ctx.invoke(end, 5)
            return None

    raw.client.register_processor(RequestCode.CHECK_TRANSACTION_STATE, Checker())
    hb = {"clientID": "tx-producer", "producerDataSet": [{"groupName": "PG_TX2"}], "consumerDataSet": []}
    assert raw.invoke(addr, RequestCode.HEART_BEAT, {}, json.dumps(hb).encode()).code == 0
    r = raw.send(addr, "T_TX2", b"unknown-then-commit", queue_id=0, props={"TRAN_MSG": "true", "PGROUP": "PG_TX2"},
                 sys_flag=4, group="PG_TX2")
    assert r.code == 0
    msgs = _wait_for(lambda: _pull_all(raw, addr, "T_TX2"), timeout=8)
    assert [m.body for m in msgs] == [b"unknown-then-commit"] and checks
    time.sleep(1.0)
    assert len(_pull_all(raw, addr, "T_TX2")) == 1


def test_transaction_without_answer_is_rolled_back_after_max_checks(cluster, raw):
    addr = cluster.broker_addr
    r = raw.send(addr, "T_TX3", b"orphan", queue_id=0, props={"TRAN_MSG": "true", "PGROUP": "PG_GONE"},
                 sys_flag=4, group="PG_GONE")
    assert r.code == 0
    svc = cluster.broker.transaction_service
    _wait_for(lambda: svc.discarded >= 1, timeout=10)
    assert svc.discarded == 1
    assert _pull_all(raw, addr, "T_TX3") == []
    kept = _pull_all(raw, addr, "TRANS_CHECK_MAX_TIME_TOPIC")
    assert [m.body for m in kept] == [b"orphan"]
