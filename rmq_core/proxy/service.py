"""MessagingService (apache.rocketmq.v2) over the broker's own parts, as RocketMQ 5's proxy serves
it in "local" mode.

Every RPC reaches the code its 4.x counterpart runs: SendMessage the send lane's put for a plain
message (`SendMessageProcessor.put_plain`), the send processor's `process_send` for any other
(topic checks, message type, max size, timer, half messages, the store's put),
EndTransaction `TransactionalMessageService.end_transaction`, the receive / ack / change of
invisible duration / dead-letter forward the broker's PopService; ACL the access validator's
accounts and permission decision (`check_grpc`: only the signature differs).  A refusal is answered
in the RPC's Status with a v2 Code and a message naming the bad value; an unexpected error is
answered INTERNAL_SERVER_ERROR naming it, and the broker keeps serving."""
from __future__ import annotations

import asyncio
import functools
import logging
import time

from rmq_core.broker.pop import service as pop
from rmq_core.broker.processors import born_host_of
from rmq_core.broker.processors.client import register_consumer
from rmq_core.common.subscription import SubscriptionData
from rmq_core.config import parse_properties
from rmq_core._native.proto_send import encode_send_response
from rmq_core.message import MixAll, PermName, SysFlag, decode_offset_msg_id, java_string_hash
from rmq_core.proxy import convert
from rmq_core.proxy.clients import GrpcClientChannel
from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb
from rmq_core.remoting.body import TopicRouteData
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.steps import RequestRefused

log = logging.getLogger("rmq.proxy")

# RocketMQ 5 proxy's bounds and defaults (ProxyConfig)
MAX_INVISIBLE_MS = pop.MAX_INVISIBLE_MS  # maxInvisibleTimeMills (12 h)
DEFAULT_INVISIBLE_MS = 60_000  # a receive without one (a PushConsumer's, auto renewed)
LONG_POLLING_MS = 20_000  # grpcClientConsumerMaxLongPollingTimeoutMillis
LONG_POLLING_MARGIN_MS = 500  # answered this long before the client's deadline
RECEIVE_BATCH_SIZE = 32
PRODUCER_BACKOFF = pb.RetryPolicy(max_attempts=3, exponential_backoff=pb.ExponentialBackoff(
    initial=convert.duration(10), max=convert.duration(1000), multiplier=2.0))
# the broker's ResponseCode -> the v2 Code a client gets for it
_CODES = {
    ResponseCode.SUCCESS: pb.OK, ResponseCode.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST, ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN, ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
    ResponseCode.SERVICE_NOT_AVAILABLE: pb.INTERNAL_SERVER_ERROR,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: pb.ILLEGAL_FILTER_EXPRESSION,
}
_POP_CODES = {
    pop.BAD_REQUEST: pb.BAD_REQUEST, pop.INVALID_RECEIPT_HANDLE: pb.INVALID_RECEIPT_HANDLE,
    pop.ILLEGAL_INVISIBLE_TIME: pb.ILLEGAL_INVISIBLE_TIME, pop.GROUP_NOT_FOUND: pb.CONSUMER_GROUP_NOT_FOUND,
    pop.TOPIC_NOT_FOUND: pb.TOPIC_NOT_FOUND, pop.FORBIDDEN: pb.FORBIDDEN, pop.NOT_MASTER: pb.INTERNAL_SERVER_ERROR,
    pop.ILLEGAL_FILTER: pb.ILLEGAL_FILTER_EXPRESSION, pop.INTERNAL: pb.INTERNAL_SERVER_ERROR,
}
# ACL permission bits (plugins/acl: Permission)
_ANY, _PUB, _SUB = 2, 4, 8
_OK = pb.Status(code=pb.OK, message="OK")
# gRPC status codes (the call's own status, beside the Status in a response)
GRPC_UNIMPLEMENTED, GRPC_INTERNAL = 12, 13


