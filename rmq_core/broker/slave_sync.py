"""Metadata between a master and its slaves (RocketMQ's SlaveSynchronize, and more for offsets).

Every `SYNC_INTERVAL` seconds a slave copies from its master (the `masterAddr` of the name server's
REGISTER_BROKER answer), through the broker's remoting client:

    GET_ALL_TOPIC_CONFIG              topics.json, replaced when the master's dataVersion differs
    GET_ALL_CONSUMER_OFFSET           consumerOffset.json, merged (below)
    GET_ALL_DELAY_OFFSET              delayOffset.json, replaced
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG  subscriptionGroup.json, replaced when the dataVersion differs

Consumer offsets, beyond RocketMQ 4.x (which copies the master's table over the slave's, so
everything consumed from the slave while the master was away is consumed again):

* A consumer commits to the master, or to the slave when the master is not in its route or not
  reachable (the client's find_broker_addr_in_subscribe).  A slave keeps every offset committed to
  it (UPDATE_CONSUMER_OFFSET) twice: in its offset table, which consumers query, and in its
  *received* table (`offsetTableReceivedBySlave` in consumerOffset.json, persisted with it), the
  offsets its master has still to take.
* The slave's sync never moves a received offset backwards: per group/topic/queue, a received
  offset greater than the master's stays (the master is behind: it was away); one the master has
  reached is dropped from the received table and the master's value is taken from then on — so a
  reset on the master (a move back) is followed once the master has taken what the slave had.
* The master takes the slave's received offsets where they are greater (the greater wins), by
  asking each of its slaves (their addresses from the name server's cluster info) for
  GET_ALL_CONSUMER_OFFSET every `SYNC_INTERVAL` while a slave is connected to its HA listener,
  and at once when the number of connected slaves grows (a slave reconnecting is the sign that
  the master is back or the slave is).  A slave whose received table is empty costs one small
  answer.  So a master that comes back after consumers moved on on the slave continues where they
  were, and its slave converges to the master's table at the next sync.
* A reset on the master (resetOffsetByTime, cloneGroupOffset) wins over what a slave received
  before it knew of the reset: the master stamps each reset queue with the reset's time
  (`offsetResetTimestampTable`, sent with its offsets), a slave keeps a copy of the stamps from
  its last sync, and a received offset counts only where the slave's copy of that queue's stamp
  is the master's — else the master does not take it and the slave's next sync drops it.  (An
  offset committed to the slave after the reset but before its next sync is dropped too: those
  messages are consumed again, never skipped.)

Delay offsets and topic / group tables follow the master unchanged, as in RocketMQ: the master is
their only writer (a slave refuses the admin writes, see processors.admin).
"""
from __future__ import annotations

import asyncio
import json
import logging

from rmq_core.errors import RemotingError
from rmq_core.message import MixAll
from rmq_core.remoting.body import ClusterInfo, TopicRouteData
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.broker.offset_manager import ConsumerOffsetManager, decode_offset_table
from rmq_core.common.fastjson import loads_lenient

log = logging.getLogger("rmq.broker")

SYNC_INTERVAL = 10.0  # seconds, as RocketMQ's slave sync
TIMEOUT = 3.0
ON_DEMAND_MIN_INTERVAL = 1.0  # seconds between topic syncs a slave's unknown topics start


