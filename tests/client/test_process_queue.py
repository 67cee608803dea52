"""ProcessQueue: the committed offset is always the lowest unconsumed one; flow-control numbers."""
import threading

from hypothesis import given, settings, strategies as st

from rmq_core.client.process_queue import ProcessQueue
from rmq_core.message import MessageExt


def msgs(offsets, body=b"x" * 10):
    return [MessageExt(topic="T", body=body, queue_id=0, queue_offset=o) for o in offsets]


def test_remove_returns_lowest_unconsumed_offset():
    pq = ProcessQueue()
    batch = msgs(range(10, 20))
    pq.put_messages(batch)
    assert pq.msg_count == 10 and pq.msg_size == 100
    assert pq.max_span == 9
    # consuming 12 first does not move the commit point past 10
    assert pq.remove_messages([batch[2]]) == 10
    assert pq.remove_messages([batch[0]]) == 11
    assert pq.remove_messages(batch[1:2]) == 13
    # everything consumed: commit max + 1
    assert pq.remove_messages(batch[3:]) == 20
    assert pq.msg_count == 0 and pq.msg_size == 0
    # nothing buffered: nothing to commit
    assert pq.remove_messages(batch[:1]) == -1


def test_duplicate_put_is_ignored():
    pq = ProcessQueue()
    pq.put_messages(msgs([1, 2]))
    pq.put_messages(msgs([2, 3]))
    assert pq.msg_count == 3 and len(pq) == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=120, unique=True), st.randoms())
def test_commit_offset_property(offsets, rnd):
    """Whatever order messages finish in, the offset returned is min(unconsumed) or max+1."""
    offsets = sorted(offsets)
    pq = ProcessQueue()
    batch = msgs(offsets)
    pq.put_messages(batch)
    pending = list(batch)
    rnd.shuffle(pending)
    remaining = set(offsets)
    while pending:
        k = rnd.randint(1, min(5, len(pending)))
        done, pending = pending[:k], pending[k:]
        for m in done:
            remaining.discard(m.queue_offset)
        got = pq.remove_messages(done)
        expected = min(remaining) if remaining else offsets[-1] + 1
        assert got == expected
    assert pq.msg_count == 0


def test_orderly_take_commit_and_consume_again():
    pq = ProcessQueue()
    assert pq.put_messages(msgs([5, 6, 7, 8])) is True  # idle -> dispatch
    assert pq.put_messages(msgs([9])) is False  # already consuming
    taken = pq.take_messages(2)
    assert [m.queue_offset for m in taken] == [5, 6]
    pq.make_messages_to_consume_again(taken)
    again = pq.take_messages(3)
    assert [m.queue_offset for m in again] == [5, 6, 7]
    assert pq.commit() == 8
    rest = pq.take_messages(10)
    assert [m.queue_offset for m in rest] == [8, 9]
    pq.rollback()
    assert [m.queue_offset for m in pq.take_messages(10)] == [8, 9]
    assert pq.commit() == 10
    assert pq.take_messages(10) == []
    assert pq.consuming is False  # drained: the next put dispatches again
    assert pq.put_messages(msgs([10])) is True


def test_first_messages_and_clear():
    pq = ProcessQueue()
    batch = msgs([3, 1, 2])
    pq.put_messages(batch)
    assert [m.queue_offset for m in pq.first_messages(2)] == [1, 2]
    pq.clear()
    assert pq.msg_count == 0 and pq.first_messages(2) == [] and pq.max_span == 0


def test_out_of_order_puts_keep_the_lowest_offset_first():
    """Offsets below the highest buffered one (a batch out of order, messages put back by an
    orderly consumer) still leave the lowest unconsumed offset first."""
    pq = ProcessQueue()
    pq.put_messages(msgs(range(100, 110)))
    pq.put_messages(msgs([50, 120, 60, 105]))  # 105 is a repeat: ignored
    assert pq.msg_count == 13 and pq.msg_size == 130 and pq.max_span == 120 - 50
    assert [m.queue_offset for m in pq.first_messages(3)] == [50, 60, 100]
    taken = pq.take_messages(4)
    assert [m.queue_offset for m in taken] == [50, 60, 100, 101]
    pq.put_messages(msgs([100]))  # being consumed: not buffered twice
    pq.make_messages_to_consume_again(taken[2:])
    assert [m.queue_offset for m in pq.first_messages(2)] == [100, 101]
    assert pq.commit() == 61
    assert pq.msg_count == 11 and pq.msg_size == 110
    assert pq.remove_messages(pq.first_messages(1)) == 101


def test_fifo_removal_keeps_the_commit_offset_exact():
    pq = ProcessQueue()
    for base in range(0, 20000, 100):
        batch = msgs(range(base, base + 100))
        pq.put_messages(batch)
        assert pq.remove_messages(batch[1:]) == base  # the first of the batch is still unconsumed
        assert pq.remove_messages(batch[:1]) == base + 100
    assert pq.msg_count == 0 and pq.msg_size == 0 and len(pq) == 0


def test_concurrent_removal_is_consistent():
    pq = ProcessQueue()
    batch = msgs(range(4000))
    pq.put_messages(batch)
    chunks = [batch[i::4] for i in range(4)]
    threads = [threading.Thread(target=lambda c=c: [pq.remove_messages([m]) for m in c]) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pq.msg_count == 0 and pq.msg_size == 0