class GrpcAbort(Exception):
    """An RPC ended with a gRPC status (no response message)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _status(code: int, message: str) -> pb.Status:
    return pb.Status(code=code, message=message)


class _Refused(Exception):
    """An RPC answered with `status` before its work (ACL, a missing field)."""

    def __init__(self, status: pb.Status):
        super().__init__(status.message)
        self.status = status


def _answers(response_type):
    """Wrap a unary RPC: a _Refused or an unexpected error becomes the response's Status."""
    def wrap(fn):
        @functools.wraps(fn)
        async def rpc(self, request, call):
            try:
                return await fn(self, request, call)
            except _Refused as e:
                return response_type(status=e.status)
            except Exception as e:
                log.exception("gRPC %s failed", fn.__name__)
                return response_type(status=_status(pb.INTERNAL_SERVER_ERROR, f"{fn.__name__} failed on broker "
                                                    f"{self.ctrl.broker_config.broker_name}: {type(e).__name__}: {e}"))
        return rpc
    return wrap


class _Peer:
    """A 5.x client's request as the broker's processors see their remoting context."""

    __slots__ = ("remote_address", "attributes", "born_host")

    def __init__(self, remote_address: str):
        self.remote_address = remote_address
        self.attributes: dict = {}
        self.born_host = born_host_of(self)  # (host, port): what a stored message records


