"""MQClientInstance: what producers and consumers of one client id share.

One instance owns a RemotingClient on a private asyncio event loop running in a daemon thread;
synchronous API calls submit coroutines to it (`run`).  It caches topic routes and broker
addresses, heartbeats every broker, answers broker->client requests (NOTIFY_CONSUMER_IDS_CHANGED
and friends), runs a small scheduler thread for the periodic jobs (route refresh, heartbeat,
offset persistence, orderly lock renewal) and a rebalance thread (every 20 s, or at once when
woken).  Blocking work (offset stores, rebalance) never runs on the event loop.

`MQClientManager.get_instance(config)` returns the instance for a client id, so objects that
share an instance name share one connection set, as in the Java client.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import random
import threading
import time
from typing import Any

import attrs

from rmq_core import loops
from rmq_core.client.broker_requests import BROKER_REQUEST_CODES, BrokerRequestProcessor
from rmq_core.client.config import ClientConfig
from rmq_core.client.loop_bridge import LoopBridge
from rmq_core.client.route import decode_route
from rmq_core.client.scheduler import Scheduler
from rmq_core.client.subscription import heartbeat_body
from rmq_core.errors import MQBrokerError, MQClientError, NamesrvUnreachableError, RemotingConnectError, RemotingError
from rmq_core.message import ExpressionType, MessageQueue, MixAll
from rmq_core.remoting.aliases import uses_local_aliases
from rmq_core.remoting.body import TopicRouteData
from rmq_core.remoting.client import RemotingClient
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.pipelined import PipelinedChannel, decode_command_frames

log = logging.getLogger("rmq.client")

# A broker group whose master failed (its connection gone, or a write refused as "not master"):
# the routes of the topics it serves are asked for again this often (seconds) until the group
# shows a master at another address, the failed one answers again or ROUTE_SUSPECT_MAX_SECONDS
# pass (then the periodic poll carries on; a new failure starts over).  Often enough that writes
# resume moments after a new master registers; seldom enough not to hammer a dead name server.
ROUTE_SUSPECT_INTERVAL = 0.3
ROUTE_SUSPECT_MAX_SECONDS = 30.0


class MQClientInstance(LoopBridge):
    def __init__(self, config: ClientConfig, producer_class: type | None = None):
        super().__init__(config.client_id)
        self.config = config
        # the Producer class the inner producer is made of: given by whoever gets the instance
        # (the client's producer and consumers), so that this module does not import producer.py
        self.producer_class = producer_class
        self.client_id = config.client_id
        self.producers: dict[str, Any] = {}
        self.consumers: dict[str, Any] = {}
        self._inner_producer = None  # CLIENT_INNER_PRODUCER, started on first use (inner_producer)
        self.topic_route_table: dict[str, TopicRouteData] = {}
        self.route_errors: dict[str, Exception] = {}  # topic -> why its last route lookup failed
        self.broker_addr_table: dict[str, dict[int, str]] = {}
        self._lock = threading.RLock()
        self._route_lock: asyncio.Lock | None = None
        self.remoting: RemotingClient | None = None
        # every send written from the caller's thread on a broker's pipelined connection (see
        # rmq_core.remoting.pipelined; in-proc: plugins/transport/inproc.py InprocPipelinedChannel):
        # broker address -> its connections
        self._send_channels: dict[Any, list[PipelinedChannel]] = {}
        self._send_channels_lock = threading.Lock()
        self._send_channel_turn = itertools.count()
        self._send_connect_locks: dict[str, threading.Lock] = {}  # one connect at a time per broker
        # broker -> (when a connect to it is tried again (sends) / it is preferred again (pulls,
        # offsets: find_broker_addr_in_subscribe turns to another broker of the group meanwhile),
        # why it failed)
        self._connect_failed: dict[str, tuple[float, str]] = {}
        # broker name -> the task asking the name server for its group's new master (route_suspect)
        self._route_suspects: dict[str, asyncio.Task] = {}
        self._suspect_refreshed: dict[str, float] = {}  # topic -> when a route_suspect last asked for it
        self.scheduler = Scheduler(f"rmq-sched-{self.client_id}")
        self._rebalance_event = threading.Event()
        self._rebalance_thread: threading.Thread | None = None
        self._running = False
        self._stopping = False
        self._namesrv_index = random.randrange(len(config.namesrv))
        self.blocking_executor = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix=f"rmq-io-{self.client_id}")

    # --- life cycle ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        with self._lock:
            if self._running:
                return
            self._start_loop()

            async def init():
                self._route_lock = asyncio.Lock()
                # (every request it sends passes the client's request steps: rmq_core.remoting.steps)
                # (a client that reaches the name server in-proc reaches brokers embedded in this
                # process in-proc too: routes carry their TCP addresses, which other processes need)
                self.remoting = RemotingClient(name=f"client-{self.client_id}", connect_timeout=self.config.connect_timeout,
                                               request_steps=self.config.request_steps,
                                               local_aliases=uses_local_aliases(self.config.namesrv))
                proc = BrokerRequestProcessor(self)
                for code in BROKER_REQUEST_CODES:
                    self.remoting.register_processor(code, proc)

            self.run(init())
            self.scheduler.start()
            cfg = self.config
            self.scheduler.schedule(self._refresh_routes_job, cfg.poll_name_server_interval,
                                    min(3.0, cfg.poll_name_server_interval), "route refresh")
            self.scheduler.schedule(self._heartbeat_job, cfg.heartbeat_broker_interval,
                                    cfg.heartbeat_broker_interval, "heartbeat")
            self.scheduler.schedule(self._persist_offsets_job, cfg.persist_consumer_offset_interval,
                                    cfg.persist_consumer_offset_interval, "persist offsets")
            self._rebalance_thread = threading.Thread(target=self._rebalance_loop, name=f"rmq-rebalance-{self.client_id}",
                                                      daemon=True)
            self._running = True
            self._rebalance_thread.start()
            log.info("the client factory [%s] start OK", self.client_id)

    def shutdown(self) -> None:
        with self._lock:
            if not self._running:
                return
            self._stopping = True
            self._running = False
            producers = list(self.producers.values())
            inner, self._inner_producer = self._inner_producer, None
        for p in producers:  # their native first attempts stop too (the general path refuses, naming why)
            p.on_client_stopping()
        if inner is not None:
            inner.shutdown()
        self._rebalance_event.set()
        if self._rebalance_thread is not None:
            self._rebalance_thread.join(30)
        self.scheduler.stop()
        # async sends in flight on the pipelined connections finish (or fail) before the executor
        # that runs their callbacks and the loop that would retry them go away
        self._close_send_channels(self.config.mq_client_api_timeout)
        self.blocking_executor.shutdown(wait=True)

        async def close():
            # every task still on the loop (pulls, sends in flight): cancel so no caller waits forever
            me = asyncio.current_task()
            await loops.cancel_and_wait([t for t in asyncio.all_tasks() if t is not me])
            if self.remoting is not None:
                await self.remoting.close()

        try:
            self.run(close(), timeout=10)
        except Exception:
            log.exception("closing the remoting client of %s failed", self.client_id)
        self._stop_loop()
        MQClientManager.remove(self)
        log.info("the client factory [%s] shut down", self.client_id)

    # --- registration ----------------------------------------------------------------------------
    def register_producer(self, group: str, producer) -> None:
        self._register(self.producers, "producer", group, producer)

    def register_consumer(self, group: str, consumer) -> None:
        self._register(self.consumers, "consumer", group, consumer)

    def _register(self, table: dict, kind: str, group: str, client) -> None:
        with self._lock:
            if group in table and table[group] is not client:
                raise MQClientError(
                    f"{kind} group {group!r} is already used by another {kind} of client {self.client_id}; "
                    "give one of them another instance_name"
                )
            table[group] = client

    def unregister_producer(self, group: str) -> None:
        with self._lock:
            self.producers.pop(group, None)
        self._unregister_client(group, "")
        self._shutdown_if_idle()

    def unregister_consumer(self, group: str) -> None:
        with self._lock:
            self.consumers.pop(group, None)
        self._unregister_client("", group)
        self._shutdown_if_idle()

    def _shutdown_if_idle(self) -> None:
        with self._lock:  # (the inner producer is the client's own: it does not keep it running)
            inner = self._inner_producer
            idle = not self.consumers and all(p is inner for p in self.producers.values())
        if idle:
            self.shutdown()

    def inner_producer(self):
        """The client's own producer (Java's CLIENT_INNER_PRODUCER, the client factory's
        getDefaultMQProducer): a consumer re-sends a message to its retry topic with it when the
        broker refused CONSUMER_SEND_MSG_BACK, and traced clients send their trace messages with it
        (AsyncTraceDispatcher's trace producer).  Made and started on this instance on first use,
        shut down with it.  It compresses as Java's DefaultMQProducer does (zlib at level 5 from
        4096 bytes): what it stores is read by RocketMQ 4.x's own tools (the dashboard,
        queryMsgTraceById), which inflate every compressed body with zlib."""
        with self._lock:
            if self._stopping:
                raise MQClientError(f"client {self.client_id} is shutting down")
            p = self._inner_producer
            if p is None:
                if self.producer_class is None:
                    raise MQClientError(f"client {self.client_id} has no producer class to make its inner producer of")
                options = attrs.asdict(self.config, recurse=False)
                namesrv = options.pop("namesrv")
                p = self._inner_producer = self.producer_class(MixAll.CLIENT_INNER_PRODUCER_GROUP, namesrv,
                                                               compress_type="zlib", **options)
        p._start_on(self)  # (registered on this instance; a no-op once started)
        return p

    def _unregister_client(self, producer_group: str, consumer_group: str) -> None:
        if not self._running:
            return

        async def unregister_all():
            for name, addrs in list(self.broker_addr_table.items()):
                for addr in addrs.values():
                    req = RemotingCommand.create_request(RequestCode.UNREGISTER_CLIENT, {
                        "clientID": self.client_id, "producerGroup": producer_group,
                        "consumerGroup": consumer_group,
                    })
                    try:
                        await self.invoke(addr, req, self.config.mq_client_api_timeout)
                    except (RemotingError, MQClientError) as e:
                        log.warning("unregister client %s at broker %s failed: %s", self.client_id, addr, e)

        try:
            self.run(unregister_all(), timeout=self.config.mq_client_api_timeout * 2 + 1)
        except Exception as e:
            log.warning("unregister client %s failed: %s", self.client_id, e)

    # --- rpc -------------------------------------------------------------------------------------
    async def invoke(self, addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        # "PYTHON" tells our broker this client decompresses LZ4 itself (4.x clients only know zlib)
        request.language = "PYTHON"
        try:
            response = await self.remoting.invoke(addr, request, timeout)
        except RemotingConnectError as e:
            self.note_connect_failed(addr, str(e))
            raise
        if self._connect_failed:  # (answered: `addr` is reachable again, its pipelined connections may open)
            self._connect_failed.pop(addr, None)
        return response

    def invoke_nowait(self, addr: str, request: RemotingCommand, timeout: float,
                      on_answer=None) -> asyncio.Future | None:
        """invoke() split in two: the request goes out now, the returned future gives the response
        later (`on_answer(response)` runs first, inside the read that brought it); None, with
        nothing sent, when it cannot go out at once (no open connection, a full write buffer):
        then invoke() as usual.  Call on the loop."""
        request.language = "PYTHON"
        return self.remoting.request_nowait(addr, request, timeout, on_answer)

    # --- pipelined send connections (async sends without the loop) -----------------------------------
    def pipelined_send_possible(self) -> bool:
        """True while sends may be written (not shutting down)."""
        return not self._stopping

    def has_send_channel(self, addr: str) -> bool:
        """True when a send to `addr` finds its pipelined connection open (no connect needed)."""
        channels = self._send_channels.get(addr)
        return bool(channels) and len(channels) == self.config.pipelined_send_connections and not any(
            c.closed for c in channels)

    def send_channel(self, addr: str, read_frames, from_command, key=None) -> PipelinedChannel:
        """A pipelined connection to the broker `addr` (one of pipelined_send_connections, taken
        in turn; in-proc for a broker embedded in this process), opened on first use and again
        after it broke; raises RemotingConnectError when it cannot be opened - at once, without
        trying, for a while after a failed try (a send must not block its caller on a connect
        per message to an unreachable broker).  read_frames / from_command: see PipelinedChannel;
        key: what the connections are kept under (default `addr`: the sends')."""
        if key is None:
            key = addr
        channels = self._send_channels.get(key)
        n = self.config.pipelined_send_connections
        if channels is not None and len(channels) == n:
            channel = channels[next(self._send_channel_turn) % n] if n > 1 else channels[0]
            if not channel.closed:
                return channel
        with self._send_channels_lock:
            connecting = self._send_connect_locks.setdefault(key, threading.Lock())
        with connecting:  # one connect per broker at a time; sends to other brokers go on meanwhile
            with self._send_channels_lock:
                if self._stopping:
                    raise RemotingConnectError(f"client {self.client_id} is shutting down; cannot reach {addr}")
                retry_at, why = self._connect_failed.get(addr, (0.0, ""))
                if time.monotonic() < retry_at:
                    raise RemotingConnectError(f"{why} (moments ago; not tried again for "
                                               f"{retry_at - time.monotonic():.1f} s)")
                channels = self._send_channels.setdefault(key, [])
                slot = next((i for i, c in enumerate(channels) if c.closed), None)
                if slot is None and len(channels) >= n:
                    return channels[next(self._send_channel_turn) % len(channels)]
            try:
                channel = self._open_send_channel(addr, read_frames, from_command)
            except RemotingConnectError as e:
                self.note_connect_failed(addr, str(e))
                raise
            with self._send_channels_lock:
                stopping = self._stopping
                if not stopping:
                    self._connect_failed.pop(addr, None)
                    channels = self._send_channels.setdefault(key, [])
                    if slot is not None and slot < len(channels) and channels[slot].closed:
                        channels[slot] = channel
                    else:
                        channels.append(channel)
            if stopping:  # shut down while connecting: the shutdown did not see this one
                channel.close()
                raise RemotingConnectError(f"client {self.client_id} is shutting down; cannot reach {addr}")
            return channel

    def command_channel(self, addr: str) -> PipelinedChannel:
        """A pipelined connection to the broker `addr` answering with RemotingCommands, kept and
        reopened as the sends' are (send_channel): a request written and its answer read by the
        caller's own thread (exchange), or answered through a LeanFuture - no hop through the
        event loop (the SimpleConsumer's acks: one round trip each)."""
        return self.send_channel(addr, decode_command_frames, None, key=("command", addr))

    def _open_send_channel(self, addr: str, read_frames, from_command) -> PipelinedChannel:
        return self.remoting.connect_pipelined(addr, read_frames=read_frames, from_command=from_command,
                                               name=f"rmq-send-{self.client_id}-{addr}")

    def send_channel_count(self, addr: str) -> int:
        """Open pipelined send connections to `addr`."""
        return sum(1 for c in self._send_channels.get(addr, ()) if not c.closed)

    def _close_send_channels(self, drain_timeout: float) -> None:
        with self._send_channels_lock:
            channels = [c for cs in self._send_channels.values() for c in cs]
            self._send_channels.clear()
        deadline = time.monotonic() + drain_timeout
        for channel in channels:
            channel.close(drain_timeout=max(0.0, deadline - time.monotonic()))

    def is_connected(self, addr: str) -> bool:
        """True when `invoke(addr, ...)` will not have to connect first (call on the loop)."""
        return self.remoting is not None and self.remoting.is_connected(addr)

    async def invoke_oneway(self, addr: str, request: RemotingCommand) -> None:
        request.language = "PYTHON"
        await self.remoting.invoke_oneway(addr, request)

    async def invoke_namesrv(self, request: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        addrs = self.config.namesrv
        last: Exception | None = None
        errors: list[str] = []
        for i in range(len(addrs)):
            addr = addrs[(self._namesrv_index + i) % len(addrs)]
            try:
                resp = await self.invoke(addr, request, timeout or self.config.mq_client_api_timeout)
                self._namesrv_index = (self._namesrv_index + i) % len(addrs)
                return resp
            except RemotingError as e:
                last = e
                errors.append(str(e))
                request = RemotingCommand.create_request(request.code, dict(request.ext_fields), request.body)
        what = f"the name server {addrs[0]}" if len(addrs) == 1 else f"any of the name servers {';'.join(addrs)}"
        raise NamesrvUnreachableError(f"cannot reach {what}: {'; '.join(errors)}") from last

    async def invoke_broker(self, addr: str, request: RemotingCommand, timeout: float | None = None,
                            ok_codes=(ResponseCode.SUCCESS,)) -> RemotingCommand:
        """Invoke and raise MQBrokerError (naming the broker) unless the code is in ok_codes."""
        resp = await self.invoke(addr, request, timeout or self.config.mq_client_api_timeout)
        if resp.code not in ok_codes:
            raise MQBrokerError(resp.code, resp.remark, addr)
        return resp

    # --- routes ----------------------------------------------------------------------------------
    async def get_topic_route(self, topic: str, timeout: float | None = None) -> TopicRouteData | None:
        """Ask the name server; None when the topic does not exist (TOPIC_NOT_EXIST)."""
        req = RemotingCommand.create_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        resp = await self.invoke_namesrv(req, timeout)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:  # (not a name server: a broker says so)
            addr = self.config.namesrv[self._namesrv_index % len(self.config.namesrv)]
            raise MQClientError(f"the name server {addr} answered: {resp.remark}", resp.code)
        if resp.code != ResponseCode.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark, "name server")
        if not resp.body:
            raise MQClientError(f"empty route body for topic {topic!r} from the name server")
        return decode_route(resp.body)

    async def update_topic_route(self, topic: str, default_topic: str | None = None, default_queue_nums: int = 4,
                                 report: bool = True) -> bool:
        """Refresh one topic's route; returns True when a route is known afterwards.  A failure is
        kept for route_error; `report`: also log it (once while it lasts) - False when the caller
        raises it (one report per failure)."""
        async with self._route_lock:
            try:
                if default_topic:
                    route = await self.get_topic_route(default_topic)
                    if route is not None:
                        route = route.with_default_topic_queue_nums(default_queue_nums)
                else:
                    route = await self.get_topic_route(topic)
            except (MQClientError, MQBrokerError, RemotingError) as e:
                before = self.route_errors.get(topic)
                if report and (before is None or str(before) != str(e)):
                    log.warning("update route of topic %s failed: %s", topic, e)
                self.route_errors[topic] = e  # what a caller left without a route is told
                return topic in self.topic_route_table
            self.route_errors.pop(topic, None)
            if route is None:
                if not default_topic:
                    log.debug("no route for topic %s on the name server", topic)
                return False
            old = self.topic_route_table.get(topic)
            self.topic_route_table[topic] = route
            new_broker = False
            for bd in route.broker_datas:
                known = self.broker_addr_table.get(bd.broker_name)
                if known != bd.broker_addrs:
                    new_broker = True
                    master = bd.broker_addrs.get(MixAll.MASTER_ID)
                    if master is not None and known is not None and known.get(MixAll.MASTER_ID) != master:
                        # a new master: what the producers learnt of the old one no longer holds
                        for p in list(self.producers.values()):
                            p.on_master_changed(bd.broker_name)
                self.broker_addr_table[bd.broker_name] = dict(bd.broker_addrs)
            if new_broker and not self._stopping:
                # a broker we never heartbeated: introduce ourselves now rather than at the next
                # tick (transaction check-backs and consumer lists need to know this client)
                self.spawn(self.send_heartbeat_to_all_brokers())
            if old != route:
                for p in list(self.producers.values()):
                    p.on_route_changed(topic, route)
                for c in list(self.consumers.values()):
                    c.on_route_changed(topic, route)
            return True

    def route_error(self, topic: str) -> MQClientError | None:
        """Why `topic` has no route, when its last lookup failed (the name server unreachable,
        named with its address and socket error), else None (the topic does not exist)."""
        err = self.route_errors.get(topic)
        if err is None or topic in self.topic_route_table:
            return None
        wrapped = MQClientError(f"cannot get the route of topic {topic!r}: {err}")
        wrapped.__cause__ = err
        return wrapped

    def topics_in_use(self) -> set[str]:
        topics: set[str] = set()
        for p in list(self.producers.values()):
            topics.update(p.published_topics())
        for c in list(self.consumers.values()):
            topics.update(c.subscribed_topics())
        return topics

    def _refresh_routes_job(self) -> None:
        async def refresh():
            for t in self.topics_in_use():
                await self.update_topic_route(t)

        self.run(refresh(), timeout=60)

    def find_broker_addr_in_publish(self, broker_name: str) -> str | None:
        addrs = self.broker_addr_table.get(broker_name)
        return addrs.get(MixAll.MASTER_ID) if addrs else None

    def note_connect_failed(self, addr: str, why: str) -> None:
        """A connect to `addr` failed (`why`: the socket error): sends do not try it again, and
        subscriptions turn to another broker of its group, for a few seconds; a master's group
        has its route asked for at once (route_suspect)."""
        with self._send_channels_lock:
            self._connect_failed[addr] = (time.monotonic() + min(5.0, max(1.0, self.config.connect_timeout)), why)
        self._suspect_master_at(addr, refused=False)

    def note_request_failed(self, addr: str, error: BaseException) -> None:
        """A request to the broker `addr` failed with `error` (a send's attempt, a pull): when that
        says its group's master may be gone - the connection failed or broke, a timeout with the
        connection gone - or is no longer master - SERVICE_NOT_AVAILABLE, as a slave or a fenced
        master refuses a write (whatever the remark) - the group's route is asked for at once
        (route_suspect).  A timeout on a connection still open is a slow master or one the network
        cut off (a partition drops packets and never breaks the connection): the route is asked
        for once, so writes move on as soon as a new master registered.  Anything else is left to
        the caller."""
        if isinstance(error, MQBrokerError):
            if error.code != ResponseCode.SERVICE_NOT_AVAILABLE:
                return
            refused = True
        elif isinstance(error, RemotingConnectError):
            refused = False
        elif isinstance(error, TimeoutError):
            if self.has_send_channel(addr) or self.is_connected(addr):
                self._suspect_master_at(addr, refused=False, once=True)
                return
            refused = False
        else:
            return
        self._suspect_master_at(addr, refused)

    def _suspect_master_at(self, addr: str, refused: bool, once: bool = False) -> None:
        for name, addrs in list(self.broker_addr_table.items()):
            if addrs.get(MixAll.MASTER_ID) == addr:
                self.route_suspect(name, addr, refused, once)

    def route_suspect(self, broker_name: str, failed_addr: str, refused: bool = False, once: bool = False) -> None:
        """The master of `broker_name` at `failed_addr` failed (refused: it answered that it is not
        master): ask the name server for the route of every topic the group serves at once, then
        every ROUTE_SUSPECT_INTERVAL, until the group shows a master at another address (a new
        master registered as brokerId 0), the failed one answers again (a connection to it is
        open again; not for a refusal) or ROUTE_SUSPECT_MAX_SECONDS pass.  Writes then resume on
        the new master without waiting for the periodic poll (pollNameServerInterval).  One chase
        per group at a time, and a topic is asked for at most once per interval however many
        groups chase: many failures at once make no storm.  `once`: ask one time, no chase (a
        master that timed out on an open connection: slow, or cut off).  Callable from any thread."""
        if not self._running or self._stopping:
            return
        try:
            self.post(lambda: self._start_route_suspect(broker_name, failed_addr, refused, once))
        except MQClientError:  # shut down meanwhile
            pass

    def _start_route_suspect(self, broker_name: str, failed_addr: str, refused: bool,
                             once: bool = False) -> None:  # on the loop
        if self._stopping or broker_name in self._route_suspects:
            return
        log.info("the master of broker %s (%s) %s: asking the name server for its route", broker_name, failed_addr,
                 "refused a write as not master" if refused else "did not answer in time" if once
                 else "is unreachable")
        self._route_suspects[broker_name] = self.spawn(self._chase_master(broker_name, failed_addr, refused, once))

    async def _chase_master(self, broker_name: str, failed_addr: str, refused: bool, once: bool = False) -> None:
        try:
            topics = [t for t, r in list(self.topic_route_table.items()) if r.broker_data(broker_name) is not None]
            give_up = time.monotonic() + ROUTE_SUSPECT_MAX_SECONDS
            while not self._stopping:
                for topic in topics:
                    if time.monotonic() - self._suspect_refreshed.get(topic, -ROUTE_SUSPECT_INTERVAL) >= \
                            ROUTE_SUSPECT_INTERVAL:
                        self._suspect_refreshed[topic] = time.monotonic()
                        await self.update_topic_route(topic)
                master = self.broker_addr_table.get(broker_name, {}).get(MixAll.MASTER_ID)
                if master is not None and master != failed_addr:
                    log.info("broker %s has a new master %s (was %s)", broker_name, master, failed_addr)
                    return
                if once:
                    return
                if not refused and (self.has_send_channel(failed_addr) or self.is_connected(failed_addr)):
                    return  # it answers again
                if time.monotonic() >= give_up:
                    return
                await asyncio.sleep(ROUTE_SUSPECT_INTERVAL)
        finally:
            self._route_suspects.pop(broker_name, None)

    def connect_failed_recently(self, addr: str) -> bool:
        failed = self._connect_failed.get(addr)
        return failed is not None and time.monotonic() < failed[0]

    def find_broker_addr_in_subscribe(self, broker_name: str, broker_id: int = MixAll.MASTER_ID,
                                      only_this_broker: bool = False) -> str | None:
        """Where to pull, commit or query offsets (RocketMQ's findBrokerAddressInSubscribe): the
        broker `broker_id` of the group (a slave id not in the route: the next one), else - unless
        `only_this_broker` (queue locks: the master's alone) - the master, else a slave.  A broker
        whose connect just failed is passed over for another of the group while there is one: a
        master gone from the route or unreachable leaves its consumers on the slave."""
        addrs = self.broker_addr_table.get(broker_name)
        if not addrs:
            return None
        addr = addrs.get(broker_id)
        if addr is None and broker_id != MixAll.MASTER_ID:
            addr = addrs.get(broker_id + 1)
        if only_this_broker:
            return addr
        if addr is not None and not self.connect_failed_recently(addr):
            return addr
        ordered = [a for _, a in sorted(addrs.items())]  # the master first
        return next((a for a in ordered if not self.connect_failed_recently(a)), addr or ordered[0])

    async def find_broker_addr_in_subscribe_async(self, mq: MessageQueue, broker_id: int = MixAll.MASTER_ID) -> str:
        addr = self.find_broker_addr_in_subscribe(mq.broker_name, broker_id)
        if addr is None:
            await self.update_topic_route(mq.topic)
            addr = self.find_broker_addr_in_subscribe(mq.broker_name, broker_id)
        if addr is None:
            raise MQClientError(f"the broker {mq.broker_name!r} of {mq} is not in any route known to {self.client_id}")
        return addr

    async def find_broker_addr_in_publish_async(self, mq: MessageQueue) -> str:
        addr = self.find_broker_addr_in_publish(mq.broker_name)
        if addr is None:
            await self.update_topic_route(mq.topic)
            addr = self.find_broker_addr_in_publish(mq.broker_name)
        if addr is None:
            raise MQClientError(f"the master of broker {mq.broker_name!r} ({mq}) is not in any route known to {self.client_id}")
        return addr

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str]:
        route = self.topic_route_table.get(topic)
        if route is None:
            await self.update_topic_route(topic)
            route = self.topic_route_table.get(topic)
        if route is None or not route.broker_datas:
            return []
        bd = random.choice(route.broker_datas)
        addr = bd.select_broker_addr()
        if addr is None:
            return []
        req = RemotingCommand.create_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        resp = await self.invoke_broker(addr, req)
        if not resp.body:
            return []
        return list(json.loads(resp.body).get("consumerIdList") or [])

    # --- heartbeat -------------------------------------------------------------------------------
    async def send_heartbeat_to_all_brokers(self, raise_errors: bool = False) -> None:
        """HEART_BEAT to every known broker (masters; slaves too when there are consumers).

        raise_errors: at start the broker's refusal (e.g. a duplicate client id) is surfaced."""
        producers = list(self.producers)
        consumers = list(self.consumers.values())
        if not producers and not consumers:
            return
        body = heartbeat_body(self.client_id, producers, consumers)
        errors = []
        unreachable: list[str] = []  # "broker-a (addr): why" of each broker that did not answer
        tried = 0
        for name, addrs in list(self.broker_addr_table.items()):
            for bid, addr in addrs.items():
                if not consumers and bid != MixAll.MASTER_ID:
                    continue
                req = RemotingCommand.create_request(RequestCode.HEART_BEAT, {}, body)
                tried += 1
                try:
                    await self.invoke_broker(addr, req)
                except MQBrokerError as e:
                    log.warning("heartbeat of %s to broker %s (%s) refused: %s", self.client_id, name, addr, e)
                    errors.append(e)
                except (RemotingError, MQClientError) as e:
                    log.warning("heartbeat of %s to broker %s (%s) failed: %s", self.client_id, name, addr, e)
                    unreachable.append(f"broker {name} ({addr}): {e}")
        if raise_errors and errors:
            raise errors[0]
        if raise_errors and unreachable and len(unreachable) == tried:
            # no broker of the routes answers (e.g. brokerIP1 is not an address this client reaches)
            raise MQClientError(f"no broker reachable: {'; '.join(unreachable)}")

    async def check_client_in_broker(self, group: str, subscriptions) -> None:
        """CHECK_CLIENT_CONFIG for each subscription that is not a tag expression, to every broker
        of its topic (Java's checkClientInBroker at consumer start): the broker's refusal (SQL92
        on a broker with enablePropertyFilter=false, an unknown expression type) raises
        MQBrokerError with its remark, so start() fails saying why instead of the pulls."""
        for sub in subscriptions:
            if ExpressionType.is_tag_type(sub.expression_type):
                continue
            route = self.topic_route_table.get(sub.topic)
            addrs = [a for bd in (route.broker_datas if route else ()) for a in bd.broker_addrs.values()]
            body = json.dumps({"clientId": self.client_id, "group": group,
                               "subscriptionData": sub.to_json()}).encode("utf-8")
            for addr in addrs:
                await self.invoke_broker(addr, RemotingCommand.create_request(RequestCode.CHECK_CLIENT_CONFIG, {}, body))

    def _heartbeat_job(self) -> None:
        self.run(self.send_heartbeat_to_all_brokers(), timeout=60)

    def heartbeat_now(self, raise_errors: bool = False) -> None:
        self.run(self.send_heartbeat_to_all_brokers(raise_errors), timeout=60)

    # --- consumers: offsets and rebalance --------------------------------------------------------
    def _persist_offsets_job(self) -> None:
        for c in list(self.consumers.values()):
            try:
                c.persist_consumer_offset()
            except Exception:
                log.exception("persisting offsets of group %s failed", c.group)

    def rebalance_immediately(self) -> None:
        self._rebalance_event.set()

    def _rebalance_interval(self) -> float:
        intervals = [getattr(c, "rebalance_interval", 20.0) for c in list(self.consumers.values())]
        return min(intervals) if intervals else 20.0

    def _rebalance_loop(self) -> None:
        while self._running:
            self._rebalance_event.wait(self._rebalance_interval())
            self._rebalance_event.clear()
            if not self._running:
                return
            self.do_rebalance()

    def do_rebalance(self) -> None:
        for c in list(self.consumers.values()):
            if not self._running:
                return
            try:
                c.do_rebalance()
            except Exception:
                log.exception("rebalance of group %s failed", c.group)


class MQClientManager:
    """client id -> MQClientInstance (one per process per id)."""

    _lock = threading.Lock()
    _table: dict[str, MQClientInstance] = {}

    @classmethod
    def get_instance(cls, config: ClientConfig, producer_class: type | None = None) -> MQClientInstance:
        """producer_class: what the instance makes its inner producer of (see inner_producer)."""
        with cls._lock:
            inst = cls._table.get(config.client_id)
            if inst is None or (inst._stopping and not inst.running):
                inst = MQClientInstance(config, producer_class)
                cls._table[config.client_id] = inst
            elif inst.producer_class is None:
                inst.producer_class = producer_class
            return inst

    @classmethod
    def remove(cls, inst: MQClientInstance) -> None:
        with cls._lock:
            if cls._table.get(inst.client_id) is inst:
                del cls._table[inst.client_id]


__all__ = ["MQClientInstance", "MQClientManager"]
