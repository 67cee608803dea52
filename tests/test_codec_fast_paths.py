"""The decoder's fast paths.

* Properties: records shaped like a recent one (same names, same order) are built from a template
  dict with only the changed values set.  Every result must equal the pure-Python oracle exactly,
  whatever mix of layouts, values and malformed pieces comes along.
* Memory: the list decode_messages returns is not tracked by the cyclic GC; every way of making
  and dropping a MessageExt must still free it.
"""
import gc
import pickle
import sys
import weakref

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core.codec import MessageExt, decode_messages, string_to_properties
from tests.codec_oracle import encode_message_record, string_to_properties_py

NAMES = ["UNIQ_KEY", "TAGS", "KEYS", "WAIT", "MSG_REGION", "TRACE_ON", "k", "ключ", "TAGSX", "TAG"]

# Values mix ASCII, multi-byte UTF-8, invalid UTF-8, the name separator \x01 (legal inside a value)
# and prefixes of one another, so template comparisons see every kind of near miss.
_value_bytes = st.one_of(
    st.sampled_from([b"", b"a", b"ab", b"abc", b"abcd", b"true", b"Tag1", b"Tag2", b"x\x01y",
                     b"\xe6\xb6\x88", b"\xff", b"0100007F0000A7E900007ABB00000001"]),
    st.text(max_size=40).map(lambda t: t.replace("\x02", "").encode()),
    st.binary(max_size=20).map(lambda b: b.replace(b"\x02", b"")),
)


@st.composite
def layouts(draw):
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    return [n.encode() for n in names]


@st.composite
def blobs(draw, layout):
    parts = [name + b"\x01" + draw(_value_bytes) for name in layout]
    blob = b"\x02".join(parts)
    if draw(st.booleans()):
        blob += b"\x02"  # the trailing separator is optional on the wire
    mutation = draw(st.sampled_from(["none"] * 6 + ["extra", "empty", "nameless", "dup", "cut", "drop"]))
    if mutation == "extra":
        blob += b"\x02EXTRA\x01v"
    elif mutation == "empty":
        blob = b"\x02" + blob
    elif mutation == "nameless":
        blob = b"\x01v\x02" + blob
    elif mutation == "dup":
        blob += b"\x02" + layout[0] + b"\x01again"
    elif mutation == "cut" and blob:
        blob = blob[:draw(st.integers(0, len(blob) - 1))]
    elif mutation == "drop" and len(parts) > 1:
        blob = b"\x02".join(parts[1:])
    return blob


@st.composite
def pulls(draw):
    shapes = draw(st.lists(layouts(), min_size=1, max_size=3))
    return [draw(blobs(draw(st.sampled_from(shapes)))) for _ in range(draw(st.integers(1, 25)))]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pulls())
def test_repeated_layouts_parse_exactly_like_the_oracle(blob_list):
    # Twice through: the first pass builds shapes, the second runs every blob through them.
    for _ in range(2):
        for blob in blob_list:
            assert string_to_properties(blob) == string_to_properties_py(blob), blob


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts(), st.data())
def test_pulled_records_of_one_layout_decode_exactly_like_the_oracle(layout, data):
    names = [n.decode() for n in layout]
    values = st.text(max_size=12).map(lambda t: t.replace("\x02", ""))
    props = [dict(zip(names, data.draw(st.lists(values, min_size=len(names), max_size=len(names)))))
             for _ in range(data.draw(st.integers(2, 12)))]
    buf = b"".join(encode_message_record(topic="T", body=b"", properties=p) for p in props)
    for _ in range(2):
        assert [m.properties for m in decode_messages(buf)] == props


def test_results_are_independent_dicts():
    blob = b"UNIQ_KEY\x01id-1\x02TAGS\x01A\x02WAIT\x01true\x02"
    first = [string_to_properties(blob) for _ in range(4)]  # the layout becomes a shape on the way
    first[-1]["TAGS"] = "changed"
    first[-1]["NEW"] = "x"
    del first[-1]["WAIT"]
    again = string_to_properties(blob)
    assert again == {"UNIQ_KEY": "id-1", "TAGS": "A", "WAIT": "true"}
    assert again is not first[-1] and again is not first[-2]
    assert first[-2] == again


