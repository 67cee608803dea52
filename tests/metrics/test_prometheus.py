"""metricsExporterType=PROM on real `rmq namesrv` + `rmq broker` processes: scraped over HTTP
after real sends and consumption, parsed with prometheus_client's parser."""
import logging
import socket
import threading
import urllib.request

import pytest

from rmq_core import ConsumeStatus, LocalTransactionState, Message, Producer, PushConsumer, TransactionProducer
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until
from tests.servers import NamesrvAndBroker, RmqProcess, free_port, write_conf

parser = pytest.importorskip("prometheus_client.parser")


def scrape(port: int) -> dict:
    """{sample name: [(labels, value)]} from GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out: dict = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels) -> float:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == v2 for k, v2 in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {hits} in {samples.get(name)}"
    return hits[0]


@pytest.fixture
def prom_cluster(tmp_path):
    broker_port, ns_port = free_port(), free_port()
    servers = NamesrvAndBroker(tmp_path, broker_props={"metricsExporterType": "PROM",
                                                      "metricsPromExporterPort": broker_port},
                               namesrv_props={"metricsExporterType": "PROM", "metricsPromExporterPort": ns_port})
    servers.metrics_port, servers.ns_metrics_port = broker_port, ns_port
    try:
        yield servers
    finally:
        servers.stop()


def test_messages_in_out_and_lag_scraped_after_real_traffic(prom_cluster):
    ns = prom_cluster.namesrv
    with Producer("PG_METRICS", namesrv=ns, **FAST) as p:
        for i in range(23):
            p.send(Message("MetricsA", f"a{i}".encode() * 10))
        for i in range(7):
            p.send(Message("MetricsB", b"b" * 2000))
        p.send_batch([Message("MetricsB", f"batch{i}".encode()) for i in range(5)])

        got = []
        lock = threading.Lock()

        def listener(msgs):
            with lock:
                got.extend(msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        c = PushConsumer("CG_METRICS", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
        c.subscribe("MetricsA", "*")
        c.register_message_listener(listener)
        c.start()
        try:
            wait_until(lambda: len(got) >= 23, what="23 messages consumed")
            # the committed offsets reach the broker (persisted every 0.5 s here)
            # (the series appears with the group's first committed offset)
            wait_until(lambda: [v for lab, v in scrape(prom_cluster.metrics_port).get("rocketmq_consumer_lag_messages", [])
                                if lab.get("topic") == "MetricsA" and lab.get("consumer_group") == "CG_METRICS"] == [0],
                       what="lag 0 for CG_METRICS")
            m = scrape(prom_cluster.metrics_port)
            assert value(m, "rocketmq_consumer_connections", consumer_group="CG_METRICS",
                         consume_mode="push") == 1
            assert value(m, "rocketmq_producer_connections", language="PYTHON") >= 1
        finally:
            c.shutdown()

    m = scrape(prom_cluster.metrics_port)
    assert value(m, "rocketmq_messages_in_total", topic="MetricsA", cluster="DefaultCluster",
                 node_type="broker", node_id="broker-a") == 23
    assert value(m, "rocketmq_messages_in_total", topic="MetricsB") == 12
    assert value(m, "rocketmq_throughput_in_total", topic="MetricsB") > 7 * 2000
    assert value(m, "rocketmq_messages_out_total", topic="MetricsA", consumer_group="CG_METRICS") == 23
    assert value(m, "rocketmq_throughput_out_total", topic="MetricsA", consumer_group="CG_METRICS") > 23 * 20
    assert value(m, "rocketmq_consumer_lag_messages", topic="MetricsA", consumer_group="CG_METRICS") == 0
    assert value(m, "rocketmq_consumer_lag_latency", topic="MetricsA", consumer_group="CG_METRICS") == 0
    # message sizes: 23 + 12 puts, the 2000-byte bodies above the 1 KiB bucket
    assert value(m, "rocketmq_message_size_count", topic="MetricsA") == 23
    assert value(m, "rocketmq_message_size_bucket", topic="MetricsA", le="1024.0") == 23
    assert value(m, "rocketmq_message_size_bucket", topic="MetricsB", le="1024.0") == 5
    assert value(m, "rocketmq_message_size_bucket", topic="MetricsB", le="4096.0") == 12
    # the sends were timed (the plain ones on the native lane, the batch by dispatch)
    assert value(m, "rocketmq_rpc_latency_count", request_code="send_message_v2", response_code="success") == 30
    assert value(m, "rocketmq_rpc_latency_count", request_code="send_batch_message", response_code="success") == 1
    assert value(m, "rocketmq_rpc_latency_count", request_code="pull_message", response_code="success") >= 1
    assert value(m, "rocketmq_storage_size") > 0
    assert value(m, "rocketmq_storage_flush_behind_bytes") >= 0
    assert value(m, "rocketmq_storage_dispatch_behind_bytes") == 0
    assert "rocketmq_send_to_dlq_messages_total" not in m  # nothing dead-lettered

    # the name server's own endpoint: its request latencies (the broker's registrations among them)
    ns_m = scrape(prom_cluster.ns_metrics_port)
    assert value(ns_m, "rocketmq_rpc_latency_count", request_code="register_broker", response_code="success",
                 node_type="nameserver") >= 1
    assert value(ns_m, "rocketmq_rpc_latency_count", request_code="get_routeinfo_by_topic",
                 response_code="success") >= 1


class _TxListener:
    def execute_local_transaction(self, msg, arg):
        return arg

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def test_dlq_commit_and_rollback_counters(prom_cluster):
    ns = prom_cluster.namesrv
    with Producer("PG_METRICS_DLQ", namesrv=ns, **FAST) as p:
        p.send(Message("MetricsPoison", b"poison"))
    failed = []
    c = PushConsumer("CG_METRICS_DLQ", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     max_reconsume_times=0, **FAST_CONSUMER)  # the first failure dead-letters it
    c.subscribe("MetricsPoison", "*")
    c.register_message_listener(lambda msgs: failed.extend(msgs) or ConsumeStatus.RECONSUME_LATER)
    with c:
        wait_until(lambda: "rocketmq_send_to_dlq_messages_total" in scrape(prom_cluster.metrics_port),
                   what="a message dead-lettered")
    m = scrape(prom_cluster.metrics_port)
    assert value(m, "rocketmq_send_to_dlq_messages_total", topic="MetricsPoison", consumer_group="CG_METRICS_DLQ") == 1

    with TransactionProducer("PG_METRICS_TX", namesrv=ns, transaction_listener=_TxListener(), **FAST) as p:
        for state in (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE,
                      LocalTransactionState.ROLLBACK_MESSAGE):
            p.send_message_in_transaction(Message("MetricsTx", b"tx"), arg=state)

    def ended():  # END_TRANSACTION is oneway: counted once the broker handled it
        m = scrape(prom_cluster.metrics_port)
        return ("rocketmq_rollback_messages_total" in m
                and value(m, "rocketmq_commit_messages_total", topic="MetricsTx") == 2)

    wait_until(ended, what="2 commits and a rollback counted")
    m = scrape(prom_cluster.metrics_port)
    assert value(m, "rocketmq_rollback_messages_total", topic="MetricsTx") == 1
    # as RocketMQ counts them: each half message under its topic when sent, not again at commit
    assert value(m, "rocketmq_messages_in_total", topic="MetricsTx") == 3
    assert value(m, "rocketmq_messages_in_total", topic="MetricsTx", message_type="transaction") == 3

    # the message_type label: a delayed message and plain ones under the same topic
    with Producer("PG_METRICS_TYPES", namesrv=ns, **FAST) as p:
        p.send(Message("MetricsTypes", b"later", delay_time_level=1))
        p.send(Message("MetricsTypes", b"now"))
        p.send(Message("MetricsTypes", b"now"))
    m = scrape(prom_cluster.metrics_port)
    assert value(m, "rocketmq_messages_in_total", topic="MetricsTypes", message_type="delay") == 1
    assert value(m, "rocketmq_messages_in_total", topic="MetricsTypes", message_type="normal") == 2
    assert value(m, "rocketmq_throughput_in_total", topic="MetricsTypes", message_type="delay") > 0


def test_lag_counts_what_a_group_has_not_consumed(tmp_path):
    from rmq_core import standalone
    from rmq_core.broker.metrics import BrokerMetrics

    with standalone(store=str(tmp_path / "store")) as cluster:
        with Producer("PG_LAG", namesrv=cluster.namesrv) as p:
            for i in range(10):
                p.send(Message("LagTopic", b"x"), queue=None)
        broker = cluster.broker
        # a group that committed 4 of the messages of each queue it read
        queues = {}
        for qid in range(8):
            mx = broker.store.get_max_offset_in_queue("LagTopic", qid)
            if mx:
                queues[qid] = mx
                broker.offset_manager.commit_offset(None, "CG_LAG", "LagTopic", qid, 0)
        fams = {f.name: f for f in BrokerMetrics(broker).collect()}
        lag = dict(fams["rocketmq_consumer_lag_messages"].samples)
        key = ("DefaultCluster", "broker", broker.broker_config.broker_name, "LagTopic", "CG_LAG")
        assert lag[key] == 10
        latency = dict(fams["rocketmq_consumer_lag_latency"].samples)
        assert latency[key] >= 0
        for qid, mx in queues.items():
            broker.offset_manager.commit_offset(None, "CG_LAG", "LagTopic", qid, mx)
        fams = {f.name: f for f in BrokerMetrics(broker).collect()}
        assert dict(fams["rocketmq_consumer_lag_messages"].samples)[key] == 0


def test_unknown_exporter_type_stops_the_broker_with_one_line(tmp_path):
    ns_port = free_port()
    ns = RmqProcess(["namesrv", "--listen", f"127.0.0.1:{ns_port}"], ("The Name Server boot success",))
    ns.wait_boot()
    try:
        conf = write_conf(tmp_path / "b.conf", {"listenPort": free_port(), "storePathRootDir": tmp_path / "s",
                                                "metricsExporterType": "STATSD"})
        b = RmqProcess(["broker", "-n", f"127.0.0.1:{ns_port}", "-c", conf, "--listen-host", "127.0.0.1"])
        assert b.proc.wait(60) == 2
        b._reader.join(5)
        err = [l for l in b.lines if "error" in l]
        assert err == ["rmq broker: error: unknown metrics exporter 'STATSD'; available: LOG, PROM"], b.lines

        with socket.socket() as taken:  # the exporter's port in use: one line naming it
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            conf = write_conf(tmp_path / "b2.conf", {"listenPort": free_port(), "storePathRootDir": tmp_path / "s2",
                                                     "metricsExporterType": "PROM", "metricsPromExporterPort": port})
            b = RmqProcess(["broker", "-n", f"127.0.0.1:{ns_port}", "-c", conf, "--listen-host", "127.0.0.1"])
            assert b.proc.wait(60) == 2
            b._reader.join(5)
        err = [l for l in b.lines if "error" in l]
        assert len(err) == 1 and err[0].startswith(
            f"rmq broker: error: metricsExporterType=PROM: cannot listen on 127.0.0.1:{port}: "), b.lines
    finally:
        ns.terminate()


def test_log_exporter_writes_the_snapshot(tmp_path, caplog):
    import gc

    from rmq_core import standalone

    caplog.set_level(logging.INFO, logger="rmq.metrics")
    conf = {"metricsExporterType": "log", "metricsLoggingExporterIntervalInMills": "100"}
    with standalone(store=str(tmp_path / "store"), config=conf) as cluster:
        with Producer("PG_LOGM", namesrv=cluster.namesrv) as p:
            for _ in range(3):
                p.send(Message("LogMetrics", b"x"))
        wait_until(lambda: any('rocketmq_messages_in{cluster="DefaultCluster",node_type="broker",node_id="broker-a",'
                               'topic="LogMetrics",message_type="normal"} 3' in r.getMessage() for r in caplog.records),
                   what="the LOG exporter's line for LogMetrics")
        # a consumer's long-polling pulls are still held when the broker stops (and its exporter
        # with it): they are answered without the timing failing
        c = PushConsumer("CG_LOGM", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
        c.subscribe("LogMetrics", "*")
        c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
        with c:
            wait_until(lambda: cluster.broker.pull_hold_service.held_count() > 0, what="a held pull")
    gc.collect()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_a_broker_without_metrics_times_nothing(tmp_path):
    """metricsExporterType=DISABLE (the default): no timed dispatch and no size histogram, so the
    send and pull paths pay nothing for metrics."""
    import rmq_core

    with rmq_core.standalone(store=str(tmp_path / "store"), config={"mappedFileSizeCommitLog": 4 << 20}) as cluster:
        broker = cluster.broker
        assert broker.servers and all(s._table.rpc_latency is None for s in broker.servers)
        assert all("dispatch" not in vars(s._table) for s in broker.servers)
        assert broker.metrics.exporter is None
