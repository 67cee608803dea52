"""The commit-log record layout has one definition (rmq_core/_native/record_layout.pxd): Python
readers get every one of its names through rmq_core.record_layout (exported by the native module
rmq_core._native.layout), the native encoder puts the fields where those say, and no other file
defines the magic codes or the host-v6 flags."""
import re
import subprocess
from pathlib import Path

import pytest

from rmq_core import record_layout as layout
from rmq_core._native.record import decode_messages, host_bytes, offset_msg_id
from rmq_core._native.record_store import encode_record
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import create_offset_msg_id

REPO = Path(__file__).resolve().parents[1]
PXD = REPO / "rmq_core" / "_native" / "record_layout.pxd"


def pxd_constants() -> dict[str, int]:
    """The `NAME = value` lines of the .pxd (enum members, and the magic codes' comment lines)."""
    found = {}
    for m in re.finditer(r"^\s*#?\s*([A-Z][A-Z0-9_]+) = (0x[0-9A-Fa-f]+|\d+)\b", PXD.read_text(), re.M):
        found[m.group(1)] = int(m.group(2), 0)
    return found


def test_python_readers_get_every_name_of_the_pxd():
    pxd = pxd_constants()
    exported = {n: v for n, v in vars(layout).items() if n.isupper()}
    assert len(pxd) > 30
    assert exported == pxd


@pytest.mark.parametrize("born, store", [("10.0.0.1:1", "10.0.0.2:2"), ("[::1]:3", "10.0.0.2:4"),
                                         ("10.0.0.1:5", "[fe80::2]:6"), ("[::1]:7", "[::2]:8")])
def test_native_encoder_puts_fields_where_the_layout_says(born, store):
    rec = encode_record("T", b"body", queue_id=3, flag=9, queue_offset=11, commit_log_offset=4096, sys_flag=0x4,
                        born_timestamp=1234, born_host=born, store_timestamp=5678, store_host=store,
                        reconsume_times=2, prepared_transaction_offset=77, properties={"TAGS": "a"})
    i32 = lambda at: int.from_bytes(rec[at:at + 4], "big", signed=True)  # noqa: E731
    i64 = lambda at: int.from_bytes(rec[at:at + 8], "big", signed=True)  # noqa: E731
    sys_flag = i32(layout.SYS_FLAG_AT)
    assert sys_flag & layout.TRANSACTION_MASK == layout.TRANSACTION_PREPARED_TYPE
    assert bool(sys_flag & layout.BORNHOST_V6) == born.startswith("[")
    assert bool(sys_flag & layout.STOREHOST_V6) == store.startswith("[")
    assert i32(layout.TOTAL_SIZE_AT) == len(rec)
    assert rec[layout.MAGIC_CODE_AT:layout.MAGIC_CODE_AT + 4] == layout.MESSAGE_MAGIC_CODE.to_bytes(4, "big")
    assert (i32(layout.QUEUE_ID_AT), i32(layout.FLAG_AT)) == (3, 9)
    assert (i64(layout.QUEUE_OFFSET_AT), i64(layout.PHYSICAL_OFFSET_AT)) == (11, 4096)
    assert i64(layout.BORN_TIMESTAMP_AT) == 1234
    born_b, store_b = host_bytes(born), host_bytes(store)
    assert rec[layout.BORN_HOST_AT:layout.BORN_HOST_AT + layout.born_host_len(sys_flag)] == born_b
    assert i64(layout.store_timestamp_at(sys_flag)) == 5678
    at = layout.store_host_at(sys_flag)
    assert rec[at:at + layout.store_host_len(sys_flag)] == store_b
    assert (i32(layout.reconsume_times_at(sys_flag)), i64(layout.reconsume_times_at(sys_flag) + 4)) == (2, 77)
    assert i32(layout.body_length_at(sys_flag)) == 4
    assert len(rec) == (layout.RECORD_FIXED_V4 + len(born_b) + len(store_b) - 2 * layout.HOST_V4_LEN
                        + len(b"body") + len(b"T") + len(b"TAGS\x01a\x02"))
    (m,) = decode_messages(rec)
    assert (m.topic, m.body, m.tags, m.sys_flag, m.queue_offset) == ("T", b"body", "a", sys_flag, 11)
    # the offsetMsgId is the store host as the record holds it, then the offset (IPv6 too)
    assert m.offset_msg_id == offset_msg_id(store_b, 4096) == (store_b + (4096).to_bytes(8, "big")).hex().upper()
    host, _, port = store.rpartition(":")
    assert create_offset_msg_id(host.strip("[]"), int(port), 4096) == m.offset_msg_id


def test_one_host_rule_and_a_clear_error():
    assert host_bytes(("127.0.0.1", 10911)) == host_bytes("127.0.0.1:10911") == bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])
    assert host_bytes("[::1]:1") == host_bytes("::1:1") == bytes(15) + b"\x01" + b"\x00\x00\x00\x01"
    assert host_bytes(None) == host_bytes("") == bytes(8)
    for bad, why in [("localhost:1", "not an IPv4 or IPv6 address"), ("1.2.3.4", "expected ip:port"),
                     ("1.2.3.4:70000", "out of 0..65535"), ("1.2.3.4:x", "not a number")]:
        with pytest.raises(IllegalArgumentError, match=f"bad store host {re.escape(repr(bad))}: .*{why}"):
            encode_record("T", b"", store_host=bad)
    with pytest.raises(IllegalArgumentError, match="store host of 7 bytes"):
        offset_msg_id(bytes(7), 0)


def test_no_other_file_defines_the_layout_constants():
    """The magic codes and host-v6 flags are given values only in the .pxd (prose may name them;
    tests may spell them out to check the bytes)."""
    files = subprocess.run(["git", "ls-files", "rmq_core", "plugins", "spark_plugin"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    owners = {"rmq_core/_native/record_layout.pxd"}
    # a magic code written as a value (assigned, passed, compared), a v6 flag given a value
    pattern = re.compile(r"([=(,]|==|!=) *(<\w+> *)?0x(DAA320A7|CBD43194)|V6\w* *= *0x[12]0\b|\bDEF \w*V6")
    offenders = []
    for name in files:
        if name in owners or not name.endswith((".py", ".pyx", ".pxd", ".h")):
            continue
        for n, line in enumerate((REPO / name).read_text().splitlines(), 1):
            if pattern.search(line.split("#")[0] if name.endswith((".py", ".pyx", ".pxd")) else line):
                offenders.append(f"{name}:{n}: {line.strip()}")
    assert offenders == []
