"""The rest of AdminBrokerProcessor that `rmq admin` (mqadmin's commands) needs: updating the
broker's config, the consume stats of every group, cloning a group's offsets, the stats items
behind statsAll, and asking a consumer for its running info (the broker forwards the request on
the client's own connection, as Broker2Client does)."""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import time

from rmq_core.broker.processors import Processor
from rmq_core.broker.processors.admin import consume_stats_body
from rmq_core.broker.processors.client import json_body
from rmq_core.common.files import atomic_write
from rmq_core.config import ConfigOrigin
from rmq_core.errors import ConfigError, RMQError
from rmq_core.message import MixAll
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

log = logging.getLogger("rmq.broker")

# the first line of updated_config_file (RocketMQ's brokerConfigPath when no -c file is given)
_UPDATED_HEADER = ("# written by updateBrokerConfig; read over broker.conf when the broker starts "
                   "(rmq admin updateBrokerConfig -k KEY --reset drops a key)\n")

# Stats sampling for VIEW_BROKER_STATS_DATA, at StatsItem's cadence: a minute of 10 s samples, an
# hour of 10 min samples, a day of hourly ones (39 copies of the counters at most).
_SAMPLE_SECONDS = 10.0
_RINGS = ((60, 10, 7), (3600, 600, 7), (86400, 3600, 25))  # window, cadence (s), samples kept


class StatsSampler:
    """Samples the broker's put / get counters so statsAll can read rates per topic and group over
    the last minute, hour and day (RocketMQ's StatsItem minute / hour / day snapshots).  Counting
    stays in BrokerStats (per batch on the send path); this only copies its totals."""

    def __init__(self, stats):
        self.stats = stats
        self.rings = [collections.deque(maxlen=kept) for _, _, kept in _RINGS]  # (t, puts, gets)
        self.sample()

    def _snapshot(self) -> tuple:
        counters = self.stats.counters()
        return time.time(), counters["put_nums"], counters["get_nums"]

    def sample(self) -> None:
        snap = self._snapshot()
        for ring, (_, cadence, _) in zip(self.rings, _RINGS):
            if not ring or snap[0] - ring[-1][0] >= cadence - 0.5:
                ring.append(snap)

    def window(self, name: str, key: str, seconds: float) -> dict:
        """{sum, tps, avgpt} of a counter over the last `seconds` (since boot when younger)."""
        kind = 1 if name == "TOPIC_PUT_NUMS" else 2
        ring = next(r for r, (w, _, _) in zip(self.rings, _RINGS) if seconds <= w)
        now = self._snapshot()
        base = next((s for s in ring if now[0] - s[0] <= seconds), ring[-1])
        total = now[kind].get(key, 0) - base[kind].get(key, 0)
        span = now[0] - base[0]
        return {"sum": total, "tps": round(total / span, 2) if span > 0 else 0.0, "avgpt": 0.0}

    def has(self, name: str, key: str) -> bool:
        return key in self.stats.counters()["put_nums" if name == "TOPIC_PUT_NUMS" else "get_nums"]


