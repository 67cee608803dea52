"""The broker: owns the store, the topic / group / offset tables, the processors and the
background services, and registers itself with the name servers (RocketMQ's BrokerController)."""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import os
import threading
import zlib

import attrs

from rmq_core.loops import cancel_and_wait
from rmq_core.broker.client_manager import ConsumerManager, ProducerManager
from rmq_core.broker.consumer_filter_manager import CalcBitMapDispatcher, ConsumerFilterManager
from rmq_core.broker.lock_manager import RebalanceLockManager
from rmq_core.broker.metrics import BrokerMetrics
from rmq_core.broker.long_polling import PullRequestHoldService
from rmq_core.broker.processors.acl import AclProcessor
from rmq_core.broker.processors.admin import AdminBrokerProcessor
from rmq_core.broker.processors.admin_ext import AdminExtProcessor
from rmq_core.broker.processors.client import ClientManageProcessor
from rmq_core.broker.processors.pull import PullMessageProcessor
from rmq_core.broker.processors import Handler
from rmq_core.broker.processors.pop import PopMessageProcessor
from rmq_core.broker.pop.service import PopService
from rmq_core.broker.processors.send import SendMessageProcessor, WriteFence, put_outcome
from rmq_core.broker.schedule import SCHEDULE_TOPIC, ScheduleMessageService
from rmq_core.broker.slave_sync import SYNC_INTERVAL, SlaveSynchronize
from rmq_core.broker.stats import BrokerStats
from rmq_core.broker.subscription_manager import SubscriptionGroupManager
from rmq_core.broker.timer import TIMER_TOPIC, TimerMessageService
from rmq_core.broker.topic_config_manager import TopicConfigManager
from rmq_core.broker.transaction import TransactionalMessageService
from rmq_core.config import BrokerConfig, BrokerRole, MessageStoreConfig
from rmq_core.errors import ConfigError, RMQError
from rmq_core.loops import CoalescedJob
from rmq_core.message import ExpressionType, open_listen_addresses
from rmq_core.acl import signer_from
from rmq_core.plugins import get_access_validator_factory, get_filter_factory
from rmq_core.remoting.body import REGISTER_ALL, ClusterInfo, RegisterBrokerBody, register_body_json
from rmq_core.remoting.client import RemotingClient
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.server import RemotingServer
from rmq_core.store import DefaultMessageStore
from rmq_core.broker.offset_manager import ConsumerOffsetManager

log = logging.getLogger("rmq.broker")