class MessagingService:
    def __init__(self, ctrl, grpc_port: int):
        self.ctrl = ctrl
        self.grpc_port = grpc_port  # this broker's (the route answers it for its queues)
        self.clients: dict[str, GrpcClientChannel] = {}
        self._grpc_ports: dict[str, int] = {}  # other brokers' remoting address -> their grpcServerPort
        self._last_prune = time.monotonic()
        self._peers: dict[str, _Peer] = {}

    # --- common ---------------------------------------------------------------------------------------
    def _auth(self, call, what: str, needed) -> None:
        validator = self.ctrl.access_validator
        if validator is None:
            return
        md = call.metadata
        check = getattr(validator, "check_grpc", None)
        if check is None:
            raise _Refused(_status(pb.UNAUTHORIZED, f"the broker's access validator "
                                   f"{self.ctrl.broker_config.access_validator} does not check gRPC requests"))
        try:
            check(call.peer, md.get("authorization"), md.get("x-mq-date-time"), what, needed)
        except RequestRefused as e:
            code = pb.FORBIDDEN if e.code == ResponseCode.NO_PERMISSION else pb.UNAUTHORIZED
            raise _Refused(_status(code, e.remark)) from None

    def _client(self, call) -> GrpcClientChannel:
        md = call.metadata
        client_id = md.get("x-mq-client-id")
        if not client_id:
            raise _Refused(_status(pb.CLIENT_ID_REQUIRED, "the request has no x-mq-client-id metadata"))
        client = self.clients.get(client_id)
        if client is None:
            self._prune()
            client = self.clients[client_id] = GrpcClientChannel(
                client_id, call.peer, md.get("x-mq-language", ""), md.get("x-mq-client-version", ""))
        client.last_seen = time.time()
        return client

    def _prune(self) -> None:
        """Forget clients silent for clientChannelMaxIdleTimeSeconds (the tables expire them too)."""
        now = time.monotonic()
        if now - self._last_prune < 10:
            return
        self._last_prune = now
        deadline = time.time() - self.ctrl.broker_config.client_channel_max_idle_time_seconds
        for cid, c in list(self.clients.items()):
            if c.last_seen < deadline and c.outbox is None:
                self._forget(c)

    def _forget(self, client: GrpcClientChannel) -> None:
        client.closed = True
        self.clients.pop(client.client_id, None)
        self.ctrl.producer_manager.do_channel_close(client)
        self.ctrl.consumer_manager.do_channel_close(client)

    def _register(self, client: GrpcClientChannel):
        """Put a client with settings in the broker's producer / consumer tables (again: a refresh);
        a consumer through the 4.x heartbeat's own registration.  None, or the refusal's status."""
        s = client.settings
        if s is None:
            return None
        info = client.info()
        if s.client_type == pb.PRODUCER:
            for t in s.publishing.topics:
                self.ctrl.producer_manager.register_producer(t.name, info)
        elif s.client_type in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER) and s.subscription.group.name:
            subs = [SubscriptionData.build(e.topic.name, e.expression.expression or "*",
                                           "SQL92" if e.expression.type == pb.SQL else "TAG")
                    for e in s.subscription.subscriptions]
            refused = register_consumer(self.ctrl, s.subscription.group.name, info, "CONSUME_POP", "CLUSTERING",
                                        "CONSUME_FROM_LAST_OFFSET", subs)
            if refused is not None:
                code, remark = refused
                return _status(_CODES.get(code, pb.INTERNAL_SERVER_ERROR), remark)
        return None

    # --- route ----------------------------------------------------------------------------------------
    async def _brokers(self, topic: str):
        """[(broker name, host, grpc port, read queues, write queues, perm)] of the masters holding
        `topic`, from the name servers' route (this broker's own topic table without one); None
        when no broker holds it.  Brokers not serving gRPC are left out (a client could not reach them)."""
        ctrl = self.ctrl
        bc = ctrl.broker_config
        route = await self._namesrv_route(topic) if bc.namesrv_addr_list else None
        if route is None:
            tc = ctrl.topic_manager.select(topic)
            if tc is None:
                return None
            return [(bc.broker_name, bc.broker_ip1, self.grpc_port, tc.read_queue_nums, tc.write_queue_nums, tc.perm)]
        if route is False:
            return None
        queues = {q.broker_name: q for q in route.queue_datas}
        out = []
        for b in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr, q = b.broker_addrs.get(0), queues.get(b.broker_name)
            if addr is None or q is None:
                continue
            port = self.grpc_port if addr == ctrl.broker_addr else await self._grpc_port_of(addr)
            if port:
                out.append((b.broker_name, addr.rpartition(":")[0], port, q.read_queue_nums, q.write_queue_nums, q.perm))
        return out

    async def _namesrv_route(self, topic: str):
        """The name servers' TopicRouteData of `topic`, False when they know no such topic, None
        when none answered."""
        client = self.ctrl.namesrv_client
        if client is None:
            return None
        for addr in self.ctrl.broker_config.namesrv_addr_list:
            try:
                r = await client.invoke(addr, RemotingCommand.create_request(
                    RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 3.0)
            except Exception as e:
                log.info("QueryRoute: name server %s did not answer the route of %s: %s", addr, topic, e)
                continue
            if r.code == ResponseCode.TOPIC_NOT_EXIST:
                return False
            if r.code == ResponseCode.SUCCESS and r.body:
                return TopicRouteData.decode(r.body)
        return None

    async def _grpc_port_of(self, addr: str) -> int:
        """Another broker's grpcServerPort (from its GET_BROKER_CONFIG; 0: it serves no gRPC)."""
        port = self._grpc_ports.get(addr)
        if port is None:
            try:
                r = await self.ctrl.namesrv_client.invoke(
                    addr, RemotingCommand.create_request(RequestCode.GET_BROKER_CONFIG), 3.0)
                port = int(parse_properties((r.body or b"").decode("utf-8"), "broker config").get("grpcServerPort") or 0)
            except Exception as e:
                log.info("QueryRoute: broker %s did not tell its grpcServerPort: %s", addr, e)
                return 0  # (asked again next time)
            self._grpc_ports[addr] = port
        return port

    def _accepted(self, topic: str) -> list[int]:
        tc = self.ctrl.topic_manager.select(topic)
        return convert.accepted_types(tc.attributes if tc is not None else None)

    @staticmethod
    def _broker(name: str, host: str, port: int) -> pb.Broker:
        return pb.Broker(name=name, id=0, endpoints=pb.Endpoints(
            scheme=pb.IPv4 if host.replace(".", "").isdigit() else pb.DOMAIN_NAME,
            addresses=[pb.Address(host=host, port=port)]))

    @_answers(spb.QueryRouteResponse)
    async def QueryRoute(self, request, call):
        topic = request.topic.name
        if not topic:
            raise _Refused(_status(pb.ILLEGAL_TOPIC, "QueryRoute without a topic"))
        self._auth(call, "QueryRoute", ((topic, _ANY),))
        brokers = await self._brokers(topic)
        if not brokers:
            return spb.QueryRouteResponse(status=_status(pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist "
                                                         f"(create it with `rmq admin updateTopic -t {topic}`)"))
        accepted = self._accepted(topic)
        mqs = []
        for name, host, port, r, w, perm in brokers:
            broker = self._broker(name, host, port)
            for qid in range(max(r, w)):
                readable = qid < r and PermName.is_readable(perm)
                writable = qid < w and PermName.is_writeable(perm)
                p = (pb.READ_WRITE if readable and writable else pb.READ if readable else pb.WRITE if writable
                     else pb.NONE)
                mqs.append(pb.MessageQueue(topic=request.topic, id=qid, permission=p, broker=broker,
                                           accept_message_types=accepted))
        return spb.QueryRouteResponse(status=_OK, message_queues=mqs)

    @_answers(spb.QueryAssignmentResponse)
    async def QueryAssignment(self, request, call):
        """Pop consumption: one assignment per broker holding the topic, queue -1 (all its queues)."""
        topic, group = request.topic.name, request.group.name
        self._auth(call, "QueryAssignment", ((topic, _SUB), (MixAll.RETRY_GROUP_TOPIC_PREFIX + group, _SUB)))
        brokers = await self._brokers(topic)
        if not brokers:
            return spb.QueryAssignmentResponse(status=_status(pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist"))
        accepted = self._accepted(topic)
        assignments = [pb.Assignment(message_queue=pb.MessageQueue(
            topic=request.topic, id=-1, permission=pb.READ_WRITE, broker=self._broker(name, host, port),
            accept_message_types=accepted)) for name, host, port, r, w, perm in brokers
            if r > 0 and PermName.is_readable(perm)]
        return spb.QueryAssignmentResponse(status=_OK, assignments=assignments)

    # --- clients ----------------------------------------------------------------------------------------
    @_answers(spb.HeartbeatResponse)
    async def Heartbeat(self, request, call):
        client = self._client(call)
        group = request.group.name if request.HasField("group") else ""
        self._auth(call, "Heartbeat", ((MixAll.RETRY_GROUP_TOPIC_PREFIX + group, _SUB),) if group else ())
        return spb.HeartbeatResponse(status=self._register(client) or _OK)

    @_answers(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request, call):
        md = call.metadata
        self._auth(call, "NotifyClientTermination", ())
        client = self.clients.get(md.get("x-mq-client-id") or "")
        if client is not None:
            self._forget(client)
        return spb.NotifyClientTerminationResponse(status=_OK)

    async def Telemetry(self, request_iterator, call):
        """The client's settings in, answered (the broker's decisions filled in); the broker's
        commands (transaction check-back) out, for as long as the client keeps the stream."""
        try:
            client = self._client(call)
            self._auth(call, "Telemetry", ())
        except _Refused as e:
            yield spb.TelemetryCommand(status=e.status)
            return
        outbox: asyncio.Queue = asyncio.Queue()
        client.outbox = outbox

        async def read():
            try:
                async for command in request_iterator:
                    which = command.WhichOneof("command")
                    if which == "settings":
                        outbox.put_nowait(self._settings(client, command.settings, call))
                    elif which in ("thread_stack_trace", "verify_message_result"):
                        log.info("client %s: %s", client.client_id, which)
            except Exception as e:  # (a client gone away: the stream ends)
                log.debug("Telemetry of %s ended: %s", client.client_id, e)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                command = await outbox.get()
                if command is None:
                    break
                yield command
        finally:
            reader.cancel()
            if client.outbox is outbox:
                client.outbox = None

    def _settings(self, client: GrpcClientChannel, settings, call):
        """The answer to a client's Settings, as RocketMQ 5's proxy makes it (GrpcClientSettingsManager)."""
        answer = pb.Settings()
        answer.CopyFrom(settings)
        ctrl = self.ctrl
        try:
            if settings.client_type == pb.PRODUCER:
                self._auth(call, "Telemetry", tuple((t.name, _PUB) for t in settings.publishing.topics))
                if not settings.backoff_policy.HasField("exponential_backoff") and \
                        not settings.backoff_policy.HasField("customized_backoff"):
                    answer.backoff_policy.CopyFrom(PRODUCER_BACKOFF)
                answer.publishing.max_body_size = ctrl.store_config.max_message_size
                answer.publishing.validate_message_type = True
            elif settings.client_type in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER):
                group = settings.subscription.group.name
                if not group:
                    return spb.TelemetryCommand(status=_status(pb.ILLEGAL_CONSUMER_GROUP, "consumer settings without a group"))
                self._auth(call, "Telemetry", ((MixAll.RETRY_GROUP_TOPIC_PREFIX + group, _SUB),) + tuple(
                    (e.topic.name, _SUB) for e in settings.subscription.subscriptions))
                sg = ctrl.subscription_manager.find_or_create(group)
                if sg is None:
                    return spb.TelemetryCommand(status=_status(pb.CONSUMER_GROUP_NOT_FOUND,
                                                               f"consumer group {group} does not exist"))
                answer.backoff_policy.CopyFrom(pb.RetryPolicy(
                    max_attempts=sg.retry_max_times + 1, customized_backoff=pb.CustomizedBackoff(
                        next=[convert.duration(ms) for ms in ctrl.store_config.delay_levels_ms])))
                answer.subscription.fifo = sg.consume_message_orderly
                answer.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
                answer.subscription.long_polling_timeout.CopyFrom(convert.duration(LONG_POLLING_MS))
            else:
                return spb.TelemetryCommand(status=_status(
                    pb.UNRECOGNIZED_CLIENT_TYPE, f"client type {pb.ClientType.Name(settings.client_type)} is not served"))
        except _Refused as e:
            return spb.TelemetryCommand(status=e.status)
        client.settings = answer
        refused = self._register(client)
        if refused is not None:
            client.settings = None
            return spb.TelemetryCommand(status=refused)
        return spb.TelemetryCommand(status=_OK, settings=answer)

    # --- send -------------------------------------------------------------------------------------------
    @_answers(spb.SendMessageResponse)
    async def SendMessage(self, messages, call):
        """`messages`: the request's, as rmq_core._native.proto_send decodes them (plain tuples);
        the answer is the response's bytes, encoded by the same codec."""
        if not messages:
            raise _Refused(_status(pb.BAD_REQUEST, "SendMessage without messages"))
        if self.ctrl.access_validator is not None:
            for t in {topic for topic, *_ in messages}:
                self._auth(call, "SendMessage", ((t, _PUB),))
        peer = self._peer(call.peer)
        entries = []
        for m in messages:
            entry = self._send(m, peer)
            entries.append(entry if type(entry) is tuple else await entry)
        code, message = entries[0][:2]
        if len(entries) > 1 and any(e[0] != code for e in entries):
            code, message = pb.MULTIPLE_RESULTS, "some messages failed"
        return encode_send_response(code, message, entries)

    def _peer(self, address: str) -> _Peer:
        """The client's remoting context, one per address (the send processor caches its born
        host in it)."""
        peer = self._peers.get(address)
        if peer is None:
            if len(self._peers) > 10_000:
                self._peers.clear()
            peer = self._peers[address] = _Peer(address)
        return peer

    def _send(self, message: tuple, peer):
        """One message's SendResultEntry as (code, message, message_id, transaction_id, offset), or
        an awaitable of it.  A plain one (no transaction, delivery timestamp or message group, to a
        topic that takes any message type) goes through the send lane's put, from plain values
        (`SendMessageProcessor.put_plain` / `put_answer`), answered here unless its put waits on a
        flush; any other through the send processor as a SEND_MESSAGE_V2 would go (its general
        path checks it)."""
        ctrl = self.ctrl
        topic, body, _, _, _, mid, _, _, born, group, _, queue_id, _, _ = message  # (proto_send.SEND_FIELDS)
        try:
            props, sys_flag, kind = convert.to_send(message, ctrl.store_config.max_message_size)
        except convert.BadMessage as e:
            return (self._topic_missing(topic) or (e.code, str(e))) + (mid, "", 0)
        if not group:  # (a message group's property makes the general path's FIFO checks)
            if queue_id >= 0:  # the client's queue if it is one of the write queues, else any
                tc = ctrl.topic_manager.select(topic)
                if tc is not None and queue_id >= tc.write_queue_nums:
                    queue_id = -1
            put = ctrl.send_processor.put_plain(topic, queue_id, body, 0, props, peer.born_host, born or 0,
                                                sys_flag)
            if put is not None:
                result, fut, _ = put
                if fut is not None:  # SYNC_FLUSH (or a slave to wait for): answered once it is durable
                    return self._durable_entry(result, fut, topic, mid)
                return self._put_entry(result, topic, mid)
        return self._send_checked(message, peer, props, sys_flag, kind)

    async def _durable_entry(self, result, fut, topic: str, mid: str) -> tuple[int, str, str, str, int]:
        return self._put_entry(await self.ctrl.store.await_durable_async(result, fut), topic, mid)

    def _put_entry(self, result, topic: str, mid: str) -> tuple[int, str, str, str, int]:
        code, remark, _ = self.ctrl.send_processor.put_answer(result, topic)
        code = _CODES.get(code, pb.INTERNAL_SERVER_ERROR)
        if code != pb.OK:
            return code, remark or f"send failed: {result.status.name}", mid, "", 0
        return pb.OK, "OK", mid, "", result.append_result.logics_offset

    async def _send_checked(self, message: tuple, peer, props: bytes, sys_flag: int,
                            kind: int) -> tuple[int, str, str, str, int]:
        """A message the send lane does not take, through the send processor's general path."""
        ctrl = self.ctrl
        topic, body, _, _, _, mid, _, _, born, group, _, queue_id, _, _ = message  # (proto_send.SEND_FIELDS)
        processor = ctrl.send_processor
        missing = self._topic_missing(topic)
        if missing:
            return missing + (mid, "", 0)
        n = ctrl.topic_manager.select(topic).write_queue_nums
        if not 0 <= queue_id < n:
            # (-1: the send processor picks one of the write queues, as for a 4.x send without one)
            queue_id = (java_string_hash(group) & 0x7FFFFFFF) % n if group and n else -1
        req = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
            "a": topic, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
            "g": str(born or int(time.time() * 1000)), "h": "0", "i": props.decode("utf-8"), "j": "0", "k": "false"},
            body)
        resp = processor.process_send(peer, req)
        if not isinstance(resp, RemotingCommand):  # (an awaitable: a SYNC_FLUSH put, a checked send)
            resp = await resp
        code = _CODES.get(resp.code, pb.INTERNAL_SERVER_ERROR)
        if code != pb.OK:
            return code, resp.remark or f"send failed: code {resp.code}", mid, "", 0
        ext = resp.ext_fields
        offset = int(ext.get("queueOffset") or 0)
        tid = ""
        if kind == pb.TRANSACTION or sys_flag & SysFlag.TRANSACTION_PREPARED_TYPE:
            tid = convert.transaction_id(decode_offset_msg_id(ext["msgId"])[2], offset)
        return pb.OK, "OK", mid, tid, offset

    def _topic_missing(self, topic: str) -> tuple[int, str] | None:
        """TOPIC_NOT_FOUND (code, message) when `topic` does not exist here: a send never creates
        one (QueryRoute told the client it does not exist)."""
        if topic and self.ctrl.topic_manager.select(topic) is not None:
            return None
        return pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist on broker {self.ctrl.broker_config.broker_name}"

    @_answers(spb.EndTransactionResponse)
    async def EndTransaction(self, request, call):
        topic = request.topic.name
        self._auth(call, "EndTransaction", ((topic, _PUB),))
        try:
            commit_log_offset, half_offset = convert.parse_transaction_id(request.transaction_id)
        except ValueError as e:
            raise _Refused(_status(pb.INVALID_TRANSACTION_ID, str(e))) from None
        state = {pb.COMMIT: SysFlag.TRANSACTION_COMMIT_TYPE, pb.ROLLBACK: SysFlag.TRANSACTION_ROLLBACK_TYPE}.get(
            request.resolution)
        if state is None:
            raise _Refused(_status(pb.BAD_REQUEST, f"EndTransaction of {request.message_id}: resolution "
                                   f"{pb.TransactionResolution.Name(request.resolution)} is neither COMMIT nor ROLLBACK"))
        req = RemotingCommand.create_request(RequestCode.END_TRANSACTION, {
            "producerGroup": "", "tranStateTableOffset": str(half_offset), "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(state), "fromTransactionCheck": str(request.source == pb.SOURCE_SERVER_CHECK).lower(),
            "msgId": request.message_id, "transactionId": request.transaction_id})
        resp = await self.ctrl.transaction_service.end_transaction(self._peer(call.peer), req)
        if resp is None or resp.code == ResponseCode.SUCCESS:
            return spb.EndTransactionResponse(status=_OK)
        return spb.EndTransactionResponse(status=_status(_CODES.get(resp.code, pb.INTERNAL_SERVER_ERROR),
                                                         resp.remark or f"end transaction failed: code {resp.code}"))

    # --- receive ------------------------------------------------------------------------------------------
    async def ReceiveMessage(self, request, call):
        group, topic = request.group.name, request.message_queue.topic.name
        try:
            client = self._client(call)
            self._auth(call, "ReceiveMessage", ((topic, _SUB), (MixAll.RETRY_GROUP_TOPIC_PREFIX + group, _SUB)))
            if request.HasField("invisible_duration"):
                invisible_ms = convert.millis(request.invisible_duration)
            elif request.auto_renew:
                invisible_ms = DEFAULT_INVISIBLE_MS
            else:
                raise _Refused(_status(pb.ILLEGAL_INVISIBLE_TIME, "ReceiveMessage without an invisible_duration"))
            min_ms = self.ctrl.broker_config.min_invisible_time_mills_for_recv
            if not min_ms <= invisible_ms <= MAX_INVISIBLE_MS:
                raise _Refused(_status(pb.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms is out of "
                                       f"[{min_ms}, {MAX_INVISIBLE_MS}] ms"))
            if request.batch_size <= 0 or request.batch_size > pop.MAX_POP_NUMS:
                raise _Refused(_status(pb.BAD_REQUEST, f"batch size {request.batch_size} is out of [1, {pop.MAX_POP_NUMS}]"))
            poll_ms = (convert.millis(request.long_polling_timeout) if request.HasField("long_polling_timeout")
                       else LONG_POLLING_MS)
            remaining = call.time_remaining()
            if remaining is not None:
                poll_ms = min(poll_ms, int(remaining * 1000) - LONG_POLLING_MARGIN_MS)
            poll_ms = max(0, poll_ms)
            fe = request.filter_expression
            sub = SubscriptionData.build(topic, fe.expression or "*", "SQL92" if fe.type == pb.SQL else "TAG")
            try:
                result = await self.ctrl.pop_service.pop(
                    group=group, topic=topic, max_nums=request.batch_size, invisible_ms=invisible_ms, sub=sub,
                    poll_ms=poll_ms, client_id=client.client_id,
                    attempt_id=request.attempt_id if request.HasField("attempt_id") else None)
            except pop.PopError as e:
                raise _Refused(_status(_POP_CODES.get(e.kind, pb.INTERNAL_SERVER_ERROR), str(e))) from None
        except _Refused as e:
            yield spb.ReceiveMessageResponse(status=e.status)
            return
        except Exception as e:
            log.exception("gRPC ReceiveMessage failed")
            yield spb.ReceiveMessageResponse(status=_status(pb.INTERNAL_SERVER_ERROR,
                                                            f"ReceiveMessage failed: {type(e).__name__}: {e}"))
            return
        if not result.messages:
            yield spb.ReceiveMessageResponse(status=_status(pb.MESSAGE_NOT_FOUND, "no new message"))
        else:
            yield spb.ReceiveMessageResponse(status=_OK)
            for p in result.messages:
                yield spb.ReceiveMessageResponse(message=convert.popped_message(p, result.invisible_ms))
        yield spb.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(int(time.time() * 1000)))

    @_answers(spb.AckMessageResponse)
    async def AckMessage(self, request, call):
        group, topic = request.group.name, request.topic.name
        self._auth(call, "AckMessage", ((topic, _SUB), (MixAll.RETRY_GROUP_TOPIC_PREFIX + group, _SUB)))
        if not request.entries:
            raise _Refused(_status(pb.BAD_REQUEST, "AckMessage without entries"))
        try:  # (one ack record per checkpoint the entries are in)
            outcomes = await self.ctrl.pop_service.ack_batch(group=group, topic=topic, receipt_handles=[
                e.receipt_handle for e in request.entries])
        except pop.PopError as err:  # (the whole request: a bad group, a broker not serving pop)
            raise _Refused(_status(_POP_CODES.get(err.kind, pb.INTERNAL_SERVER_ERROR), str(err))) from None
        entries = []
        for e, outcome in zip(request.entries, outcomes):
            status = (_status(_POP_CODES.get(outcome.kind, pb.INTERNAL_SERVER_ERROR), str(outcome))
                      if isinstance(outcome, pop.PopError) else _OK)
            entries.append(spb.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle,
                                                     status=status))
        codes = {e.status.code for e in entries}
        status = entries[0].status if len(codes) == 1 else _status(pb.MULTIPLE_RESULTS, "some acks failed")
        return spb.AckMessageResponse(status=status, entries=entries)

    @_answers(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request, call):
        group, topic = request.group.name, request.topic.name
        self._auth(call, "ChangeInvisibleDuration", ((topic, _SUB), (MixAll.RETRY_GROUP_TOPIC_PREFIX + group, _SUB)))
        ms = convert.millis(request.invisible_duration)
        if not 0 <= ms <= MAX_INVISIBLE_MS:
            raise _Refused(_status(pb.ILLEGAL_INVISIBLE_TIME, f"invisible duration {ms} ms is out of [0, {MAX_INVISIBLE_MS}] ms"))
        try:
            handle = await self.ctrl.pop_service.change_invisible_time(
                group=group, topic=topic, receipt_handle=request.receipt_handle, invisible_ms=ms)
        except pop.PopError as e:
            raise _Refused(_status(_POP_CODES.get(e.kind, pb.INTERNAL_SERVER_ERROR), str(e))) from None
        return spb.ChangeInvisibleDurationResponse(status=_OK, receipt_handle=handle)

    @_answers(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request, call):
        group, topic = request.group.name, request.topic.name
        self._auth(call, "ForwardMessageToDeadLetterQueue",
                   ((topic, _SUB), (MixAll.RETRY_GROUP_TOPIC_PREFIX + group, _SUB)))
        try:
            await self.ctrl.pop_service.forward_to_dead_letter(group=group, topic=topic,
                                                               receipt_handle=request.receipt_handle)
        except pop.PopError as e:
            raise _Refused(_status(_POP_CODES.get(e.kind, pb.INTERNAL_SERVER_ERROR), str(e))) from None
        return spb.ForwardMessageToDeadLetterQueueResponse(status=_OK)

    # --- not served ----------------------------------------------------------------------------------------
    async def _not_served(self, name: str, call):
        raise GrpcAbort(GRPC_UNIMPLEMENTED, f"{name} is not served by rmq's gRPC front end "
                            f"(pull consumption over gRPC): consume with ReceiveMessage (SimpleConsumer / "
                            f"PushConsumer) or the 4.x protocol")

    async def PullMessage(self, request, call):
        await self._not_served("PullMessage", call)
        yield spb.PullMessageResponse()  # (never reached: makes this a stream handler)

    async def UpdateOffset(self, request, call):
        await self._not_served("UpdateOffset", call)

    async def GetOffset(self, request, call):
        await self._not_served("GetOffset", call)

    async def QueryOffset(self, request, call):
        await self._not_served("QueryOffset", call)