def test_template_near_misses():
    base = b"UNIQ_KEY\x01abc\x02TAGS\x01T\x02"
    cases = [
        base,
        b"UNIQ_KEY\x01abcd\x02TAGS\x01T\x02",  # value longer than the template's
        b"UNIQ_KEY\x01ab\x02TAGS\x01T\x02",  # shorter
        b"UNIQ_KEY\x01abd\x02TAGS\x01T\x02",  # last byte differs
        b"UNIQ_KEY\x01abc\x01\x02TAGS\x01T\x02",  # value gains a \x01
        b"UNIQ_KEY\x01abc\x02TAGS\x01T",  # no trailing separator
        b"UNIQ_KEY\x01abc\x02TAGS\x01",  # empty last value, no separator
        b"UNIQ_KEY\x01abc\x02TAGS",  # last pair lost its \x01: dropped
        b"UNIQ_KEZ\x01abc\x02TAGS\x01T\x02",  # name differs in its last byte
        b"UNIQ_KE\x01abc\x02TAGS\x01T\x02",  # name is a prefix
        b"UNIQ_KEY\x01abc\x02TAGS\x01T\x02\x02",  # an empty piece at the end
        b"UNIQ_KEY\x01abc\x02TAGS\x01T\x02WAIT\x01true\x02",  # one more pair
        b"UNIQ_KEY\x01abc\x02\x02TAGS\x01T\x02",  # an empty piece between pairs
        b"UNIQ_KEY\x01\xe6\xb6\x88\x02TAGS\x01\xff\x02",  # non-ASCII and invalid UTF-8 values
    ]
    for _ in range(3):
        for blob in [base, base] + cases:
            assert string_to_properties(blob) == string_to_properties_py(blob), blob


def test_layouts_whose_names_never_repeat_still_parse():
    # No shape is built for layouts seen once; each must still parse right.
    for i in range(200):
        blob = f"id-{i}\x01{i}\x02common\x01c\x02".encode()
        assert string_to_properties(blob) == {f"id-{i}": str(i), "common": "c"}


def _pull_buffer(n):
    return b"".join(encode_message_record(topic="T", body=bytes([i % 256]) * 100, queue_offset=i,
                                          properties={"UNIQ_KEY": f"{i:032d}", "TAGS": "A"})
                    for i in range(n))


def test_decoded_list_is_untracked_but_frees_what_it_holds():
    class Held:
        pass

    msgs = decode_messages(_pull_buffer(3))
    assert not gc.is_tracked(msgs)
    assert [m.queue_offset for m in msgs] == [0, 1, 2]
    extra = Held()
    ref = weakref.ref(extra)
    msgs.append(extra)  # still a plain list: appending works, and reference counting frees it
    del extra, msgs
    assert ref() is None


def test_message_ext_churn_through_every_constructor():
    # Decoded, constructed, unpickled and freelist-recycled objects all live and die through the
    # same allocator; run enough of each to go past the freelist both ways.
    buf = b"".join(encode_message_record(topic="T", body=bytes([i % 256]) * 3, queue_offset=i,
                                         properties={"UNIQ_KEY": f"id-{i}", "TAGS": "A"})
                   for i in range(3000))
    for _ in range(3):
        msgs = decode_messages(buf)
        made = [MessageExt(topic="T", body=b"x", queue_offset=i) for i in range(1500)]
        copies = pickle.loads(pickle.dumps(msgs[:1500]))
        assert [m.queue_offset for m in copies] == list(range(1500))
        assert [m.properties["UNIQ_KEY"] for m in copies[:3]] == ["id-0", "id-1", "id-2"]
        assert msgs[2999].body == bytes([2999 % 256]) * 3 and made[7].queue_offset == 7
        del msgs, made, copies
        gc.collect()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)), min_size=1, max_size=80))
def test_rendered_hosts_are_right_through_the_host_cache(hosts):
    # Many addresses share a cache slot; every read must render its own address and port.
    msgs = [MessageExt(born_host=h, store_host=(h[0], 65535 - h[1])) for h in hosts]
    for _ in range(2):
        for m, (ip, port) in zip(msgs, hosts):
            assert m.born_host == f"{ip}:{port}"
            assert m.store_host == f"{ip}:{65535 - port}"


def test_property_getters_read_the_dict_built_once():
    buf = encode_message_record(topic="T", body=b"", properties={
        "UNIQ_KEY": "u-1", "TAGS": "TagA", "KEYS": "k1 k2", "DELAY": "3"})
    m = decode_messages(buf)[0]
    assert (m.tags, m.keys, m.msg_id, m.delay_time_level) == ("TagA", "k1 k2", "u-1", 3)
    m.properties["TAGS"] = "changed"  # the getters see the dict, not the raw bytes
    assert m.tags == "changed" and m.get_property("TAGS") == "changed"
    assert m.get_property("MISSING", "d") == "d" and m.get_property(42) is None


def test_fast_path_keeps_reference_counts_balanced():
    # Values written straight into copied dicts must neither leak nor over-release: the shared
    # names and template values end with the reference counts they started with.
    def blob(i):
        return f"UNIQ_KEY\x01{i:032d}\x02TAGS\x01a-long-tag-value-outside-the-str-cache-{i % 3}\x02WAIT\x01true\x02".encode()

    for i in range(50):
        string_to_properties(blob(i))
    probe = string_to_properties(blob(1))
    name, value = next(iter(probe)), probe["WAIT"]
    before = sys.getrefcount(name), sys.getrefcount(value)
    for i in range(20000):
        string_to_properties(blob(i))
    gc.collect()
    assert (sys.getrefcount(name), sys.getrefcount(value)) == before