class BrokerController:
    def __init__(self, broker_config: BrokerConfig, store_config: MessageStoreConfig, *,
                 listen_host: str = "0.0.0.0", inproc_name: str | None = None, request_steps=()):
        if broker_config.enable_controller_mode:
            # the controllers give the id and the role: a slave (no writes) until they say otherwise
            store_config.broker_role = BrokerRole.SLAVE
            broker_config.broker_id = -1 if broker_config.broker_id == 0 else broker_config.broker_id
        else:
            check_broker_role(broker_config, store_config)
        self.broker_config = broker_config
        self.store_config = store_config
        self.listen_host = listen_host
        self.inproc_name = inproc_name
        self.stats = BrokerStats()
        self.consumer_manager = ConsumerManager(on_ids_changed=self._on_consumer_ids_changed,
                                                channel_expired_seconds=broker_config.client_channel_max_idle_time_seconds)
        self.producer_manager = ProducerManager(channel_expired_seconds=broker_config.client_channel_max_idle_time_seconds)
        self.lock_manager = RebalanceLockManager(broker_config.rebalance_lock_max_live_time)
        self.topic_manager = TopicConfigManager(broker_config, store_config.config_dir,
                                                delay_level_count=len(store_config.delay_levels_ms))
        self.subscription_manager = SubscriptionGroupManager(broker_config, store_config.config_dir)
        self.offset_manager = ConsumerOffsetManager(store_config.config_dir)
        self.schedule_service = ScheduleMessageService(self)
        self.timer_service = TimerMessageService(self)
        self.transaction_service = TransactionalMessageService(self)
        self.pop_service = PopService(self)
        self.slave_synchronize = SlaveSynchronize(self)
        self.store: DefaultMessageStore | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pull_hold_service: PullRequestHoldService | None = None
        self.servers: list[RemotingServer] = []
        # the broker's own request steps (RequestStep objects: its access check...), shared by its
        # servers' processor tables and run on every request before the rmq_broker_* hooks
        self.request_steps: list = list(request_steps or ())
        self.namesrv_client: RemotingClient | None = None
        # Registration with the name servers, coalesced (CoalescedJob): topic changes arriving together
        # share one incremental registration; a full one is due at start, every
        # registerNameServerPeriod and after a deletion.
        self._register_changed: dict[str, object] = {}
        self._register_all_due = False
        self._registrations = CoalescedJob(self._register_job, "rmq-register-broker")
        self._tasks: list[asyncio.Task] = []
        self._filters: dict = {}  # (group, topic, type, expression, version) -> MessageFilter
        # SQL92 subscriptions per topic, their bloom bits, and the bit map dispatcher.
        self.filter_manager = ConsumerFilterManager(broker_config, store_config)
        self.bloom_enabled = broker_config.enable_property_filter and broker_config.enable_calc_filter_bit_map
        if self.bloom_enabled and not store_config.enable_consume_queue_ext:
            log.info("enableCalcFilterBitMap=true: turning on enableConsumeQueueExt to keep the bit maps")
            store_config.enable_consume_queue_ext = True
        self.broker_addr: str | None = None
        # a slave: its master's broker address and HA address, from the name server's
        # REGISTER_BROKER answer (or haMasterAddress for the HA one)
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = store_config.ha_master_address
        self._synced_master: str | None = None  # the master address a slave's sync started on
        self.metrics = BrokerMetrics(self)
        self.access_validator = None  # aclEnable=true: the validator accessValidator names (a request step)
        self.send_processor = None  # SendMessageProcessor, once serving
        # grpcServerPort: the gRPC front end (rmq_core.proxy.server.GrpcServer), bound on
        # grpc_listen_host (the listen host unless `rmq standalone --grpc-listen` names another)
        self.grpc_server = None
        self.grpc_listen_host: str | None = None
        self.grpc_optional = False  # True: a port it cannot bind is a warning (a default, not asked for)
        self.started = False
        self._ha_default_port = 0
        self.replicas_manager = None  # controller mode (enableControllerMode): ReplicasManager
        # The master's write fence (controller mode): a write is answered as stored only while
        # monotonic() <= writable_until.  One object, read by the send lanes and the general path.
        self.write_fence = WriteFence()
        # the master epoch this broker registers with (its registrations' dataVersion.stateVersion, which
        # the name server checks: RocketMQ 5's); 0 in manual mode
        self.state_version = 0
        if broker_config.enable_controller_mode:
            self.writable_until = float("-inf")  # until a controller makes it master (ReplicasManager)

    @property
    def is_slave(self) -> bool:
        return self.store_config.broker_role is BrokerRole.SLAVE

    @property
    def writable_until(self) -> float:
        """Until when (time.monotonic() seconds) this broker may answer writes as stored: +inf in
        manual mode, -inf while it is not a writable master; set from the controller's heartbeats."""
        return self.write_fence.writable_until

    @writable_until.setter
    def writable_until(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"writable_until must be a number of time.monotonic() seconds (or ±inf), got {value!r}")
        self.write_fence.writable_until = value

    def fenced_remark(self) -> str:
        """The remark of a write refused because the master's lease lapsed (docs/failover.md, Fencing)."""
        bc = self.broker_config
        return (f"[FENCED]broker[{bc.broker_name}, {self.broker_addr}] is no longer sure it is the master of "
                f"{bc.broker_name} (its controller lease lapsed): the write is not acknowledged; "
                f"the new master takes writes")

    def fenced_refusal(self, request):
        """The answer to a write when the write fence has lapsed (SERVICE_NOT_AVAILABLE, [FENCED]...),
        else None: called before a write and again when its answer is made."""
        fence = self.write_fence
        if not fence.lapsed():
            return None
        code, remark, _ = put_outcome(fence)
        return request.make_response(code, remark)

    def slave_refusal(self, what: str) -> str:
        """The remark of a write a slave refuses (a send, a send-back, an end-transaction)."""
        bc = self.broker_config
        return (f"the broker[{bc.broker_name}, {self.broker_addr}] role is SLAVE (brokerId={bc.broker_id}): "
                f"{what} is forbidden on a slave; the master of {bc.broker_name} takes writes")

    # --- lifecycle -------------------------------------------------------------------------------------
    async def _listen_port_taken(self, port: int, text: str) -> str:
        """`text` (the listen error for listenPort) naming the broker whose HA port the port is when
        that is the clash (haListenPort defaults to listenPort + 1: a second broker on 10912 next to
        one on 10911), or whose listenPort it is, as the name servers list the brokers."""
        client = RemotingClient(name="broker-port-check", connect_timeout=1.0)
        try:
            for ns in self.broker_config.namesrv_addr_list:
                try:
                    resp = await client.invoke(ns, RemotingCommand.create_request(RequestCode.GET_BROKER_CLUSTER_INFO), 2.0)
                except (RMQError, OSError):
                    continue
                if resp.code != ResponseCode.SUCCESS or not resp.body:
                    continue
                for name, data in sorted(ClusterInfo.decode(resp.body).broker_addr_table.items()):
                    for addr in data.broker_addrs.values():
                        if addr.rpartition(":")[2] == str(port - 1):
                            return (f"{text}: listenPort {port} is the HA port of {name} ({addr}; a broker also "
                                    f"listens on listenPort + 1 for its slaves, haListenPort): give this broker "
                                    f"a listenPort whose next port is free too, e.g. {port + 9}")
                        if addr.rpartition(":")[2] == str(port):
                            return f"{text}: listenPort {port} is the listenPort of {name} ({addr})"
                break
        finally:
            await client.close()
        return text

    async def start(self) -> str:
        """Bind, recover the store, start services, register with the name servers.  Returns the
        boot line."""
        bc = self.broker_config
        # the broker's own account (half of one fails here, before anything binds)
        self._own_signer = signer_from(bc.access_key, bc.secret_key, owner="the broker's own account",
                                       names=("accessKey", "secretKey"))
        self.loop = asyncio.get_running_loop()
        self.pull_hold_service = PullRequestHoldService(self.loop)
        self.pull_hold_service.bind_thread()
        self._start_access_validator()  # before the servers resolve their steps; a bad plain_acl.yml fails here
        listen = [f"{self.listen_host}:{bc.listen_port}"] + [a.strip() for a in (bc.listen_addresses or "").split(";")
                                                            if a.strip()]
        tcp = RemotingServer(listen, name=f"broker[{bc.broker_name}]",
                             max_frame_length=bc.server_max_frame_length, backlog=bc.server_socket_backlog,
                             broker=True, request_steps=self.request_steps)
        try:
            await tcp.start()
        except BaseException as e:
            self._stop_access_validator()
            cause = e if isinstance(e, OSError) else e.__context__  # (the transport's error wraps the OSError)
            if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE and bc.listen_port:
                raise ConfigError(await self._listen_port_taken(bc.listen_port, str(e))) from None
            raise
        self.servers.append(tcp)
        exposed = open_listen_addresses(tcp.listen_addresses)
        if exposed and not bc.acl_enable:
            log.warning("ACL is off (aclEnable=false) and the broker listens on %s, reachable from other hosts: "
                        "any host that reaches it can send, consume and run admin commands; set aclEnable=true "
                        "(plain_acl.yml) or listen on 127.0.0.1 (--listen-host)", ", ".join(exposed))
        port = int(tcp.listen_address.rpartition(":")[2])
        # haListenPort's default, RocketMQ's: listenPort + 1 (any port for the broker: any for HA too)
        self._ha_default_port = bc.listen_port + 1 if bc.listen_port else 0
        if bc.listen_port == 0:
            bc.listen_port = port
        self.broker_addr = f"{bc.broker_ip1}:{port}"
        self.write_fence.remark = self.fenced_remark()  # (it names the broker's address)
        # Bound first (port 0 picks the port the store host names; a port in use fails before the
        # store is touched), but until the processors are in place every request is answered
        # SYSTEM_BUSY, which clients retry, never "request code not supported".
        starting = _Starting(bc.broker_name)
        tcp.register_default_processor(starting)
        if self.inproc_name:
            inproc = RemotingServer(f"inproc://{self.inproc_name}", name=f"broker[{bc.broker_name}]-inproc",
                                    broker=True, request_steps=self.request_steps)
            inproc.register_default_processor(starting)
            await inproc.start()
            self.servers.append(inproc)
            from rmq_core.remoting.aliases import register_inproc_alias
            register_inproc_alias(self.broker_addr, f"inproc://{self.inproc_name}")
        try:
            await self._start_services()
        except BaseException:
            await self._stop_grpc()
            self.metrics.stop()
            self._stop_access_validator()
            for server in self.servers:
                await server.stop()
            self.servers.clear()
            if self.inproc_name:
                from rmq_core.remoting.aliases import unregister_inproc_alias
                unregister_inproc_alias(self.broker_addr)
            if self.store is not None:
                self.store.detach_event_loop()
                await asyncio.to_thread(self.store.shutdown)
            raise
        self.started = True
        line = (f"The broker[{bc.broker_name}, {self.broker_addr}] boot success. serializeType=JSON"
                + (f" and name server is {bc.namesrv_addr}" if bc.namesrv_addr else ""))
        log.info(line)
        return line

    async def _start_services(self) -> None:
        bc = self.broker_config
        self.metrics.start()  # metricsExporterType (none by default): a port in use fails here, before the store
        os.makedirs(self.store_config.store_path_root_dir, exist_ok=True)
        self.store = DefaultMessageStore(self.store_config, store_host=(bc.broker_ip1, bc.listen_port))
        self.store.ha_service.listen_host = self.listen_host  # the HA listener binds where the broker does
        self.store.ha_service.default_listen_port = self._ha_default_port
        self.store.ha_service.backlog = self.broker_config.server_socket_backlog
        self.store.ha_service.controller_mode = bc.enable_controller_mode
        if self.bloom_enabled:
            # Before load(): records re-dispatched by recovery get their bit maps too.
            self.filter_manager.load()
            self.store.add_dispatcher(CalcBitMapDispatcher(self.filter_manager))
        if not await asyncio.to_thread(self.store.load):
            raise ConfigError(f"cannot load the message store under {self.store_config.store_path_root_dir}")
        self.store.register_message_arriving_listener(self._on_message_arriving)
        self.topic_manager.load()
        self.topic_manager.on_change = self._on_topic_changed
        self.subscription_manager.load()
        self.offset_manager.load()
        self.schedule_service.load()
        self.timer_service.load()
        self.store.start()
        self.store.attach_event_loop(self.loop)  # SYNC_FLUSH: this loop answers its group commits

        self.send_processor = SendMessageProcessor(self)  # (the gRPC front end's sends go through it too)
        for processor in (self.send_processor, PullMessageProcessor(self), ClientManageProcessor(self),
                          AdminBrokerProcessor(self), AdminExtProcessor(self), AclProcessor(self),
                          PopMessageProcessor(self)):
            for server in self.servers:
                processor.register(server)
        for server in self.servers:
            server.register_processor(RequestCode.END_TRANSACTION, Handler(self.transaction_service.end_transaction))
            server.on_channel_close.append(self._on_channel_close)
            server.register_default_processor(None)  # serving: an unknown code is "not supported" again
        if bc.grpc_server_port:
            # RocketMQ 5's gRPC protocol (rmq_core/proxy; grpcio is imported only here)
            from rmq_core.proxy import start_grpc_server
            try:
                self.grpc_server = await start_grpc_server(self, self.grpc_listen_host or self.listen_host,
                                                           bc.grpc_server_port)
            except ConfigError as e:
                if not self.grpc_optional:
                    raise
                # (`rmq standalone`'s default port, taken: the broker serves 4.x clients without it)
                log.warning("%s: serving without gRPC (RocketMQ 5 clients); give --grpc-listen HOST:PORT", e)

        if not bc.enable_controller_mode:
            for service in self._delivery_services():
                await service.start()
        # (its requests to name servers and to other brokers - a slave's sync from its master - are
        # signed with the broker's own account, accessKey/secretKey, when it has one)
        self.namesrv_client = RemotingClient(name=f"broker[{bc.broker_name}]->namesrv",
                                             request_steps=(self._own_signer,) if self._own_signer else ())
        self._tasks += [
            asyncio.create_task(self._periodic(bc.register_name_server_period / 1000, self.register_broker_all), name="register-broker"),
            asyncio.create_task(self._periodic(bc.flush_consumer_offset_interval / 1000, self._persist_offsets), name="persist-offsets"),
            asyncio.create_task(self._periodic(10.0, self._scan_channels), name="scan-channels"),
            asyncio.create_task(self._periodic(SYNC_INTERVAL, self.slave_synchronize.run_once), name="slave-sync"),
            asyncio.create_task(self._periodic(1.0, self._watch_group), name="watch-broker-group"),
        ]
        if bc.enable_controller_mode:
            from rmq_core.broker.replicas_manager import ReplicasManager
            self.replicas_manager = ReplicasManager(self)
            for server in self.servers:
                for code in (RequestCode.PREPARE_MASTER_SWITCH, RequestCode.GET_BROKER_EPOCH_CACHE,
                             RequestCode.NOTIFY_BROKER_ROLE_CHANGED):
                    server.register_processor(code, Handler(self._controller_request))
            await self.replicas_manager.start()  # takes its id and role, registers when it knows them
            if self.broker_config.broker_id >= 0:
                return
        await self.register_broker_all()

    async def change_role(self, role: BrokerRole, broker_id: int, ha_change) -> None:
        """Controller mode: become master (role SYNC_MASTER, registered as brokerId 0) or slave
        (SLAVE, its replica id); `ha_change(ha_service)` switches replication (in a worker thread:
        it joins replication threads)."""
        was_slave = self.is_slave
        self.store_config.broker_role = role
        if ha_change is not None:
            await asyncio.to_thread(ha_change, self.store.ha_service)
        if was_slave and not self.is_slave:
            # before it registers as brokerId 0: a registration without them would drop their routes
            self.topic_manager.adopt_stored_topics(
                {t: list(qs) for t, qs in self.store.get_consume_queue_table().items()})
        self.broker_config.broker_id = broker_id
        if was_slave and not self.is_slave:
            for service in (self.schedule_service, self.timer_service, self.transaction_service, self.pop_service):
                await service.start()
        elif not was_slave and self.is_slave:
            for service in (self.schedule_service, self.timer_service, self.transaction_service, self.pop_service):
                await service.stop()
        self.metrics.on_role_change(role.value)

    async def _controller_request(self, ctx, request):
        """The requests of controller mode a broker serves."""
        rm = self.replicas_manager
        from rmq_core.broker.replicas_manager import ControllerRefused
        if request.code == RequestCode.GET_BROKER_EPOCH_CACHE:
            ha = self.store.ha_service
            body = {"brokerName": self.broker_config.broker_name, "brokerId": rm.broker_id,
                    "masterEpoch": rm.master_epoch, "maxOffset": self.store.get_max_phy_offset(),
                    "epochList": ha.epoch_cache.to_json(self.store.get_max_phy_offset())}
            return request.make_response(ResponseCode.SUCCESS, None, None, json.dumps(body).encode())
        if request.code == RequestCode.NOTIFY_BROKER_ROLE_CHANGED:
            await rm.apply(request.ext_fields or {}, request.body, None)
            return None if request.is_oneway else request.make_response(ResponseCode.SUCCESS)
        try:
            end = await rm.prepare_switch(int(request.get_str("masterEpoch") or -1),
                                          int(request.get_str("targetBrokerId") or -1),
                                          int(request.get_str("timeoutMillis") or 10_000) / 1000)
        except (ControllerRefused, ValueError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        return request.make_response(ResponseCode.SUCCESS, None, {"maxOffset": str(end)})

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        if self.replicas_manager is not None:
            await self.replicas_manager.stop()
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        await self._registrations.close()
        await self.topic_manager.flush()  # the last batches of changes are on disk before we stop
        await self.subscription_manager.flush()
        await self.unregister_broker_all()
        if self.namesrv_client:
            await self.namesrv_client.close()
        self.pull_hold_service.wake_all()
        await self._stop_grpc()
        self.metrics.stop()
        for service in self._delivery_services():
            await service.stop()
        for server in self.servers:
            await server.stop()
        if self.inproc_name:
            from rmq_core.remoting.aliases import unregister_inproc_alias
            unregister_inproc_alias(self.broker_addr)
        self.servers.clear()
        self._stop_access_validator()
        self._persist_offsets_now()
        self.store.detach_event_loop()
        await asyncio.to_thread(self.store.shutdown)
        log.info("The broker[%s, %s] shutdown OK", self.broker_config.broker_name, self.broker_addr)

    async def _stop_grpc(self) -> None:
        server, self.grpc_server = self.grpc_server, None
        if server is not None:
            await server.stop()

    def grpc_line(self) -> str | None:
        """The line naming where RocketMQ 5 clients connect (None without grpcServerPort)."""
        if self.grpc_server is None:
            return None
        return (f"The broker[{self.broker_config.broker_name}] serves RocketMQ 5 clients (gRPC) on "
                f"{self.grpc_server.address}, endpoint {self.broker_config.broker_ip1}:{self.grpc_server.port}")

    def _start_access_validator(self) -> None:
        """aclEnable=true: the validator accessValidator names checks every request of every
        server (a broker-side request step, before any processor; the native send lane too)."""
        bc = self.broker_config
        if not bc.acl_enable:
            return
        self.access_validator = get_access_validator_factory(bc.access_validator)(bc)
        self.request_steps.insert(0, self.access_validator)  # (the access check before any other step)
        log.info("ACL enabled: access validator %s", bc.access_validator)

    def _stop_access_validator(self) -> None:
        v, self.access_validator = self.access_validator, None
        if v is not None:
            self.request_steps.remove(v)
            if hasattr(v, "close"):
                v.close()

    def _delivery_services(self) -> tuple:
        """The services that write on their own (delayed and timer deliveries, transaction
        check-backs, pop revive): a master's; a slave's store takes no writes (RocketMQ starts them on masters)."""
        if self.is_slave:
            return ()
        return (self.schedule_service, self.timer_service, self.transaction_service, self.pop_service)

    async def _watch_group(self) -> None:
        """Start a metadata round at once when it matters, not at the next SYNC_INTERVAL: a
        slave that learned (another) master address; a master whose slaves grew in number."""
        sync = self.slave_synchronize
        if self.is_slave:
            if self.master_addr and self.master_addr != self._synced_master:
                self._synced_master = self.master_addr
                await sync.run_once()
        elif sync.on_ha_connections(self.store.ha_service.connection_count()):
            await sync.run_once()

    async def _periodic(self, interval: float, fn) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                res = fn()
                if asyncio.iscoroutine(res):
                    await res
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))

    def spawn(self, coro) -> None:
        """Run `coro` on the broker's loop (call from the loop), not waited for: a failure is logged."""
        task = self.loop.create_task(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception() and log.warning("task failed: %s", t.exception()))

    def start_service_task(self, coro, name: str) -> asyncio.Task:
        """Run `coro` on the broker's loop (call from the loop) until the broker stops, which
        cancels it with the broker's own periodic tasks."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.append(task)
        return task

    def _persist_offsets_now(self) -> None:
        self.offset_manager.persist()
        self.schedule_service.persist()
        if self.bloom_enabled:
            self.filter_manager.clean()
            self.filter_manager.persist()

    async def _persist_offsets(self) -> None:
        await asyncio.to_thread(self._persist_offsets_now)

    def _scan_channels(self) -> None:
        self.consumer_manager.scan_not_active_channel()
        self.producer_manager.scan_not_active_channel()

    # --- name server registration --------------------------------------------------------------------
    def _on_topic_changed(self, tc):
        """A topic was created or updated (tc) or deleted (None): returns the future of the
        registration that carries it (None when called outside the broker's loop)."""
        if self.loop is None or self.pull_hold_service._loop_thread_id != threading.get_ident():
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self._on_topic_changed, tc)
            return None
        if tc is None:
            self._register_all_due = True  # an increment cannot say "gone": the full table can
        else:
            self._register_changed[tc.topic_name] = tc
        return self._registrations.request()

    async def register_broker_all(self) -> None:
        """Register the whole topic table (registerBrokerAll): at start and every registerNameServerPeriod."""
        self._register_all_due = True
        await self._registrations.request()

    async def _register_job(self) -> None:
        register_all, self._register_all_due = self._register_all_due, False
        changed, self._register_changed = self._register_changed, {}
        if not self.broker_config.namesrv_addr_list or not (register_all or changed):
            return
        if self.broker_config.broker_id < 0:  # controller mode, before the controllers gave a role
            self._register_all_due = True
            return
        if register_all:
            body, compressed = self.register_all_body()
        else:  # registerIncrementBrokerData: only what changed, with the table's data version
            version = self._registered_version(self.topic_manager.table.data_version)
            body, compressed = RegisterBrokerBody.build(
                {name: self._registered_config(tc) for name, tc in changed.items()}, version).encode(), False
        await self._send_registration(body, compressed, register_all)
        if register_all:
            log.debug("registered all %d topics (%d bytes%s)", len(self.topic_manager.table), len(body),
                      ", compressed" if compressed else "")
        else:
            log.info("registered %d changed topics incrementally", len(changed))

    def _registered_config(self, tc):
        """A read-only / write-only broker registers its topics with its own permission (as Java)."""
        broker_perm = self.broker_config.broker_permission
        return tc if broker_perm & 6 == 6 else attrs.evolve(tc, perm=tc.perm & broker_perm)

    def _registered_version(self, version):
        """A copy of the topic table's data version as this broker registers it: with its master
        epoch as stateVersion (the name server ignores a master registering with an older one)."""
        return attrs.evolve(version, state_version=self.state_version)

    def register_all_body(self) -> tuple[bytes, bool]:
        """The full registration's body, and whether it is compressed (compressedRegister)."""
        table = self.topic_manager.table
        if self.broker_config.compressed_register:
            version, configs = table.snapshot()
            version = self._registered_version(version)
            entries = [(tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_filter_type)
                       for tc in map(self._registered_config, configs)]
            return RegisterBrokerBody.encode_compressed(version, entries), True
        if self.broker_config.broker_permission & 6 != 6:
            version, configs = table.snapshot()
            return RegisterBrokerBody.build({tc.topic_name: self._registered_config(tc) for tc in configs},
                                            self._registered_version(version)).encode(), False
        version, members = table.snapshot_json()  # the entries as topics.json holds them, already encoded
        return register_body_json(self._registered_version(version), members), False

    async def _send_registration(self, body: bytes, compressed: bool, register_all: bool) -> None:
        bc = self.broker_config
        crc = zlib.crc32(body)
        ext = {"brokerAddr": self.broker_addr, "brokerName": bc.broker_name, "clusterName": bc.broker_cluster_name,
               "haServerAddr": self.ha_server_addr(), "brokerId": str(bc.broker_id),
               "compressed": "true" if compressed else "false",
               "bodyCrc32": str(crc - (1 << 32) if crc & 0x80000000 else crc)}
        if register_all:
            ext[REGISTER_ALL] = "true"

        async def one(addr):
            try:
                resp = await self.namesrv_client.invoke(addr, RemotingCommand.create_request(RequestCode.REGISTER_BROKER, ext, body), 3.0)
                if resp.code != ResponseCode.SUCCESS:
                    log.warning("register broker to name server %s failed: %s %s", addr, resp.code, resp.remark)
                else:
                    self._on_register_answer(resp.ext_fields or {})
            except Exception as e:
                log.warning("register broker to name server %s failed: %s", addr, e)

        await asyncio.gather(*(one(a) for a in bc.namesrv_addr_list))

    def ha_server_addr(self) -> str:
        """brokerIP2 (else brokerIP1, as RocketMQ's default of brokerIP2):the HA port - the bound one on a
        master (haListenPort, by default listenPort + 1): where slaves replicate from."""
        ha = self.store.ha_service
        port = ha.listen_port if ha.listen_port is not None else ha.configured_listen_port()
        bc = self.broker_config
        return f"{bc.broker_ip2 or bc.broker_ip1}:{port}"

    def _on_register_answer(self, ext: dict) -> None:
        """A slave follows its master's HA address as the name server knows it (a master restarted
        on another address included), unless haMasterAddress pins it (RocketMQ's
        updateMasterHAServerAddrPeriodically)."""
        if self.store_config.broker_role is not BrokerRole.SLAVE:
            return
        master_addr = ext.get("masterAddr")
        if master_addr:
            self.master_addr = master_addr
        ha_addr = ext.get("haServerAddr")
        if ha_addr and not self.store_config.ha_master_address and ha_addr != self.master_ha_addr:
            self.master_ha_addr = ha_addr
            self.store.update_ha_master_address(ha_addr)

    async def unregister_broker_all(self) -> None:
        bc = self.broker_config
        ext = {"brokerAddr": self.broker_addr, "brokerName": bc.broker_name,
               "clusterName": bc.broker_cluster_name, "brokerId": str(bc.broker_id)}
        for addr in bc.namesrv_addr_list:
            try:
                await self.namesrv_client.invoke(addr, RemotingCommand.create_request(RequestCode.UNREGISTER_BROKER, ext), 3.0)
            except Exception as e:
                log.warning("unregister broker from name server %s failed: %s", addr, e)

    # --- store glue ------------------------------------------------------------------------------------
    def redirect_if_delayed(self, inner, strict: bool = True):
        """Route a message to be stored: a timer message to the timer wheel, a DELAY level to the
        schedule topic (the level wins when both are set).  strict: raise TimerMessageError for a
        bad timer request (a producer's send) instead of storing it without delay."""
        return self.schedule_service.redirect_if_delayed(self.timer_service.redirect_if_timer(inner, strict))

    async def put_message(self, inner):
        return await self.store.put_message_async(inner)

    async def put_messages(self, batch):
        return await self.store.put_messages_async(batch)

    def _on_message_arriving(self, topic, queue_id, max_offset, tags_code=None, store_timestamp=None, properties=None):
        hold = self.pull_hold_service
        if hold.held:  # called for every put: skip the call while no pull is held at all
            hold.notify_message_arriving(topic, queue_id, max_offset, tags_code)
        if topic == SCHEDULE_TOPIC:
            self._call_in_loop(self.schedule_service.on_arrival, queue_id)
        elif topic == TIMER_TOPIC:
            self._call_in_loop(self.timer_service.on_arrival)

    def _call_in_loop(self, fn, *args) -> None:
        if self.pull_hold_service._loop_thread_id == __import__("threading").get_ident():
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def check_in_disk_by_consume_offset(self, topic: str, queue_id: int, offset: int) -> bool:
        """True when the message at `offset` is probably no longer in the page cache (RocketMQ's
        checkInDiskByConsumeOffset: further behind the log end than accessMessageInMemoryMaxRatio% of RAM)."""
        phy = self.store.get_commit_log_offset_in_queue(topic, queue_id, offset)
        if phy < 0:
            return False
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return self.store.get_max_phy_offset() - phy > total * self.store_config.access_message_in_memory_max_ratio / 100

    # --- filters -----------------------------------------------------------------------------------------
    def check_filter(self, group: str, sub):
        """Compile (and so validate) a subscription; raises FilterExpressionError naming the
        position, PluginNotFoundError for an unknown type, PropertyFilterDisabledError when SQL92
        is off on this broker."""
        if not ExpressionType.is_tag_type(sub.expression_type):
            self.filter_manager.check_expression_type_supported(sub.expression_type)
        return get_filter_factory(sub.expression_type)(sub.sub_string)

    def register_group_filters(self, group: str, subscriptions) -> None:
        """A heartbeat's subscriptions (already validated): with bit maps on, dispatch computes this
        group's bloom bits for its SQL92 topics from now on; dropped topics are marked dead."""
        if self.bloom_enabled:
            self.filter_manager.register_group(
                group, [s for s in subscriptions if not ExpressionType.is_tag_type(s.expression_type)])

    def build_message_filter(self, group: str, sub):
        key = (group, sub.topic, sub.expression_type, sub.sub_string)
        mf = self._filters.get(key)
        if mf is None or getattr(mf, "bloom_born_time", -1) != self._bloom_born_time(group, sub):
            if ExpressionType.is_tag_type(sub.expression_type):
                mf = get_filter_factory(sub.expression_type)(sub.sub_string)
            else:
                mf = self.filter_manager.build_message_filter(group, sub.topic, sub.expression_type,
                                                              sub.sub_string, sub.sub_version)
            if len(self._filters) > 10_000:
                self._filters.clear()
            self._filters[key] = mf
        return mf

    def expression_filter_of(self, group: str, topic: str):
        """The group's compiled expression filter (SQL92, ...) for `topic` as its consumers subscribe
        it, or None for a tag subscription, none, or one that no longer compiles here."""
        sub = self.consumer_manager.find_subscription(group, topic)
        if sub is None or ExpressionType.is_tag_type(sub.expression_type):
            return None
        try:
            return self.build_message_filter(group, sub)
        except (RMQError, ValueError):  # (SQL92 since switched off, a plugin gone: the pull of the topic says so)
            return None

    def _bloom_born_time(self, group: str, sub) -> int:
        """The born time of the registered filter data the cached filter was built from (a
        re-registration changes it, so the cache entry is rebuilt)."""
        if not self.bloom_enabled or ExpressionType.is_tag_type(sub.expression_type):
            return -1
        data = self.filter_manager.get(sub.topic, group)
        return data.born_time if data is not None and data.compiled is not None and \
            (data.expression_type, data.expression) == (sub.expression_type.upper(), sub.sub_string) else -1

    # --- 4.x compatibility ----------------------------------------------------------------------------
    @staticmethod
    def client_understands_lz4(request) -> bool:
        """Our own client speaks LZ4 (RocketMQ 5 compression bits); a 4.x client only zlib."""
        return request.language == "PYTHON"

    @staticmethod
    def recompress_for_4x(buf: bytes) -> bytes:
        from rmq_core.compression import recompress_records_for_4x
        return recompress_records_for_4x(buf)

    def recompress_for_request(self, request, buf: bytes) -> bytes:
        return buf if self.client_understands_lz4(request) else self.recompress_for_4x(buf)

    # --- client notifications ---------------------------------------------------------------------------
    def _on_consumer_ids_changed(self, group: str, channels) -> None:
        if not channels and self.bloom_enabled:
            self.filter_manager.unregister(group)  # the last member left
        if not self.broker_config.notify_consumer_ids_changed_enable or self.loop is None:
            return
        sg = self.subscription_manager.find(group)
        if sg is not None and not sg.notify_consumer_ids_changed_enable:
            return

        async def notify():
            for ch in channels:
                if getattr(ch, "closed", False):
                    continue
                req = RemotingCommand.create_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
                req.mark_oneway()
                try:
                    await ch.invoke_oneway(req)
                except Exception as e:
                    log.info("notify consumer ids changed to %s failed: %s", getattr(ch, "remote_address", "?"), e)

        self._call_in_loop(lambda: self.spawn(notify()))

    async def notify_reset_offset(self, group: str, topic: str, timestamp: int, table: dict) -> None:
        info = self.consumer_manager.get(group)
        if info is None:
            return
        body = json.dumps({"offsetTable": [{"mq": {"topic": topic, "brokerName": self.broker_config.broker_name,
                                                   "queueId": q}, "offset": o} for q, o in table.items()]}).encode()
        for c in list(info.channels.values()):
            req = RemotingCommand.create_request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, {
                "topic": topic, "group": group, "timestamp": str(timestamp), "isForce": "true"}, body)
            try:
                await c.channel.invoke(req, 5.0)
            except Exception as e:
                log.info("reset offset on client %s failed: %s", c.client_id, e)

    def _on_channel_close(self, ctx) -> None:
        groups = self.consumer_manager.do_channel_close(ctx)
        self.producer_manager.do_channel_close(ctx)
        if groups:
            log.info("consumer channel %s closed; groups changed: %s", ctx.remote_address, groups)

    # --- runtime info -----------------------------------------------------------------------------------------
    def runtime_info(self) -> dict[str, str]:
        info = dict(self.store.runtime_info())
        info.update(self.stats.snapshot())
        info["brokerVersionDesc"] = "V4_9_7"
        info["brokerVersion"] = "407"
        info["scheduleMessageOffset"] = json.dumps(self.schedule_service.offset_table())
        info.update(self.timer_service.runtime_info())
        info["heldPullRequests"] = str(self.pull_hold_service.held_count())
        info.update(self.ha_runtime_info())
        if self.replicas_manager is not None:
            info.update(self.replicas_manager.runtime_info())
        return info

    def ha_runtime_info(self) -> dict[str, str]:
        """The replication fields of brokerStatus: brokerRole, and the store's HA state - a
        master's haConnectionNum and per slave its address, ack offset and bytes behind
        (haConnectionInfo, JSON), a slave's master (masterAddr: its HA address; masterBrokerAddr)
        and how far behind it is; slaveFallBehindBytes on both."""
        info: dict[str, str] = {"brokerRole": self.store_config.broker_role.value}
        for key, value in self.store.ha_runtime_info().items():
            info[key] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        info["slaveFallBehindBytes"] = str(self.store.slave_fall_behind_bytes())
        if self.is_slave:
            info["masterBrokerAddr"] = self.master_addr or ""
        return info