class AdminExtProcessor(Processor):
    CODES = {
        RequestCode.UPDATE_BROKER_CONFIG: "update_broker_config",
        RequestCode.GET_BROKER_CONSUME_STATS: "get_broker_consume_stats",
        RequestCode.CLONE_GROUP_OFFSET: "clone_group_offset",
        RequestCode.VIEW_BROKER_STATS_DATA: "view_broker_stats_data",
        RequestCode.GET_CONSUMER_RUNNING_INFO: "get_consumer_running_info",
        RequestCode.CONSUME_MESSAGE_DIRECTLY: "consume_message_directly",
        RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: "get_consumer_status",
        RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: "clean_expired_consume_queue",
        RequestCode.CLEAN_UNUSED_TOPIC: "clean_unused_topic",
    }

    sampler: StatsSampler | None = None  # set once per broker, by the first register

    def register(self, server) -> None:
        super().register(server)
        if self.sampler is None:  # once per broker (register runs per server, on the broker's loop)
            self.sampler = StatsSampler(self.ctrl.stats)
            self.ctrl.start_service_task(self._sample_loop(), "stats-sampler")

    async def _sample_loop(self) -> None:
        while True:
            await asyncio.sleep(_SAMPLE_SECONDS)
            self.sampler.sample()

    # --- config ---------------------------------------------------------------------------------------
    async def update_broker_config(self, ctx, request):
        """Body: `key=value` lines.  Every key is checked (known, valid value) before any is applied;
        the keys of RUNTIME_BROKER_KEYS take effect at once, every key is written to the store's
        updated_config_file (read at the next start), and the answer's remark names the keys that
        wait for a restart.  The broker re-registers, so brokerPermission reaches the name server."""
        from rmq_core.config import (RUNTIME_BROKER_KEYS, BrokerConfig, MessageStoreConfig, did_you_mean,
                                     parse_properties, read_properties_file)  # late: admin tools only

        ctrl = self.ctrl
        configs = ((BrokerConfig, ctrl.broker_config), (MessageStoreConfig, ctrl.store_config))
        known = {k: (cls, cfg) for cls, cfg in configs for k in cls.keys()}
        reset = [k for k in (request.get_str("resetKeys") or "").split(",") if k]
        if reset:
            return self._reset_broker_config(ctx, request, reset, configs, known)
        try:
            updates = parse_properties((request.body or b"").decode("utf-8", "replace"), "config update")
        except ConfigError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        if not updates:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "config update: no key=value given")
        for key in updates:
            if key not in known:
                return request.make_response(ResponseCode.SYSTEM_ERROR,
                                             f"unknown config key {key!r}{did_you_mean(key, known)}")
        merged = {}
        try:
            for cls, cfg in configs:
                mine = {k: v for k, v in updates.items() if known[k][0] is cls}
                if mine:
                    merged[cls] = cls.from_properties({**cfg.to_properties(), **mine}, where="updateBrokerConfig")
        except ConfigError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        path = ctrl.store_config.updated_config_file
        try:  # first persisted, so that a key acknowledged survives a restart
            saved = read_properties_file(path) if os.path.exists(path) else {}
            saved.update(updates)
            text = _UPDATED_HEADER + "".join(f"{k}={v}\n" for k, v in sorted(saved.items()))
            atomic_write(path, text.encode("utf-8"))
        except (OSError, ConfigError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"cannot write {path}: {e}")
        later = [k for k in updates if k not in RUNTIME_BROKER_KEYS]
        current = {**ctrl.broker_config.to_properties(), **ctrl.store_config.to_properties()}
        origins = ctrl.store_config.config_origins
        for key in updates:
            # what the new value overrides: the file's or default value, never an earlier update's
            prior = origins.get(key)
            if key not in RUNTIME_BROKER_KEYS:
                under = prior.under if prior is not None and prior.kind == "pending" else prior
                origins[key] = ConfigOrigin("pending", path, under, pending=updates[key])
            else:
                if prior is not None and prior.kind == "updated":
                    origins[key] = ConfigOrigin("updated", path, prior.under, prior.under_value)
                else:
                    origins[key] = ConfigOrigin("updated", path, prior, current.get(key))
                cls, cfg = known[key]
                name = cls.keys()[key]
                setattr(cfg, name, getattr(merged[cls], name))
        if ctrl.store is not None:
            ctrl.store.apply_config()
        log.info("broker config updated by %s: %s%s", ctx.remote_address, updates,
                 f" ({', '.join(later)} after a restart)" if later else "")
        if "brokerPermission" in updates:  # the routes must change: a new topic table version
            ctrl.topic_manager.table.data_version.next_version()
        ctrl.spawn(ctrl.register_broker_all())
        remark = (f"{', '.join(later)}: written to {path}, takes effect after a restart" if later else None)
        return request.make_response(ResponseCode.SUCCESS, remark)

    def _reset_broker_config(self, ctx, request, keys, configs, known):
        """updateBrokerConfig --reset: drop the keys from updated_config_file, so that the -c file's
        value (or the default) is the one in force - at once for the keys a running broker
        applies, after a restart for the others.  The answer's remark says which value now holds;
        its `resetKeys` field echoes the keys (a broker without this extension answers without it)."""
        from rmq_core.config import RUNTIME_BROKER_KEYS, did_you_mean, read_properties_file  # late: admin tools only

        ctrl = self.ctrl
        for key in keys:
            if key not in known:
                return request.make_response(ResponseCode.SYSTEM_ERROR,
                                             f"unknown config key {key!r}{did_you_mean(key, known)}")
        path = ctrl.store_config.updated_config_file
        try:
            saved = read_properties_file(path) if os.path.exists(path) else {}
            dropped = [k for k in keys if saved.pop(k, None) is not None]
            if dropped:
                if saved:
                    atomic_write(path, (_UPDATED_HEADER + "".join(f"{k}={v}\n" for k, v in sorted(saved.items())))
                                 .encode("utf-8"))
                else:
                    os.unlink(path)
        except (OSError, ConfigError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"cannot rewrite {path}: {e}")
        origins = ctrl.store_config.config_origins
        notes = []
        for key in keys:
            origin = origins.get(key)
            if key not in dropped:
                notes.append(f"{key}: nothing persisted in {path} ({origin.describe() if origin else 'the default'})")
                continue
            cls, cfg = known[key]
            name = cls.keys()[key]
            if origin is not None and origin.kind == "pending":  # never in force: nothing changes now
                origins[key] = origin.under
                if origin.under is None:
                    origins.pop(key)
                notes.append(f"{key}: dropped from {path}; {cfg.to_properties().get(key)} stays")
                continue
            under = origin.under if origin is not None and origin.kind == "updated" else origin
            value = origin.under_value if origin is not None and origin.kind == "updated" else None
            if under is None:
                origins.pop(key, None)
            else:
                origins[key] = under
            if value is None:
                value = cls().to_properties().get(key)
            where = under.describe() if under else "the default"
            if key in RUNTIME_BROKER_KEYS:
                setattr(cfg, name, getattr(cls.from_properties({**cfg.to_properties(), key: value},
                                                               where="updateBrokerConfig --reset"), name))
                notes.append(f"{key}: dropped from {path}; {value} from {where} in effect now")
            else:
                notes.append(f"{key}: dropped from {path}; {value} from {where} after a restart")
        if ctrl.store is not None:
            ctrl.store.apply_config()
        log.info("broker config reset by %s: %s", ctx.remote_address, "; ".join(notes))
        ctrl.spawn(ctrl.register_broker_all())
        return request.make_response(ResponseCode.SUCCESS, "; ".join(notes), {"resetKeys": ",".join(keys)})

    # --- consume stats ----------------------------------------------------------------------------------
    async def get_broker_consume_stats(self, ctx, request):
        """ConsumeStatsList: for every group with offsets here, per topic its ConsumeStats (only
        orderly groups when isOrder), and the broker's total diff."""
        ctrl = self.ctrl
        is_order = request.get_bool("isOrder", False)
        groups = collections.defaultdict(set)
        for topic, group in ctrl.offset_manager.snapshot():
            if not MixAll.is_retry_topic(topic):
                groups[group].add(topic)
        stats_list, total_diff = [], 0
        for group in sorted(groups):
            if is_order:
                info = ctrl.consumer_manager.get(group)
                if info is None or info.consume_type != "CONSUME_PASSIVELY":
                    continue
            stats = []
            for topic in sorted(groups[group]):
                cs = consume_stats_body(ctrl, group, [topic])
                if not cs["offsetTable"]:
                    continue
                total_diff += sum(max(0, r["brokerOffset"] - r["consumerOffset"]) for r in cs["offsetTable"])
                stats.append(cs)
            if stats:
                stats_list.append({group: stats})
        body = {"brokerAddr": ctrl.broker_addr, "totalDiff": total_diff, "consumeStatsList": stats_list}
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(body))

    async def clone_group_offset(self, ctx, request):
        """cloneGroupOffset: destGroup's offsets on a topic (or every topic of srcGroup) become srcGroup's."""
        ctrl = self.ctrl
        src, dest, topic = request.get_str("srcGroup"), request.get_str("destGroup"), request.get_str("topic")
        if not src or not dest:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "clone group offset needs srcGroup and destGroup")
        offline = (request.get_str("offline") or "false").lower() == "true"
        topics = [topic] if topic else sorted(ctrl.offset_manager.which_topic_by_consumer(src))
        online = ctrl.consumer_manager.get(src)
        skipped = []
        for t in topics:
            if ctrl.topic_manager.select(t) is None:
                skipped.append(f"{t} (no such topic on this broker)")
                continue
            # an online source group that does not subscribe the topic is left alone unless the
            # caller says it is offline (-o true), as RocketMQ's broker does
            if not offline and online is not None and online.subscriptions and \
                    ctrl.consumer_manager.find_subscription(src, t) is None:
                skipped.append(f"{t} (group {src} is online and does not subscribe it; -o true clones anyway)")
                continue
            offsets = ctrl.offset_manager.query_offsets(src, t)
            if offsets:
                ctrl.offset_manager.reset_offsets(dest, t, offsets)
                log.info("clone group offset %s -> %s on %s: %s", src, dest, t, offsets)
        return request.make_response(ResponseCode.SUCCESS, "skipped: " + "; ".join(skipped) if skipped else None)

    # --- store housekeeping (mqadmin cleanExpiredCQ / cleanUnusedTopic) ---------------------------------------
    async def clean_expired_consume_queue(self, ctx, request):
        """Consume queues whose messages the commit log no longer holds are destroyed; the body
        lists them ({"removed": [[topic, queue id], ...]})."""
        store = self.ctrl.store
        removed = await asyncio.get_running_loop().run_in_executor(None, store.clean_expired_consumer_queue)
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body({"removed": removed}))

    async def clean_unused_topic(self, ctx, request):
        """Consume queues of topics this broker has no config for are deleted ({"removed": [topic, ...]})."""
        topics = set(self.ctrl.topic_manager.all())
        removed = await asyncio.get_running_loop().run_in_executor(None, self.ctrl.store.clean_unused_topics, topics)
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body({"removed": removed}))

    # --- stats ----------------------------------------------------------------------------------------------
    async def view_broker_stats_data(self, ctx, request):
        """BrokerStatsData of TOPIC_PUT_NUMS (key: topic) or GROUP_GET_NUMS (key: topic@group)."""
        name, key = request.get_str("statsName") or "", request.get_str("statsKey") or ""
        if name not in ("TOPIC_PUT_NUMS", "GROUP_GET_NUMS"):
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        if not self.sampler.has(name, key):
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        body = {"statsMinute": self.sampler.window(name, key, 60), "statsHour": self.sampler.window(name, key, 3600),
                "statsDay": self.sampler.window(name, key, 86400)}
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(body))

    # --- consumer running info ------------------------------------------------------------------------------
    async def get_consumer_running_info(self, ctx, request):
        """Forward to the consumer's own connection and answer with its reply (Broker2Client)."""
        group, client_id = request.get_str("consumerGroup") or "", request.get_str("clientId") or ""
        forward = RemotingCommand.create_request(RequestCode.GET_CONSUMER_RUNNING_INFO, {
            "consumerGroup": group, "clientId": client_id, "jstackEnable": request.get_str("jstackEnable", "false")})
        return await self._call_consumer(request, group, client_id, forward, 5.0)

    async def consume_message_directly(self, ctx, request):
        """The message at the commit-log offset of msgId, sent to one consumer of the group for
        its listener (AdminBrokerProcessor.consumeMessageDirectly); its result is the answer."""
        from rmq_core.message import decode_offset_msg_id
        group, client_id = request.get_str("consumerGroup") or "", request.get_str("clientId") or ""
        msg_id = request.get_str("msgId") or ""
        try:
            offset = decode_offset_msg_id(msg_id)[2]
        except (ValueError, RMQError):
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad msgId {msg_id!r}: not an offset message id")
        raw = self.ctrl.store.select_one_message_by_offset(offset)
        if raw is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        forward = RemotingCommand.create_request(RequestCode.CONSUME_MESSAGE_DIRECTLY, {
            "consumerGroup": group, "clientId": client_id, "msgId": msg_id,
            "brokerName": self.ctrl.broker_config.broker_name}, body=bytes(raw))
        return await self._call_consumer(request, group, client_id, forward, 10.0)

    async def get_consumer_status(self, ctx, request):
        """Each online consumer of the group (or the one at clientAddr) asked for its offsets of the
        topic (Broker2Client.getConsumeStatus): {"consumerTable": {client id: offset rows}}."""
        topic, group = request.get_str("topic") or "", request.get_str("group") or ""
        client_addr = request.get_str("clientAddr") or ""
        info = self.ctrl.consumer_manager.get(group)
        if info is None or not info.all_client_ids():
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"No Any Consumer online in the consumer group: [{group}]")
        table = {}
        for client_id in info.all_client_ids():
            chan = info.find_channel(client_id)
            if chan is None or (client_addr and client_addr not in (client_id, chan.addr)):
                continue
            forward = RemotingCommand.create_request(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
                                                     {"topic": topic, "group": group, "clientAddr": chan.addr})
            try:
                reply = await chan.channel.invoke(forward, 5.0)
            except Exception as e:  # noqa: BLE001 - one unreachable client does not hide the others
                log.warning("get consumer status of %s from %s failed: %s", group, client_id, e)
                continue
            if reply.code == ResponseCode.SUCCESS and reply.body:
                from rmq_core.remoting.body import loads_lenient
                table[client_id] = loads_lenient(reply.body).get("messageQueueTable") or []
        if client_addr and not table:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The Consumer <{group}> <{client_addr}> not online")
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body({"consumerTable": table}))

    async def _call_consumer(self, request, group: str, client_id: str, forward, timeout: float):
        """`forward` on the consumer's own connection; its reply answers `request` (Broker2Client.callClient)."""
        info = self.ctrl.consumer_manager.get(group)
        chan = info.find_channel(client_id) if info is not None else None
        if chan is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The Consumer <{group}> <{client_id}> not online")
        try:
            reply = await chan.channel.invoke(forward, timeout)
        except Exception as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"invoke consumer <{group}> <{client_id}> failed: {e}")
        return request.make_response(reply.code, reply.remark, None, reply.body)
