"""PipelinedWrites (a PipelinedChannel's write side, natively): under any interleaving of callers
offering frames, writers taking what gathered, the reader's partial non-blocking flushes and
answers arriving, every frame reaches the socket exactly once and in the order it was offered;
the gather-or-write rule (first request at once, then gather while answers are due, up to
coalesce_bytes / coalesce_delay); closing refuses new requests."""
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core._native.socket_io import PipelinedWrites

_ops = st.lists(st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 900)),  # a caller sends a frame of that size
    st.tuples(st.just("writer"), st.integers(0, 3)),  # a writer finishes a write (which writer)
    st.tuples(st.just("flush"), st.integers(0, 5), st.floats(0, 1)),  # answers come; the reader flushes part
    st.tuples(st.just("wait"), st.just(0)),  # a waiting caller writes what gathered
), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops=_ops, coalesce_bytes=st.sampled_from([1, 500, 4096, 65536]))
def test_every_frame_is_written_once_in_order_under_any_interleaving(ops, coalesce_bytes):
    pending = {}
    w = PipelinedWrites(pending, coalesce_bytes, 3600.0)
    offered, written = [], []
    writers = []  # bytes each writer thread is writing now (one entry per writer in a write)
    opaque = 0

    def out(data):
        written.append(bytes(data))

    for op in ops:
        if op[0] == "offer":
            opaque += 1
            frame = opaque.to_bytes(4, "big") + bytes(op[1] - 1 if op[1] > 4 else 0)
            offered.append(frame)
            data = w.offer(frame, opaque, 10.0, None, opaque)
            assert opaque in pending
            if data is not None:
                assert data is not False and w.writing
                writers.append(data)
        elif op[0] == "writer" and writers:
            data = writers.pop(op[1] % len(writers))
            out(data)  # its sendall is done
            more = w.next_write()
            if more is not None:
                writers.append(more)
        elif op[0] == "flush":
            data = w.start_flush(op[1])
            if data is not None:
                sent = int(len(data) * op[2])
                out(data[:sent])
                w.end_flush(data[sent:] if sent < len(data) else None)
        elif op[0] == "wait":
            data = w.start_flush()
            if data is not None:
                writers.append(data)
        assert len(writers) <= 1 and w.writing == bool(writers)  # one writer at a time
    while writers:  # the writers finish; then whatever gathered is flushed
        out(writers.pop())
        more = w.next_write()
        if more is not None:
            writers.append(more)
    data = w.start_flush()
    while data is not None:
        out(data)
        w.end_flush(None)
        data = w.start_flush()
    assert b"".join(written) == b"".join(offered)
    assert not w.gathered and not w.writing


def test_the_first_request_goes_at_once_then_requests_gather_while_answers_are_due():
    w = PipelinedWrites({}, 100, 3600.0)
    assert w.offer(b"a" * 10, 1, 5.0, None, None) == b"a" * 10  # nothing in flight: written at once
    assert w.next_write() is None and not w.writing and w.unanswered == 1
    assert w.offer(b"b" * 60, 2, 5.0, None, None) is None  # an answer is due: it gathers
    assert w.offer(b"c" * 30, 3, 5.0, None, None) is None and w.gathered
    # past coalesce_bytes the next caller writes what gathered, then its own frame
    assert w.offer(b"d" * 20, 4, 5.0, None, None) == b"b" * 60 + b"c" * 30 + b"d" * 20
    assert w.next_write() is None and w.unanswered == 4
    w.answered(4)
    assert w.unanswered == 0 and w.offer(b"e", 5, 5.0, None, None) == b"e"


def test_gathering_stops_after_coalesce_delay():
    w = PipelinedWrites({}, 1 << 20, 0.01)
    assert w.offer(b"a", 1, 5.0, None, None) == b"a" and w.next_write() is None
    assert w.offer(b"b", 2, 5.0, None, None) is None
    time.sleep(0.02)
    assert w.offer(b"c", 3, 5.0, None, None) == b"bc"


def test_a_closed_or_closing_channel_refuses_requests_and_keeps_the_first_error():
    pending = {}
    w = PipelinedWrites(pending, 4096, 0.002)
    w.closing = True
    assert w.offer(b"a", 1, 5.0, None, None) is False and not pending
    w.closing = False
    first, second = OSError("first"), OSError("second")
    assert w.mark_closed(first) and not w.mark_closed(second)
    assert w.closed and w.error is first
    assert w.offer(b"a", 1, 5.0, None, None) is False and not pending
    assert w.start_flush() is None


def test_pending_entries_carry_the_deadline_the_callback_and_the_context():
    pending = {}
    w = PipelinedWrites(pending, 4096, 0.002)
    before = time.monotonic()
    w.offer(b"x", 7, 2.5, print, ("ctx",))
    deadline, on_done, context = pending[7]
    assert before + 2.5 <= deadline <= time.monotonic() + 2.5
    assert on_done is print and context == ("ctx",) and w.last_send >= before
