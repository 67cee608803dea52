"""send_batch's native encoder (rmq_core._native.record_batch.encode_send_batch) against its Python twin
(tests/client/batch_reference.py) and the codec's layout: the same bytes, the same UNIQ_KEYs,
the same errors naming the item and the bad value."""
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rmq_core._native.record_batch import encode_batch_item, encode_send_batch
from rmq_core.client.producer import _RESERVED_PROPERTIES, Producer, check_send_topic
from tests.client.batch_reference import encode_batch_py
from tests.codec_oracle import decode_batch_body_py
from tests.codec_oracle import encode_batch_items as encode_batch_body_py
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import Message, MessageClientIDSetter, MessageConst, string_to_properties


def native(msgs, max_size=4 * 1024 * 1024):
    return encode_send_batch(msgs, max_size, Message, _RESERVED_PROPERTIES, check_send_topic,
                             MessageClientIDSetter.create_uniq_id)


def twin(msgs, uniqs, max_size=4 * 1024 * 1024):
    """encode_batch_py handed the ids the native run made where it made new ones."""
    made = iter([u for m, u in zip(msgs, uniqs) if not m.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)])
    return encode_batch_py(msgs, max_size, lambda: next(made))


def outcome(fn):
    try:
        return "ok", fn()
    except IllegalArgumentError as e:
        return "error", str(e)


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), min_size=1, max_size=8)
value = st.one_of(text, st.integers(-5, 5), st.none())


@st.composite
def messages(draw, topic):
    props = draw(st.dictionaries(name | st.sampled_from(["UNIQ_KEY", "TAGS", "WAIT"]), value, max_size=3))
    return Message(
        topic, draw(st.binary(min_size=1, max_size=300)),
        tags=draw(st.none() | text), keys=draw(st.none() | text), properties=props,
        flag=draw(st.integers(-2**31, 2**31 - 1) | st.sampled_from([2**31, -2**31 - 1])),
        wait_store_msg_ok=draw(st.booleans()), delay_time_level=draw(st.sampled_from([0, 0, 0, 1, -1])),
    )


@st.composite
def batches(draw):
    topic = draw(st.sampled_from(["TopicA", "T_b-1", "%RETRY%G", "bad topic", "SCHEDULE_TOPIC_XXXX"]))
    msgs = draw(st.lists(messages(topic), min_size=1, max_size=6))
    if draw(st.integers(0, 9)) == 0:  # now and then a stranger: another topic, a bad body, not a Message
        i = draw(st.integers(0, len(msgs) - 1))
        stranger = draw(st.sampled_from(["topic", "empty", "object"]))
        if stranger == "topic":
            msgs[i] = Message("Other", b"x")
        elif stranger == "empty":
            msgs[i] = Message(topic, b"")
        else:
            msgs[i] = ("not", "a message")
    return msgs


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.sampled_from([4 * 1024 * 1024, 600, 200]))
@example([Message("TopicA", b"\x00", properties={"UNIQ_KEY": ","})], 4 * 1024 * 1024)
def test_native_encoder_matches_its_python_twin(msgs, max_size):
    got = outcome(lambda: native(msgs, max_size))
    if got[0] == "ok":
        topic, uniq, body, wait = got[1]
        # each item's UNIQ_KEY read from the encoded body (a message's own may hold a comma: the
        # batch's joined list is not split back)
        items = decode_batch_body_py(body)
        assert len(items) == len(msgs)
        uniqs = [string_to_properties(raw)["UNIQ_KEY"] for _, _, raw in items]
        assert uniq == ",".join(uniqs)
        assert got == ("ok", twin(msgs, uniqs, max_size))
        # the codec's own layout, item by item
        assert encode_batch_body_py([(f, b, raw) for f, b, raw in items]) == body
        for m, (flag, b, raw), u in zip(msgs, items, uniqs):
            props = string_to_properties(raw)
            assert (flag, b, props["UNIQ_KEY"], props["WAIT"]) == (
                m.flag, m.body, u, "true" if m.wait_store_msg_ok else "false")
            assert props.get("TAGS") == (str(m.tags) if m.tags else None)
    else:
        want = outcome(lambda: encode_batch_py(msgs, max_size, lambda: "0" * 32))
        assert want == got


