"""The checkpoint / ack record encoders (rmq_core.broker.pop.receipt writes the text itself) against
the oracle they stand for: fastjson.dumps of the record's dict, byte for byte, and json.loads of
the record giving that dict back (what recovery reads)."""
from __future__ import annotations

import itertools
import json

import pytest

from rmq_core.broker.pop.receipt import encode_ack, encode_ck
from rmq_core.common import fastjson

OFFSETS = [[], [7], [5, 6, 7], [5, 9, 12], list(range(10, 42)), list(range(2**40, 2**40 + 33)), [3, 4, 6]]
NAMES = ["CG_1", 'g"q\\ü\n\x01', "%RETRY%CG_1_T"]


@pytest.mark.parametrize("offsets", OFFSETS)
@pytest.mark.parametrize("fifo,end", [(False, None), (False, 99), (True, None), (True, 2**40 + 40)])
def test_checkpoint_record_is_the_fastjson_text_of_its_dict(offsets, fifo, end):
    for group, topic, broker in itertools.product(NAMES, NAMES, ["broker-a", "b ü"]):
        start = offsets[0] - (1 if len(offsets) == 3 else 0) if offsets else 5  # (also a start before the first)
        attempts = [i % 4 + 1 for i in range(len(offsets))]
        rec = {"c": group, "t": topic, "q": 3, "so": start, "d": [o - start for o in offsets], "pt": 1_700_000_000_123,
               "it": 30_000, "bn": broker}
        if fifo:
            rec.update(o=1, a=attempts)
        if end is not None:
            rec["e"] = end
        got = encode_ck(group=group, topic=topic, queue_id=3, start_offset=start, offsets=offsets,
                        pop_time=1_700_000_000_123, invisible_ms=30_000, broker_name=broker, fifo=fifo,
                        attempts=attempts if fifo else None, end_offset=end)
        assert got == fastjson.dumps(rec)
        assert json.loads(got) == rec


@pytest.mark.parametrize("offsets", OFFSETS)
@pytest.mark.parametrize("revived", [False, True])
def test_ack_record_is_the_fastjson_text_of_its_dict(offsets, revived):
    for group, topic in itertools.product(NAMES, NAMES):
        rec = {"c": group, "t": topic, "q": 0, "so": 4, "pt": 1_700_000_000_123, "ao": offsets, "bn": "broker-a"}
        if revived:
            rec["r"] = 1
        got = encode_ack(group=group, topic=topic, queue_id=0, start_offset=4, pop_time=1_700_000_000_123,
                         offsets=tuple(offsets), broker_name="broker-a", revived=revived)
        assert got == fastjson.dumps(rec)
        assert json.loads(got) == rec