class SlaveSynchronize:
    """The slave's copy of its master's tables, and the master's take of its slaves' offsets
    (see the module docstring).  `run_once()` does the role's round; the broker calls it every
    SYNC_INTERVAL, and `on_ha_connections(n)` when the master's HA listener counts n slaves."""

    def __init__(self, controller):
        self.ctrl = controller
        self._ha_connections = 0
        self._topics_asked_at = float("-inf")  # loop time of the last on-demand topic sync
        self._topic_lock = asyncio.Lock()
        self._lock = asyncio.Lock()  # one round at a time (the timer's and a slave connecting)

    async def run_once(self) -> None:
        async with self._lock:
            if self.ctrl.is_slave:
                await self.sync_all()
            elif self._slaves_connected():
                await self.take_slave_offsets()

    def _slaves_connected(self) -> bool:
        ha = getattr(self.ctrl.store, "ha_service", None)
        return ha is not None and ha.connection_count() > 0

    def on_ha_connections(self, count: int) -> bool:
        """The master's number of connected slaves now; True when it grew (take their offsets now)."""
        grew = count > self._ha_connections
        self._ha_connections = count
        return grew

    async def _call(self, addr: str, code: int, ext: dict | None = None) -> bytes:
        resp = await self.ctrl.namesrv_client.invoke(addr, RemotingCommand.create_request(code, ext or {}), TIMEOUT)
        if resp.code != ResponseCode.SUCCESS:
            raise RemotingError(f"{addr} answered request {code} with {resp.code}: {resp.remark}")
        return bytes(resp.body or b"")

    # --- the slave ------------------------------------------------------------------------------------
    async def sync_all(self) -> None:
        master = self.ctrl.master_addr
        if not master or master == self.ctrl.broker_addr:
            return
        for name, step in (("topic config", self._sync_topic_config), ("consumer offset", self._sync_consumer_offset),
                           ("delay offset", self._sync_delay_offset),
                           ("subscription group", self._sync_subscription_group)):
            try:
                await step(master)
            except (RemotingError, OSError, ValueError, KeyError, TypeError) as e:
                log.warning("sync %s from master %s failed: %s", name, master, e)

    async def find_topic(self, topic: str):
        """A slave asked about a topic it does not know (created on its master since the last
        sync): copy the master's topics now, at most once a second, then look again."""
        ctrl = self.ctrl
        if not ctrl.is_slave:
            return ctrl.topic_manager.select(topic)
        async with self._topic_lock:  # pulls arriving meanwhile see what this one finds
            tc = ctrl.topic_manager.select(topic)
            now = asyncio.get_running_loop().time()
            if tc is not None or now - self._topics_asked_at < ON_DEMAND_MIN_INTERVAL:
                return tc
            self._topics_asked_at = now
            master = ctrl.master_addr
            if master:
                try:
                    await self._sync_topic_config(master)
                except (RemotingError, OSError, ValueError, KeyError, TypeError) as e:
                    log.info("topic config from master %s for %s failed: %s", master, topic, e)
            tc = ctrl.topic_manager.select(topic)
            if tc is None:
                tc = await self._topic_from_route(topic)
            return tc

    async def _topic_from_route(self, topic: str):
        """The master is away and made the topic after the last sync: its queues as the name
        server's route has them from the master's registration (the next sync from the master
        replaces the whole table again)."""
        from rmq_core.broker.topic_config_manager import TopicConfig

        ctrl = self.ctrl
        bc = ctrl.broker_config
        for ns in bc.namesrv_addr_list:
            try:
                resp = await ctrl.namesrv_client.invoke(
                    ns, RemotingCommand.create_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), TIMEOUT)
            except (RemotingError, OSError) as e:
                log.info("route of %s from name server %s failed: %s", topic, ns, e)
                continue
            if resp.code != ResponseCode.SUCCESS or not resp.body:
                return None
            qd = next((q for q in TopicRouteData.decode(resp.body).queue_datas if q.broker_name == bc.broker_name), None)
            if qd is None:
                return None
            tc = TopicConfig(topic_name=topic, read_queue_nums=qd.read_queue_nums, write_queue_nums=qd.write_queue_nums,
                             perm=qd.perm, topic_sys_flag=qd.topic_sys_flag)
            log.info("topic %s from the name server's route while the master is away: %s", topic, tc)
            return ctrl.topic_manager.create_or_update(tc, notify=False)
        return None

    async def _sync_versioned(self, master: str, code: int, table, what: str) -> None:
        body = await self._call(master, code)
        text = body.decode("utf-8")
        version = (loads_lenient(text) or {}).get("dataVersion")
        if version == table.data_version.to_json():
            return
        await asyncio.to_thread(_replace_and_persist, table, text)
        log.info("Update slave %s from master, %s", what, master)

    async def _sync_topic_config(self, master: str) -> None:
        await self._sync_versioned(master, RequestCode.GET_ALL_TOPIC_CONFIG, self.ctrl.topic_manager.table,
                                   "topic config")

    async def _sync_subscription_group(self, master: str) -> None:
        await self._sync_versioned(master, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                                   self.ctrl.subscription_manager.table, "subscription group")

    async def _sync_consumer_offset(self, master: str) -> None:
        body = await self._call(master, RequestCode.GET_ALL_CONSUMER_OFFSET)
        obj = loads_lenient(body.decode("utf-8"))
        table = decode_offset_table(obj, "offsetTable", master)
        resets = decode_offset_table(obj, ConsumerOffsetManager.RESET_KEY, master)
        manager = self.ctrl.offset_manager
        manager.merge_from_master(table, resets)
        await asyncio.to_thread(manager.persist)

    async def _sync_delay_offset(self, master: str) -> None:
        body = await self._call(master, RequestCode.GET_ALL_DELAY_OFFSET)
        table = json.loads(body.decode("utf-8")).get("offsetTable") or {}
        service = self.ctrl.schedule_service
        service.replace_offset_table({int(k): int(v) for k, v in table.items()})
        await asyncio.to_thread(service.persist)

    # --- the master -----------------------------------------------------------------------------------
    async def slave_addrs(self) -> list[str]:
        """This group's slaves as the name server lists them."""
        bc = self.ctrl.broker_config
        for ns in bc.namesrv_addr_list:
            try:
                resp = await self.ctrl.namesrv_client.invoke(
                    ns, RemotingCommand.create_request(RequestCode.GET_BROKER_CLUSTER_INFO, {}), TIMEOUT)
            except (RemotingError, OSError) as e:
                log.info("cluster info from name server %s failed: %s", ns, e)
                continue
            if resp.code != ResponseCode.SUCCESS or not resp.body:
                continue
            bd = ClusterInfo.decode(resp.body).broker_addr_table.get(bc.broker_name)
            return [a for bid, a in sorted(bd.broker_addrs.items()) if bid != MixAll.MASTER_ID] if bd else []
        return []

    async def take_slave_offsets(self) -> int:
        """Take every slave's received offsets that are greater than ours; returns how many."""
        manager = self.ctrl.offset_manager
        taken = 0
        for addr in await self.slave_addrs():
            try:
                body = await self._call(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
                obj = loads_lenient(body.decode("utf-8"))
                received = decode_offset_table(obj, ConsumerOffsetManager.RECEIVED_KEY, addr)
                resets = decode_offset_table(obj, ConsumerOffsetManager.RESET_KEY, addr)
            except (RemotingError, OSError, ValueError) as e:
                log.info("consumer offsets of slave %s not taken: %s", addr, e)
                continue
            n = manager.take_newer(received, resets)
            if n:
                log.info("took %d consumer offsets committed to slave %s while this master was away", n, addr)
            taken += n
        if taken:
            await asyncio.to_thread(manager.persist)
        return taken


def _replace_and_persist(table, text: str) -> None:
    table.decode(text)  # the master's table and dataVersion
    table.persist()
