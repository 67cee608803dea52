"""The official C++ client (rocketmq==0.4.4) reading a broker group whose master is gone: a master
and its slave (`rmq broker` each), the master SIGKILLed, and the C++ push consumer gets every
message from the slave, which keeps the offsets it commits."""
import json

import pytest

from rmq_core.remoting.codes import ResponseCode
from tests.broker.ha_cluster import TOPIC, consumer_offsets, kill_master, queue_ends, running_group
from tests.broker.ha_group import wait_replicated
from tests.client.conftest import wait_until
from tests.compat.test_cpp_client import Driver, _msgs, produce

pytestmark = pytest.mark.compat
pytest.importorskip("rocketmq.client", reason="the official C++ client (rocketmq==0.4.4) is a dev dependency")

GROUP = "CID_CPP_HA"


def test_cpp_consumer_reads_from_the_slave_with_the_master_gone(tmp_path):
    with running_group(tmp_path) as (g, raw):
        sent = _msgs("ha", 20)
        results = produce(tmp_path / "p", g.namesrv, TOPIC, sent)
        assert all(r["status"] == 0 for r in results)
        wait_replicated(g.master_store, g.slave_store)
        kill_master(g, raw)

        c = Driver(tmp_path / "c", "consume", g.namesrv, TOPIC, GROUP, "*", "CLUSTERING", len(sent), 60)
        c.wait(lambda items: len([i for i in items if "body" in i]) >= len(sent), 60)
        c.proc.terminate()  # a clean shutdown persists the offsets (to the slave: the master is gone)
        c.finish(30)
        assert sorted(m["body"] for m in c.messages()) == sorted(m["body"] for m in sent), c.stderr_tail()
        ends = queue_ends(raw, g.slave_addr)
        assert consumer_offsets(raw, g.slave_addr, GROUP) == ends
        wait_until(lambda: _persisted_received(g.slave_store) == dict(enumerate(ends)), 30,
                   what="the slave persisting the offsets it received")
        assert raw.send(g.slave_addr, TOPIC, b"x").code == ResponseCode.SERVICE_NOT_AVAILABLE


def _persisted_received(store) -> dict:
    try:
        with open(store / "config" / "consumerOffset.json") as f:
            table = json.load(f).get("offsetTableReceivedBySlave", {}).get(f"{TOPIC}@{GROUP}", {})
    except (OSError, ValueError):
        return {}
    return {int(q): o for q, o in table.items()}
