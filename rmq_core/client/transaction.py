"""TransactionProducer (RocketMQ's TransactionMQProducer): half message, local transaction,
END_TRANSACTION; answers the broker's CHECK_TRANSACTION_STATE with the listener's verdict.

    class Listener:
        def execute_local_transaction(self, msg, arg) -> LocalTransactionState: ...
        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState: ...

    with TransactionProducer("PG_TX", namesrv=..., transaction_listener=Listener()) as p:
        r = p.send_message_in_transaction(Message("T", b"..."), arg=order)
"""
from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

import attrs

from rmq_core.client.producer import CommunicationMode, Producer
from rmq_core.errors import ConfigError, IllegalArgumentError, MQClientError
from rmq_core.message import (
    LocalTransactionState, Message, MessageConst, SendResult, SendStatus, decode_offset_msg_id,
)
from rmq_core.remoting.codes import RequestCode
from rmq_core.remoting.command import RemotingCommand

log = logging.getLogger("rmq.client.transaction")

# END_TRANSACTION commitOrRollback values (the sysFlag transaction types)
_STATE_CODE = {
    LocalTransactionState.COMMIT_MESSAGE: 8,
    LocalTransactionState.ROLLBACK_MESSAGE: 12,
    LocalTransactionState.UNKNOW: 0,
}


@attrs.frozen
class TransactionSendResult:
    send_result: SendResult
    local_transaction_state: LocalTransactionState

    def __getattr__(self, name):  # status, msg_id, queue... read through to the SendResult
        return getattr(self.send_result, name)


def _coerce_state(value) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if value is None:
        return LocalTransactionState.UNKNOW
    try:
        return LocalTransactionState(str(value).upper())
    except ValueError:
        log.warning("transaction listener returned %r; treating it as UNKNOW", value)
        return LocalTransactionState.UNKNOW


class TransactionProducer(Producer):
    def __init__(self, group: str, namesrv=None, *, transaction_listener, check_thread_pool_max: int = 1,
                 **kw):
        super().__init__(group, namesrv, **kw)
        for name in ("execute_local_transaction", "check_local_transaction"):
            if not callable(getattr(transaction_listener, name, None)):
                raise ConfigError(f"transaction_listener {transaction_listener!r} has no {name}() method")
        if check_thread_pool_max < 1:
            raise ConfigError(f"bad check_thread_pool_max {check_thread_pool_max!r}: must be >= 1")
        self.transaction_listener = transaction_listener
        self._check_pool_max = check_thread_pool_max
        self._check_pool: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> "TransactionProducer":
        if self._check_pool is None:
            self._check_pool = concurrent.futures.ThreadPoolExecutor(
                self._check_pool_max, thread_name_prefix=f"rmq-txcheck-{self.group}")
        super().start()
        return self

    def shutdown(self) -> None:
        super().shutdown()
        if self._check_pool is not None:
            self._check_pool.shutdown(wait=True)
            self._check_pool = None

    def send_message_in_transaction(self, msg: Message, arg: Any = None,
                                    timeout: float | None = None) -> TransactionSendResult:
        """Send a half message, run the local transaction, then commit / roll back / leave it to
        the broker's check (UNKNOW)."""
        inst = self._check_started()
        self._check_may_wait()
        if msg.delay_time_level:
            raise IllegalArgumentError("delay messages cannot be transactional (delay_time_level must be 0)")
        props = dict(msg.properties)
        props[MessageConst.TRANSACTION_PREPARED] = "true"
        props[MessageConst.PRODUCER_GROUP] = self.group
        half = Message(msg.topic, msg.body, tags=msg.tags, keys=msg.keys, flag=msg.flag,
                       wait_store_msg_ok=msg.wait_store_msg_ok)
        # the two properties are system keys: set them past the user-property check
        half.properties.update({k: v for k, v in props.items()})
        t = timeout or self.send_msg_timeout
        # (the two system properties are the half message's own: validated with them allowed)
        result = self._wait(self._submit(half, CommunicationMode.SYNC, t, prepared=self._prepare(half, True)), t)
        state = LocalTransactionState.ROLLBACK_MESSAGE
        error = None
        if result.status is SendStatus.SEND_OK:
            try:
                state = _coerce_state(self.transaction_listener.execute_local_transaction(half, arg))
            except Exception as e:  # the local transaction failed: leave it to the check
                log.exception("executeLocalTransaction raised; the broker will check back")
                state, error = LocalTransactionState.UNKNOW, e
        try:
            inst.run(self._end_transaction(result, state, from_check=False, msg=half), timeout=t + 5)
        except Exception as e:
            log.warning("END_TRANSACTION for %s failed (the broker will check back): %s", result.msg_id, e)
        if error is not None:
            log.info("local transaction of %s ended with %r", result.msg_id, error)
        return TransactionSendResult(result, state)

    async def _end_transaction(self, result: SendResult, state: LocalTransactionState, from_check: bool,
                               addr: str | None = None, commit_log_offset: int | None = None,
                               tran_state_table_offset: int | None = None, transaction_id: str | None = None,
                               msg=None) -> None:
        inst = self.instance
        if addr is None:
            addr = await inst.find_broker_addr_in_publish_async(result.queue)
        if commit_log_offset is None:
            commit_log_offset = decode_offset_msg_id(result.offset_msg_id)[2]
        req = RemotingCommand.create_request(RequestCode.END_TRANSACTION, {
            "producerGroup": self.group,
            "tranStateTableOffset": result.queue_offset if tran_state_table_offset is None else tran_state_table_offset,
            "commitLogOffset": commit_log_offset,
            "commitOrRollback": _STATE_CODE[state],
            "fromTransactionCheck": from_check,
            "msgId": result.msg_id,
            "transactionId": transaction_id or result.transaction_id or result.msg_id,
        })
        req.mark_oneway()
        await inst.invoke_oneway(addr, req)
        if self.trace is not None and msg is not None:  # EndTransactionTraceHookImpl
            self.trace.on_end_transaction(msg, result.msg_id, addr, req.ext_fields["transactionId"], state.value,
                                          from_check)

    # called by the client instance for CHECK_TRANSACTION_STATE
    def check_transaction_state(self, addr: str, msg, header: dict) -> None:
        pool = self._check_pool
        if pool is None:
            return
        try:
            pool.submit(self._check, addr, msg, header)
        except RuntimeError:
            pass  # shutting down

    def _check(self, addr: str, msg, header: dict) -> None:
        try:
            state = _coerce_state(self.transaction_listener.check_local_transaction(msg))
        except Exception:
            log.exception("checkLocalTransaction raised; answering UNKNOW")
            state = LocalTransactionState.UNKNOW
        uniq = msg.get_property(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or header.get("msgId") or ""
        result = SendResult(status=SendStatus.SEND_OK, msg_id=uniq, offset_msg_id=header.get("offsetMsgId") or "",
                            queue=None, queue_offset=int(header.get("tranStateTableOffset") or 0))
        try:
            self.instance.run(self._end_transaction(
                result, state, from_check=True, addr=addr,
                commit_log_offset=int(header.get("commitLogOffset") or 0),
                tran_state_table_offset=int(header.get("tranStateTableOffset") or 0),
                transaction_id=header.get("transactionId") or uniq, msg=msg), timeout=10)
        except (MQClientError, Exception) as e:
            log.warning("END_TRANSACTION after a check of %s failed: %s", uniq, e)


__all__ = ["TransactionProducer", "TransactionSendResult"]
