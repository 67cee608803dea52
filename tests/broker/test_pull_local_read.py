"""A pull's local read: rmq's own reader on the broker's host (a loopback peer) asking with
localRead=true is answered where the records lie in the commit-log files (localRecordRuns)
instead of the records; those byte ranges are exactly the records a pull over the connection
carries.  Other clients, other hosts and pullLocalReadEnable=false get the records."""
import pytest

from rmq_core.broker.processors.pull import LOCAL_READ, LOCAL_RECORD_RUNS, is_loopback_peer
from rmq_core.codec import decode_messages

LOCAL = {LOCAL_READ: "true"}


def read_runs(text: str) -> bytes:
    """The records a localRecordRuns names, read from the files as a reader does."""
    out = b""
    for line in text.split("\n"):
        nums, _, path = line.partition("\t")
        file_from, *runs = (int(x) for x in nums.split(","))
        assert file_from == int(path.rsplit("/", 1)[1])  # (a segment is named by its first offset)
        assert path.startswith("/") and len(runs) % 2 == 0 and runs
        with open(path, "rb") as f:
            for start, end in zip(runs[::2], runs[1::2]):
                f.seek(start)
                out += f.read(end - start)
    return out


def test_a_local_read_names_exactly_the_records_a_pull_carries(cluster, raw):
    addr = cluster.broker_addr
    for i in range(12):  # (two queues written in turn: a queue's records are not back to back)
        assert raw.send(addr, "TLocal", b"body-%d" % i, tags="TagA" if i % 3 else "TagB", queue_id=i % 2).code == 0
    for sub in ("*", "TagA"):
        for q in (0, 1):
            over_socket = raw.pull(addr, "TLocal", q, 0, sub=sub, language="PYTHON")
            local = raw.pull(addr, "TLocal", q, 0, sub=sub, language="PYTHON", extra=LOCAL)
            assert over_socket.code == local.code == 0
            assert not local.body and LOCAL_RECORD_RUNS not in over_socket.ext_fields
            assert read_runs(local.ext_fields[LOCAL_RECORD_RUNS]) == over_socket.body
            assert local.ext_fields["nextBeginOffset"] == over_socket.ext_fields["nextBeginOffset"]
            assert len(local.ext_fields[LOCAL_RECORD_RUNS].split("\t")[0].split(",")) > 3  # several runs
    tagged = raw.pull(addr, "TLocal", 0, 0, sub="TagA", language="PYTHON", extra=LOCAL)
    assert [m.body for m in decode_messages(read_runs(tagged.ext_fields[LOCAL_RECORD_RUNS]))] == \
        [b"body-%d" % i for i in range(0, 12, 2) if i % 3]
    # nothing to read: the usual answer
    assert raw.pull(addr, "TLocal", 0, 6, language="PYTHON", extra=LOCAL).code != 0


def test_other_clients_and_pull_local_read_enable_false_get_the_records(make_cluster, raw):
    cluster = make_cluster()
    addr = cluster.broker_addr
    for i in range(3):
        assert raw.send(addr, "TLocal2", b"b%d" % i).code == 0
    plain = raw.pull(addr, "TLocal2", 0, 0, language="PYTHON")
    java = raw.pull(addr, "TLocal2", 0, 0, language="JAVA", extra=LOCAL)  # (a 4.x client: not one of ours)
    assert LOCAL_RECORD_RUNS not in java.ext_fields and java.body == plain.body
    cluster.broker.broker_config.pull_local_read_enable = False  # (a runtime key: read at each pull)
    off = raw.pull(addr, "TLocal2", 0, 0, language="PYTHON", extra=LOCAL)
    assert LOCAL_RECORD_RUNS not in off.ext_fields and off.body == plain.body


@pytest.mark.parametrize("peer, local", [
    ("127.0.0.1:40000", True), ("127.8.9.10:1", True), ("[::1]:40000", True), ("10.1.2.3:40000", False),
    ("[fe80::1]:5", False), ("inproc://rmq-1", False), ("?", False), ("", False),
])
def test_only_a_loopback_peer_is_on_this_host(peer, local):
    assert is_loopback_peer(peer) is local
