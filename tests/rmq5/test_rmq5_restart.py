"""The received-but-unacked state survives a SIGKILL of the broker: Apache's 5.x SimpleConsumer
receives 1,000 messages, acks half, the broker is killed and started again on its store, and
exactly the 500 unacked ones come back - once their invisible time is over, not before."""
from __future__ import annotations

from tests.proxy.conftest import make_topic
from tests.rmq5.conftest import grpc_cluster

INVISIBLE = 8  # the first receive of all 1,000 and the acks take under 1 s: ten times that for a busy machine
AWAIT = 2


def test_sigkilled_broker_redelivers_every_unacked_and_no_acked(tmp_path, rmq5_client):
    topic, group = "Rmq5Kill", "GID_RMQ5_KILL"
    cl = grpc_cluster(tmp_path)
    try:
        make_topic(cl, topic, 4)
        c = rmq5_client(cl.endpoint)
        c.call("simple_consumer", group=group, subscriptions={topic: "*"}, **{"await": AWAIT})
        p = rmq5_client(cl.endpoint)
        p.call("producer", topics=[topic])
        receipts = p.call("send", messages=[{"topic": topic, "body": f"kill-{i}", "keys": [f"k{i}"]}
                                            for i in range(1000)], timeout=120)["receipts"]
        assert all("message_id" in r for r in receipts)
        p.close()

        first = c.call("drain", count=1000, seconds=60, max=32, invisible=INVISIBLE, ack=False, timeout=90)["messages"]
        assert len(first) == 1000 and len({m["message_id"] for m in first}) == 1000
        acked = first[0::2]
        answer = c.call("ack", refs=[m["ref"] for m in acked], timeout=60)
        assert answer["failed"] == {} and len(answer["acked"]) == 500
        c.close()
        unacked = {m["message_id"]: m for m in first[1::2]}

        cl.brokers[0].kill()  # SIGKILL: nothing written at a clean stop
        cl.restart_broker(0)

        c2 = rmq5_client(cl.endpoint)
        c2.call("simple_consumer", group=group, subscriptions={topic: "*"}, **{"await": AWAIT})
        again = c2.call("drain", count=500, seconds=INVISIBLE + 90, max=32, invisible=60, timeout=INVISIBLE + 120)
        got = again["messages"]
        ids = [m["message_id"] for m in got]
        assert set(ids) == set(unacked), (
            f"{len(set(unacked) - set(ids))} unacked not redelivered, "
            f"{len(set(ids) - set(unacked))} acked ones redelivered; receive errors {again['errors']}")
        assert len(ids) == 500, "a message redelivered twice"
        for m in got:
            before = unacked[m["message_id"]]
            assert m["delivery_attempt"] == 2 and m["body"] == before["body"], m
            assert m["received_ms"] >= before["asked_ms"] + INVISIBLE * 1000, "redelivered before its invisible time"
        # nothing else comes: the acked half stays acked
        assert c2.call("receive", max=32, invisible=60)["messages"] == []
    finally:
        cl.stop()
