"""Helpers of the replication tests beyond the store (roles, failover, consumers, operations):
a running master + slave group (tests.broker.ha_group) with its topic, and what they ask of it."""
from __future__ import annotations

import contextlib

from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.broker.ha_group import HAGroup
from tests.client.conftest import wait_until
from tests.rawclient import RawClient

TOPIC, QUEUES = "HaFailoverTopic", 4


@contextlib.contextmanager
def running_group(tmp_path, **kw):
    """(HAGroup, RawClient): namesrv, master and slave started, TOPIC created on the master (the
    slave copies it); everything stopped at the end."""
    g = HAGroup(tmp_path, **kw)
    raw = RawClient()
    try:
        g.start_master()
        g.start_slave()
        create_topic(raw, g.master_addr)
        yield g, raw
    finally:
        raw.close()
        g.stop()


def create_topic(raw, addr, topic=TOPIC):
    r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                   {"topic": topic, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"})
    assert r.code == ResponseCode.SUCCESS, r.remark


def kill_master(g, raw) -> None:
    """SIGKILL the master; returns once the name server's route has only the slave."""
    g.master.kill()
    wait_until(lambda: len(raw.route(g.namesrv, TOPIC)[1]["brokerDatas"][0]["brokerAddrs"]) == 1, 30,
               what="the name server dropping the master")


def consumer_offsets(raw, addr, group, topic=TOPIC) -> list[int]:
    """The group's committed offset of each queue on `addr` (-1: none)."""
    out = []
    for q in range(QUEUES):
        r = raw.invoke(addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": str(q)})
        out.append(int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else -1)
    return out


def queue_ends(raw, addr, topic=TOPIC) -> list[int]:
    return [int(raw.invoke(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(q)}).ext_fields["offset"])
            for q in range(QUEUES)]