def check_broker_role(bc: BrokerConfig, sc: MessageStoreConfig) -> None:
    """brokerId 0 is the master, > 0 a slave; brokerRole must agree (RocketMQ refuses the mix)."""
    if bc.broker_id < 0:
        raise ConfigError(f"brokerId must be 0 (master) or > 0 (slave), got {bc.broker_id}")
    slave = sc.broker_role is BrokerRole.SLAVE
    if slave and bc.broker_id == 0:
        raise ConfigError("brokerRole=SLAVE needs brokerId > 0 (brokerId=0 is the master of the group)")
    if not slave and bc.broker_id != 0:
        raise ConfigError(f"brokerId={bc.broker_id} is a slave's id but brokerRole={sc.broker_role.value}: "
                          f"set brokerRole=SLAVE, or brokerId=0 for a master")
    if sc.ha_master_address and not slave:
        raise ConfigError(f"haMasterAddress={sc.ha_master_address} is for a slave, but brokerRole={sc.broker_role.value}")


class _Starting:
    """Answers every request while the broker loads its store: SYSTEM_BUSY (clients retry it)."""

    __slots__ = ("remark",)

    def __init__(self, broker_name: str):
        self.remark = f"[STARTING]broker[{broker_name}] is loading its store; try again shortly"

    def process_request(self, ctx, request):
        return request.make_response(ResponseCode.SYSTEM_BUSY, self.remark)
