"""RebalanceImpl's bookkeeping without a broker: broadcasting mode needs no RPC, so the table
updates (add, drop, expired pull, refused start offset) can be checked directly."""
import time

from hypothesis import given, settings, strategies as st

from rmq_core.client.rebalance import RebalanceImpl
from rmq_core.client.subscription import build_subscription
from rmq_core.message import MessageModel, MessageQueue


class Owner:
    def __init__(self, offsets=None, release=True):
        self.offsets = offsets or {}
        self.release = release
        self.dispatched, self.removed, self.changed, self.dirty = [], [], [], []

    def remove_unnecessary_message_queue(self, mq, pq):
        self.removed.append(mq)
        return self.release

    def remove_dirty_offset(self, mq):
        self.dirty.append(mq)

    def compute_pull_from_where(self, mq):
        return self.offsets.get(mq, 0)

    def dispatch_pull(self, mq, pq, offset):
        self.dispatched.append((mq, offset))

    def message_queue_changed(self, topic, mq_all, mq_divided):
        self.changed.append((topic, frozenset(mq_divided)))


class NoNetwork:
    client_id = "1.2.3.4@test"

    def run(self, *a, **kw):  # broadcasting must never ask a broker
        raise AssertionError("broadcasting rebalance made an RPC")


def qs(n, topic="T"):
    return [MessageQueue(topic, "b", i) for i in range(n)]


def make(owner, **kw):
    rb = RebalanceImpl(owner, NoNetwork(), "CG", MessageModel.BROADCASTING, strategy=None, **kw)
    rb.subscriptions = {"T": build_subscription("T", "*")}
    return rb


def test_broadcasting_owns_every_queue_and_drops_vanished_ones():
    owner = Owner(offsets={MessageQueue("T", "b", 2): -1})  # no start offset for queue 2: skipped
    rb = make(owner)
    rb.topic_subscribe_info["T"] = qs(4)
    rb.do_rebalance()
    assert sorted(mq.queue_id for mq, _ in owner.dispatched) == [0, 1, 3]
    assert set(rb.process_queue_table) == {MessageQueue("T", "b", i) for i in (0, 1, 3)}
    assert owner.changed and owner.dirty
    # queue 3 disappears from the route: dropped and removed
    rb.topic_subscribe_info["T"] = qs(3)
    pq3 = rb.process_queue_table[MessageQueue("T", "b", 3)]
    owner.offsets = {}
    rb.do_rebalance()
    assert pq3.dropped and MessageQueue("T", "b", 3) not in rb.process_queue_table
    assert MessageQueue("T", "b", 2) in rb.process_queue_table  # retried and added this time


def test_expired_pull_is_rebuilt_and_unsubscribed_topics_truncated():
    owner = Owner()
    rb = make(owner, pull_max_idle_time=0.01)
    rb.topic_subscribe_info["T"] = qs(2)
    rb.do_rebalance()
    old = rb.process_queue_table[MessageQueue("T", "b", 0)]
    old.last_pull_timestamp = time.monotonic() - 1
    rb.process_queue_table[MessageQueue("T", "b", 1)].last_pull_timestamp = time.monotonic() - 1
    rb.do_rebalance()  # both expired: dropped and rebuilt with a fresh ProcessQueue in the same pass
    assert old.dropped
    assert len(rb.process_queue_table) == 2 and rb.process_queue_table[MessageQueue("T", "b", 0)] is not old
    assert len(owner.dispatched) == 4
    rb.subscriptions = {}
    rb.do_rebalance()
    assert not rb.process_queue_table


def test_a_queue_that_cannot_be_released_stays_until_it_can():
    owner = Owner(release=False)
    rb = make(owner)
    rb.topic_subscribe_info["T"] = qs(2)
    rb.do_rebalance()
    rb.topic_subscribe_info["T"] = qs(1)
    rb.do_rebalance()
    assert MessageQueue("T", "b", 1) in rb.process_queue_table  # still consuming: kept, but dropped
    assert rb.process_queue_table[MessageQueue("T", "b", 1)].dropped
    owner.release = True
    rb.do_rebalance()
    assert MessageQueue("T", "b", 1) not in rb.process_queue_table


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=8))
def test_table_always_matches_the_route(sizes):
    owner = Owner()
    rb = make(owner)
    for n in sizes:
        rb.topic_subscribe_info["T"] = qs(n)
        rb.do_rebalance()
        assert set(rb.process_queue_table) == set(qs(n))
        assert all(not pq.dropped for pq in rb.process_queue_table.values())


def test_a_missing_topic_is_reported_once_while_it_lasts(caplog):
    rb = make(Owner())
    with caplog.at_level("WARNING", logger="rmq.client.rebalance"):
        for _ in range(3):  # (every 20 s in a consumer)
            rb.do_rebalance()
        assert [r.getMessage() for r in caplog.records] == ["doRebalance, CG, but the topic[T] does not exist"]
        rb.topic_subscribe_info["T"] = qs(1)  # the topic made ...
        rb.do_rebalance()
        del rb.topic_subscribe_info["T"]  # ... and deleted again: said again, once
        rb.do_rebalance()
        rb.do_rebalance()
    assert [r.getMessage() for r in caplog.records].count("doRebalance, CG, but the topic[T] does not exist") == 2
