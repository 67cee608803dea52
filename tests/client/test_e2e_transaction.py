"""Transactional messages: commit, rollback, and UNKNOW resolved by the broker's check-back.
(The broker here checks every 200 ms once a half message is 2 s old.)"""
import threading

import pytest

from rmq_core import ConsumeStatus, Message, PushConsumer, TransactionProducer
from rmq_core.errors import ConfigError
from rmq_core.message import LocalTransactionState, SendStatus
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until

# 2 s before a half is checked: long enough that a loaded CI machine delivers the explicit
# END_TRANSACTION of the committed and rolled-back halves first (else those would be checked too).
TX_BROKER = {"transactionTimeOut": "2000", "transactionCheckInterval": "200", "transactionCheckMax": "5"}


class Listener:
    def __init__(self):
        self.checked = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, arg):
        return arg

    def check_local_transaction(self, msg):
        with self.lock:
            self.checked.append(msg.body)
        return LocalTransactionState.COMMIT_MESSAGE


def test_commit_rollback_and_check_back(make_cluster):
    cluster = make_cluster(TX_BROKER)
    listener = Listener()
    got = []
    c = PushConsumer("CG_TX", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    c.subscribe("TxTopic", "*")
    c.register_message_listener(lambda msgs: (got.extend(m.body for m in msgs), ConsumeStatus.CONSUME_SUCCESS)[1])
    with TransactionProducer("PG_TX", namesrv=cluster.namesrv, transaction_listener=listener, **FAST) as p:
        r1 = p.send_message_in_transaction(Message("TxTopic", b"commit"), arg=LocalTransactionState.COMMIT_MESSAGE)
        r2 = p.send_message_in_transaction(Message("TxTopic", b"rollback"), arg=LocalTransactionState.ROLLBACK_MESSAGE)
        r3 = p.send_message_in_transaction(Message("TxTopic", b"unknown"), arg=LocalTransactionState.UNKNOW)
        assert r1.status is SendStatus.SEND_OK and r1.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        assert r2.local_transaction_state is LocalTransactionState.ROLLBACK_MESSAGE
        assert r3.local_transaction_state is LocalTransactionState.UNKNOW
        with c:
            wait_until(lambda: b"commit" in got and b"unknown" in got, timeout=20,
                       what="the committed and the checked-back messages")
            assert listener.checked and set(listener.checked) == {b"unknown"}
    assert b"rollback" not in got
    assert sorted(got) == [b"commit", b"unknown"]


def test_transaction_listener_is_validated(cluster):
    with pytest.raises(ConfigError, match="has no execute_local_transaction"):
        TransactionProducer("PG_TXV", namesrv=cluster.namesrv, transaction_listener=object())
