"""Transactions survive a dying producer (another member of the group is asked) and a broker restart."""
import json
import time

from rmq_core.codec import decode_messages
from rmq_core.remoting.codes import RequestCode
from tests.rawclient import RawClient


def _pull_all(raw, addr, topic):
    r = raw.pull(addr, topic, 0, 0)
    return decode_messages(r.body) if r.code == 0 else []


def _wait_for(fn, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    return fn()


class CommitChecker:
    """A producer's CHECK_TRANSACTION_STATE handler that answers COMMIT."""

    def __init__(self, group):
        self.group, self.checks = group, []

    async def process_request(self, ctx, request):
        self.checks.append(request.ext_fields)
        end = type(request).create_request(RequestCode.END_TRANSACTION, {
            "producerGroup": self.group, "tranStateTableOffset": request.ext_fields["tranStateTableOffset"],
            "commitLogOffset": request.ext_fields["commitLogOffset"], "commitOrRollback": "8",
            "fromTransactionCheck": "true", "msgId": request.ext_fields["msgId"]})
        await ctx.invoke(end, 5)
        return None


def _producer(addr, group, checker=None, name="producer"):
    r = RawClient(name)
    if checker is not None:
        r.client.register_processor(RequestCode.CHECK_TRANSACTION_STATE, checker)
    hb = {"clientID": f"{name}@{group}", "producerDataSet": [{"groupName": group}], "consumerDataSet": []}
    assert r.invoke(addr, RequestCode.HEART_BEAT, {}, json.dumps(hb).encode()).code == 0
    return r


def _half(r, addr, topic, body, group):
    resp = r.send(addr, topic, body, queue_id=0, props={"TRAN_MSG": "true", "PGROUP": group}, sys_flag=4, group=group)
    assert resp.code == 0, resp.remark
    return resp


def test_dead_producer_is_checked_through_another_member(cluster):
    addr = cluster.broker_addr
    dying = _producer(addr, "PG_DIE", name="dying")
    _half(dying, addr, "T_DIE", b"orphaned-by-a-crash", "PG_DIE")
    dying.close()  # the producer is gone before deciding
    checker = CommitChecker("PG_DIE")
    survivor = _producer(addr, "PG_DIE", checker, name="survivor")
    try:
        msgs = _wait_for(lambda: _pull_all(survivor, addr, "T_DIE"), timeout=8)
        assert [m.body for m in msgs] == [b"orphaned-by-a-crash"] and checker.checks
    finally:
        survivor.close()


def test_broker_restart_mid_transaction_still_resolves(make_cluster, tmp_path):
    c = make_cluster({"transactionTimeOut": "300"})
    addr = c.broker_addr
    p = _producer(addr, "PG_RS", name="before-restart")
    _half(p, addr, "T_RS", b"pending-across-restart", "PG_RS")
    p.close()
    c.stop()
    c2 = make_cluster({"transactionTimeOut": "300"}, store=tmp_path / "store")
    addr2 = c2.broker_addr
    checker = CommitChecker("PG_RS")
    p2 = _producer(addr2, "PG_RS", checker, name="after-restart")
    try:
        msgs = _wait_for(lambda: _pull_all(p2, addr2, "T_RS"), timeout=8)
        assert [m.body for m in msgs] == [b"pending-across-restart"]
        time.sleep(1.0)
        assert len(_pull_all(p2, addr2, "T_RS")) == 1, "resolved once"
    finally:
        p2.close()


def test_late_end_after_a_check_pass_still_commits_once(cluster):
    """The check pass re-appends an unanswered half; an END that arrives afterwards for the
    original copy must still commit it — once — and the re-appended copy is not checked again."""
    addr = cluster.broker_addr
    p = RawClient("late")
    try:
        r = _half(p, addr, "T_LATE_END", b"late-commit", "PG_LATE")
        svc = cluster.broker.transaction_service
        assert _wait_for(lambda: _half_copies(p, addr) >= 2, timeout=30), "the check pass re-appended the half"
        assert svc.checks_sent == 0  # no live producer of PG_LATE: nobody could answer
        end = p.invoke(addr, RequestCode.END_TRANSACTION, {
            "producerGroup": "PG_LATE", "tranStateTableOffset": r.ext_fields["queueOffset"],
            "commitLogOffset": str(int(r.ext_fields["msgId"][16:], 16)), "commitOrRollback": "8",
            "fromTransactionCheck": "false", "msgId": "x"})
        assert end.code == 0, end.remark
        assert [m.body for m in _wait_for(lambda: _pull_all(p, addr, "T_LATE_END"), 30)] == [b"late-commit"]
        time.sleep(2.5)  # several check passes later: neither discarded nor committed twice
        assert [m.body for m in _pull_all(p, addr, "T_LATE_END")] == [b"late-commit"]
        assert svc.discarded == 0
    finally:
        p.close()


def _half_copies(raw, addr):
    r = raw.invoke(addr, RequestCode.GET_MAX_OFFSET, {"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": "0"})
    return int(r.ext_fields["offset"])
