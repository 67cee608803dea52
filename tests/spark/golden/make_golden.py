"""Writes the golden pull bodies of tests/spark/test_spark_jvm.py (run once; the .bin files are
committed, so both decoders are held to the same bytes even if the encoders change).

    python -m tests.spark.golden.make_golden
"""
import os
import zlib

import lz4.frame

from rmq_core._native.record_store import encode_batch
from rmq_core.codec import encode_batch_body, encode_message_record
from rmq_core.codec import properties_to_bytes_py as properties_to_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
TOPIC = "GoldenTopic"
BORN, STORED = 1_700_000_000_123, 1_700_000_000_456


def record(i, body, sys_flag=0, props=None, born_host=("127.0.0.1", 40000), store_host=("127.0.0.1", 10911)):
    p = {"TAGS": f"Tag{i % 3}", "KEYS": f"k{i} k{i}b", "UNIQ_KEY": f"UNIQ{i:028d}", "WAIT": "true", "CLUSTER": "c1",
         **(props or {})}
    return encode_message_record(topic=TOPIC, body=body, queue_id=3, queue_offset=100 + i, commit_log_offset=5000 + 300 * i,
                                 sys_flag=sys_flag, born_timestamp=BORN + i, born_host=born_host,
                                 store_timestamp=STORED + i, store_host=store_host, reconsume_times=i % 2,
                                 properties=properties_to_bytes(p))


def bodies():
    big = b"".join(b"%06d rmq golden body " % i for i in range(400))
    out = {
        "plain": b"".join(record(i, f"body-{i}".encode()) for i in range(5)),
        "lz4": b"".join(record(i, lz4.frame.compress(big + bytes([i])), sys_flag=0x101) for i in range(3)),
        "zlib": b"".join(record(i, zlib.compress(big + bytes([i]), 5), sys_flag=0x1) for i in range(3)),
        "properties": b"".join(record(i, b"p", props={"user": f"v{i}", "empty": "", "unicode": "\u6d88\u606f"})
                               for i in range(4)) + encode_message_record(
                                   topic=TOPIC, body=b"no-props", queue_id=3, queue_offset=104, properties=b""),
        "ipv6": b"".join(record(i, b"six", born_host=("::1", 40001), store_host=("fe80::1", 10911)) for i in range(3))
                + encode_message_record(topic=TOPIC, body=b"no-uniq-key-v6", queue_id=3, queue_offset=109,
                                        commit_log_offset=77, store_host=("::1", 10911), properties=b"TAGS\x01X\x02"),
    }
    items = encode_batch_body([(0, f"batch-{i}".encode(), properties_to_bytes({"KEYS": f"bk{i}", "UNIQ_KEY": f"B{i:031d}"}))
                               for i in range(6)])
    store = bytes([127, 0, 0, 1]) + (10911).to_bytes(4, "big")
    born = bytes([127, 0, 0, 1]) + (40000).to_bytes(4, "big")
    records, count, _ = encode_batch(items, TOPIC.encode(), 2, 0, BORN, born, store, 0, b"TAGS\x01Batch\x02", 1 << 22)
    out["batch"] = bytes(records)
    plain = out["plain"]
    out["torn_tail"] = plain + record(9, b"cut-short")[:50]
    return out


if __name__ == "__main__":
    for name, body in bodies().items():
        with open(os.path.join(HERE, f"{name}.bin"), "wb") as f:
            f.write(body)
        print(name, len(body))
