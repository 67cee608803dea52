"""One definition of a valid message: every kind of send (sync, async and oneway sends whose first
attempt is made natively, the same by a selector - SendAttempts from the start -, a one-message
batch) accepts and refuses the same messages, with the same error (issue 13: a negative
delay_time_level was accepted by two routes and refused by the others)."""
from __future__ import annotations

import concurrent.futures

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rmq_core import Message, Producer
from rmq_core.client.selector import check_message
from rmq_core.errors import IllegalArgumentError

from .conftest import FAST

TOPIC = "RouteChecks"
MAX_SIZE = 2048

topics = st.sampled_from([TOPIC, TOPIC, TOPIC, "", "bad topic!", "SCHEDULE_TOPIC_XXXX", "T" * 200])
bodies = st.sampled_from([b"", b"x", b"hello", b"y" * MAX_SIZE, b"z" * (MAX_SIZE + 1)])
properties = st.dictionaries(st.sampled_from(["a", "b", "DELAY", "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "TRAN_MSG"]),
                             st.sampled_from(["1", "x"]), max_size=2)
messages = st.builds(lambda topic, body, delay, props, tags: Message(topic, body, tags=tags, properties=props,
                                                                     delay_time_level=delay),
                     topics, bodies, st.integers(-3, 3), properties, st.sampled_from([None, "TagA"]))


def _first(mqs, msg, arg):
    return mqs[0]


def _verdict(call) -> str:
    """"ok", or the refusal's message (an IllegalArgumentError, raised or in the Future)."""
    try:
        r = call()
        if isinstance(r, concurrent.futures.Future):
            r = r.result(10)
    except IllegalArgumentError as e:
        return f"refused: {e}"
    return "ok"


@pytest.fixture
def producers(cluster):
    made = {"native": Producer("PG_CHK_N", namesrv=cluster.tcp_namesrv, max_message_size=MAX_SIZE, **FAST)}
    for p in made.values():
        p.start()
        p.send(Message(TOPIC, b"warm-up"))  # routes cached: the native routes are open
    yield made
    for p in made.values():
        p.shutdown()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msg=messages)
def test_every_send_route_accepts_and_refuses_the_same_messages(producers, msg):
    native = producers["native"]
    routes = {
        "send": lambda: native.send(msg),
        "send_async": lambda: native.send_async(msg),
        "send_oneway": lambda: native.send_oneway(msg),
        "selector send": lambda: native.send(msg, selector=_first),
        "selector send_async": lambda: native.send_async(msg, selector=_first),
        "selector send_oneway": lambda: native.send_oneway(msg, selector=_first),
    }
    expected = _verdict(lambda: check_message(msg, MAX_SIZE))
    answers = {name: _verdict(call) for name, call in routes.items()}
    assert answers == {name: expected for name in routes}, msg
    if msg.delay_time_level == 0 and len(msg.body) < MAX_SIZE // 2:
        # (a batch has rules of its own besides: no delay levels, an encoded size under the limit)
        batch = _verdict(lambda: native.send_batch([msg]))
        assert batch.replace("batch item 0: ", "", 1) == expected, msg  # (an item's error says which)


def test_a_negative_delay_level_is_refused_by_every_route(producers):
    msg = Message(TOPIC, b"body", delay_time_level=-1)
    native = producers["native"]
    for call in (lambda: native.send(msg), lambda: native.send_async(msg), lambda: native.send_oneway(msg),
                 lambda: native.send(msg, selector=_first), lambda: native.send_async(msg, selector=_first),
                 lambda: native.send_batch([msg])):
        assert "bad delay_time_level -1: must be >= 0" in _verdict(call)
    native.send(Message(TOPIC, b"valid"))  # (refusals sent nothing and broke nothing)
