"""The JVM reader's local read: on the broker's host its pulls are answered where the records lie
in the commit-log files and it copies them out of the mapped files itself.  Reads are exact
whichever way the records came, and a reader that cannot use the files it is named (gone, or not
the broker's: a record's physical offset does not match) pulls over the connection instead.
The broker is in this process, so a request step sees (and here spoils) every pull answer."""
import threading

import pytest

import spark_plugin
from rmq_core.broker.processors.pull import LOCAL_READ, LOCAL_RECORD_RUNS
from rmq_core.remoting import RequestStep
from rmq_core.remoting.codes import RequestCode
from tests.spark.conftest import wait_until

pytestmark = pytest.mark.skipif(spark_plugin.jar_path() is None, reason="rmq-spark.jar not built (no JDK at build time)")

TOPIC = "LocalReadTopic"


class PullAnswers(RequestStep):
    """Counts pull answers with messages by how they came; `spoil` rewrites a local answer."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spoil = None
        self.reset()

    def reset(self):
        self.local = self.over_socket = self.asked_local = 0

    def after(self, remote_addr, request, response, connection=None):
        if request.code != RequestCode.PULL_MESSAGE or response is None or response.code != 0:
            return
        with self.lock:
            self.asked_local += request.ext_fields.get(LOCAL_READ) == "true"
            runs = response.ext_fields.get(LOCAL_RECORD_RUNS)
            if runs is None:
                self.over_socket += bool(response.body)
                return
            self.local += 1
            if self.spoil is not None:
                response.ext_fields[LOCAL_RECORD_RUNS] = self.spoil(runs)


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    from rmq_core import Message, Producer
    from rmq_core.embedded import Cluster
    from tests.rawclient import RawClient

    step = PullAnswers()
    c = Cluster(str(tmp_path_factory.mktemp("local-read") / "store"),
                {"mappedFileSizeCommitLog": str(4 * 1024 * 1024), "registerNameServerPeriod": "1000"},
                request_steps=[step])
    c.start()
    try:
        raw = RawClient("local-read")
        try:
            assert raw.invoke(c.broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": TOPIC, "readQueueNums": "2", "writeQueueNums": "2", "perm": "6"}).code == 0
            c.call(c.broker.register_broker_all())
            wait_until(lambda: raw.route(c.tcp_namesrv, TOPIC)[0].code == 0, what="the topic's route")
        finally:
            raw.close()
        sent = {}
        with Producer("PG_local_read", namesrv=c.tcp_namesrv, compress_type="lz4") as p:
            for mq in p.fetch_publish_message_queues(TOPIC):
                for i in range(150):  # (sent one by one, the two queues in turn: runs of one record each)
                    body = b"%d-%d-" % (mq.queue_id, i) * (700 if i % 10 == 0 else 1)  # (some compressed)
                    r = p.send(Message(TOPIC, body, tags="TagA" if i % 2 else "TagB", keys=f"k{i}"), queue=mq)
                    sent[(mq.queue_id, r.queue_offset)] = (body, "TagA" if i % 2 else "TagB", f"k{i}")
        yield c, step, sent
    finally:
        c.stop()


def _read_exact(spark, c, sent):
    rows = spark.read.format("rmq").option("namesrv", c.tcp_namesrv).option("topic", TOPIC).load().collect()
    assert len(rows) == len(sent)
    for r in rows:
        assert (bytes(r.body), r.tags, r.keys) == sent[(r.queue_id, r.queue_offset)]
    tagged = spark.read.format("rmq").option("namesrv", c.tcp_namesrv).option("topic", TOPIC).load() \
        .filter("tags = 'TagA'").select("body").collect()
    assert sorted(bytes(r.body) for r in tagged) == sorted(b for b, t, _ in sent.values() if t == "TagA")


def test_on_the_brokers_host_the_reader_reads_the_commit_log_files(spark, local_cluster):
    c, step, sent = local_cluster
    step.reset()
    step.spoil = None
    _read_exact(spark, c, sent)
    assert step.local > 0 and step.over_socket == 0


@pytest.mark.parametrize("spoil", ["missing file", "not the broker's records"])
def test_files_the_reader_cannot_use_mean_pulls_over_the_connection(spark, local_cluster, tmp_path, spoil):
    c, step, sent = local_cluster
    if spoil == "missing file":
        step.spoil = lambda runs: "\n".join(line.split("\t")[0] + "\t" + str(tmp_path / "gone") for line in runs.split("\n"))
    else:  # the right file, read one record further on: its physical offsets do not match
        def shifted(runs):
            out = []
            for line in runs.split("\n"):
                nums, _, path = line.partition("\t")
                first, *rest = nums.split(",")
                out.append(",".join([str(int(first) - 1), *rest]) + "\t" + path)
            return "\n".join(out)
        step.spoil = shifted
    step.reset()
    try:
        _read_exact(spark, c, sent)
    finally:
        step.spoil = None
    # every partition tried once, then pulled the rest over the connection without asking again
    assert step.local > 0 and step.over_socket > 0 and step.asked_local == step.local


def test_pull_local_read_enable_false_sends_the_records(spark, local_cluster):
    c, step, sent = local_cluster
    step.reset()
    c.broker.broker_config.pull_local_read_enable = False
    try:
        _read_exact(spark, c, sent)
    finally:
        c.broker.broker_config.pull_local_read_enable = True
    assert step.local == 0 and step.over_socket > 0