def test_new_uniq_keys_are_unique_and_a_message_keeps_its_own():
    msgs = [Message("TopicA", b"a"), Message("TopicA", b"b", properties={"UNIQ_KEY": "MINE", "x": "1"}),
            Message("TopicA", b"c", properties={"UNIQ_KEY": ""})]
    topic, uniq, body, wait = native(msgs)
    uniqs = uniq.split(",")
    assert uniqs[1] == "MINE" and len(set(uniqs)) == 3 and all(re.fullmatch("[0-9A-F]{32}", u) for u in (uniqs[0], uniqs[2]))
    # the message's own UNIQ_KEY stays where it was among its properties
    assert decode_batch_body_py(body)[1][2] == b"UNIQ_KEY\x01MINE\x02x\x011\x02WAIT\x01true\x02"


@pytest.mark.parametrize("msgs, error", [
    ([], "^send_batch needs at least one message$"),
    ([Message("TopicA", b"a"), Message("TopicB", b"b")], "^batch item 1: .*same topic: 'TopicB' differs from 'TopicA'"),
    ([Message("TopicA", b"a"), Message("TopicA", b"")], "^batch item 1: message to topic 'TopicA' has an empty body"),
    ([Message("TopicA", b"a"), "x"], "^batch item 1: expected a Message, got str"),
    ([Message("TopicA", b"a", flag=2**31)], r"^batch item 0: flag 2147483648 is out of range"),
    ([Message("TopicA", b"a", properties={"TAGS": "t"})], "^batch item 0: property name 'TAGS' is reserved.*Message field"),
    ([Message("TopicA", b"a", properties={"k\x01": "v"})], r"^batch item 0: property 'k\\x01': the name contains the separator"),
    ([Message("TopicA", b"a", properties={"k": "v\x02"})], r"^batch item 0: property 'k': the value contains the separator"),
    ([Message("TopicA", b"a", properties={"": "v"})], "^batch item 0: property name '' is empty"),
    ([Message("TopicA", b"a", properties={1: "v"})], "^batch item 0: property name 1 must be a str"),
    ([Message("TopicA", b"a", properties={"k": "\ud800"})], "^batch item 0: property 'k' is not encodable as UTF-8"),
    ([Message("TopicA", b"a", tags="x" * 40000)], "^batch item 0: properties are 400.. bytes, more than 32767"),
    ([Message("TopicA", b"a", delay_time_level=3)], r"^batch item 0: delay messages are not supported in a batch"),
    ([Message("%RETRY%G", b"a")], "retry topic '%RETRY%G' is not supported in a batch"),
    ([Message("bad topic", b"a")], "bad topic name 'bad topic'"),
    ([Message("TopicA", b"a" * 2000)], "^batch item 0: message body of 2000 bytes to topic 'TopicA' exceeds max_message_size 1024"),
    ([Message("TopicA", b"a" * 600), Message("TopicA", b"b" * 600)], "^batch of 2 messages is 1.* bytes encoded, more than max_message_size 1024"),
])
def test_bad_batches_fail_naming_item_and_value(msgs, error):
    for encode in (lambda: native(msgs, 1024), lambda: encode_batch_py(msgs, 1024)):
        with pytest.raises(IllegalArgumentError, match=error):
            encode()


def test_producer_encodes_natively_with_the_outer_message():
    p = Producer("PG_BATCH_NATIVE", namesrv="127.0.0.1:9876")
    msgs = [Message("TopicA", b"m%d" % i, wait_store_msg_ok=False) for i in range(3)]
    topic, uniq, body, outer, outer_props = p._encode_batch(msgs)
    assert (topic, outer.topic, outer.wait_store_msg_ok, outer_props) == ("TopicA", "TopicA", False, {"WAIT": "false"})
    assert [b for _, b, _ in decode_batch_body_py(body)] == [b"m0", b"m1", b"m2"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_a_lone_item_is_what_a_batch_of_one_holds(msgs):
    """encode_batch_item (auto_batch's per-send encoding) against encode_batch([message]): the
    same bytes and UNIQ_KEY, the same error without the item index."""
    m = msgs[0]
    got = outcome(lambda: encode_batch_item(m, 600, Message, _RESERVED_PROPERTIES, check_send_topic,
                                            MessageClientIDSetter.create_uniq_id))
    if got[0] == "ok":
        assert got[1] == twin([m], [got[1][1]], 600)
    else:
        kind, want = outcome(lambda: native([m], 600))
        assert kind == "error"
        if want.startswith("batch of 1 messages is "):  # the size limit, said of the lone message
            assert re.fullmatch(f"message to topic {re.escape(repr(m.topic))} is \\d+ bytes encoded, more than "
                                f"max_message_size 600", got[1])
        else:
            assert want in (got[1], "batch item 0: " + got[1])
