"""The rest of mqadmin's commands against real `rmq namesrv` + `rmq broker` processes, each in
table and --json form with a one-line error for bad input: queryMsgById -g/-d (the message handed
to a live consumer's listener with CONSUME_MESSAGE_DIRECTLY), ..."""
from __future__ import annotations

import threading

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from tests.admin.test_admin_cli import FAST, fails, ok, rows, wait_for
from tests.servers import NamesrvAndBroker

CLIENT = dict(poll_name_server_interval=1.0, heartbeat_broker_interval=1.0, persist_consumer_offset_interval=1.0)


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = NamesrvAndBroker(tmp_path_factory.mktemp("admin-more"), broker_props=FAST)
    try:
        yield c
    finally:
        c.stop()


def test_query_msg_by_id_consumes_directly(cl):
    ns = cl.namesrv
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            seen.extend((m.msg_id, m.topic) for m in msgs)
        if msgs[0].keys == "boom":
            raise ValueError("listener refused boom")
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("CG_DIRECT", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **CLIENT)
    c.subscribe("DirectTopic", "*")
    c.register_message_listener(listener)
    c.start()
    try:
        with Producer("PG_DIRECT", namesrv=ns, **CLIENT) as p:
            good = p.send(Message("DirectTopic", b"hello", keys="fine"))
            bad = p.send(Message("DirectTopic", b"boom", keys="boom"))
        wait_for(lambda: {good.msg_id, bad.msg_id} <= {i for i, _ in seen}, what="both consumed")
        before = len(seen)
        r = rows("queryMsgById", "-i", good.msg_id, "-t", "DirectTopic", "-g", "CG_DIRECT", "-d", c.client_id, ns=ns)
        assert len(r) == 1 and r[0]["consume_result"] == "CR_SUCCESS" and r[0]["order"] is False
        assert r[0]["message_id"] == good.msg_id and r[0]["client_id"] == c.client_id
        with lock:
            assert seen[before:] == [(good.msg_id, "DirectTopic")]  # the listener got it once more
        # by the offset id, table form; a listener that raises is reported with its traceback
        table = ok("queryMsgById", "-i", bad.offset_msg_id, "-g", "CG_DIRECT", "-d", c.client_id, ns=ns)
        assert "CR_THROW_EXCEPTION" in table and "listener refused boom" in table
        fails("queryMsgById", "-i", good.msg_id, "-t", "DirectTopic", "-g", "CG_DIRECT", ns=ns, needle="-d")
        fails("queryMsgById", "-i", good.msg_id, "-t", "DirectTopic", "-g", "CG_DIRECT", "-d", "nobody@1", ns=ns,
              needle="nobody@1")
    finally:
        c.shutdown()
