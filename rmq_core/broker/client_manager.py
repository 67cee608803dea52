"""Producer and consumer tables: who is connected, in which group, subscribed to what.

Filled by HEART_BEAT, emptied by UNREGISTER_CLIENT, channel close and idle expiry (RocketMQ's
ConsumerManager / ProducerManager / ClientHousekeepingService).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable

import attrs

from rmq_core.common.subscription import SubscriptionData
from rmq_core.message import MessageModel

log = logging.getLogger("rmq.broker")

# C++ writes enums as ordinals, Java as names.
_CONSUME_TYPE = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY"}
_MESSAGE_MODEL = {0: "BROADCASTING", 1: "CLUSTERING"}
_CONSUME_FROM = {
    0: "CONSUME_FROM_LAST_OFFSET", 1: "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    2: "CONSUME_FROM_MIN_OFFSET", 3: "CONSUME_FROM_MAX_OFFSET", 4: "CONSUME_FROM_FIRST_OFFSET",
    5: "CONSUME_FROM_TIMESTAMP",
}


def _enum_name(value, table: dict, default: str) -> str:
    if isinstance(value, int):
        return table.get(value, default)
    return str(value) if value else default


@attrs.define(eq=False)
class ClientChannelInfo:
    channel: object  # remoting ChannelContext
    client_id: str
    language: str = "JAVA"
    version: int = 0
    last_update_timestamp: float = attrs.field(factory=time.time)

    @property
    def addr(self) -> str:
        return getattr(self.channel, "remote_address", "?")


@attrs.define(eq=False)
class ConsumerGroupInfo:
    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict = attrs.field(factory=dict)  # channel_id -> ClientChannelInfo
    subscriptions: dict = attrs.field(factory=dict)  # topic -> SubscriptionData
    last_update_timestamp: float = attrs.field(factory=time.time)

    def all_client_ids(self) -> list[str]:
        return sorted({c.client_id for c in self.channels.values()})

    def find_channel(self, client_id: str):
        for info in self.channels.values():
            if info.client_id == client_id:
                return info
        return None


class DuplicateClientIdError(Exception):
    pass


def _channel_key(channel) -> str:
    return getattr(channel, "channel_id", None) or str(id(channel))


class ConsumerManager:
    """group -> ConsumerGroupInfo.  `on_ids_changed(group, channels)` fires when membership changes
    so the broker can push NOTIFY_CONSUMER_IDS_CHANGED."""

    def __init__(self, on_ids_changed: Callable | None = None, channel_expired_seconds: float = 120.0):
        self._groups: dict[str, ConsumerGroupInfo] = {}
        self._lock = threading.RLock()
        self.on_ids_changed = on_ids_changed
        self.channel_expired_seconds = channel_expired_seconds

    def client_id_of(self, group: str, channel) -> str | None:
        """The client id `channel` registered in `group` with (None before its heartbeat)."""
        g = self._groups.get(group)
        info = g.channels.get(_channel_key(channel)) if g is not None else None
        return info.client_id if info is not None else None

    def register_consumer(self, group: str, info: ClientChannelInfo, consume_type: str, message_model: str,
                          consume_from_where: str, subscriptions: list[SubscriptionData]) -> bool:
        """Returns True when the group's membership or subscriptions changed."""
        with self._lock:
            g = self._groups.get(group)
            if g is None:
                g = self._groups[group] = ConsumerGroupInfo(group)
            # A second live connection with the same client id in one group double-consumes its
            # queues; RocketMQ silently allows it, we refuse it with the culprit's address.
            key = _channel_key(info.channel)
            for other_key, other in g.channels.items():
                if other.client_id == info.client_id and other_key != key and not getattr(other.channel, "closed", False):
                    raise DuplicateClientIdError(
                        f"consumer client id {info.client_id!r} of group {group!r} is already connected "
                        f"from {other.addr}; give each consumer a unique instance name"
                    )
            g.consume_type, g.message_model, g.consume_from_where = consume_type, message_model, consume_from_where
            changed = key not in g.channels
            if changed:
                g.channels[key] = info
            else:
                g.channels[key].last_update_timestamp = time.time()
            new_subs = {s.topic: s for s in subscriptions}
            sub_changed = {t: (s.sub_string, s.expression_type) for t, s in new_subs.items()} != {
                t: (s.sub_string, s.expression_type) for t, s in g.subscriptions.items()}
            if sub_changed or any(s.sub_version > g.subscriptions.get(t, s).sub_version for t, s in new_subs.items()):
                g.subscriptions = new_subs
            g.last_update_timestamp = time.time()
        if changed:
            self._notify(group)
        return changed or sub_changed

    def unregister_consumer(self, group: str, channel) -> bool:
        with self._lock:
            g = self._groups.get(group)
            if g is None or g.channels.pop(_channel_key(channel), None) is None:
                return False
            if not g.channels:
                del self._groups[group]
        self._notify(group)
        return True

    def do_channel_close(self, channel) -> list[str]:
        key = _channel_key(channel)
        changed = []
        with self._lock:
            for name, g in list(self._groups.items()):
                if g.channels.pop(key, None) is not None:
                    changed.append(name)
                    if not g.channels:
                        del self._groups[name]
        for name in changed:
            self._notify(name)
        return changed

    def scan_not_active_channel(self) -> list[str]:
        deadline = time.time() - self.channel_expired_seconds
        expired = []
        with self._lock:
            for g in self._groups.values():
                for key, info in list(g.channels.items()):
                    if info.last_update_timestamp < deadline:
                        expired.append(info.channel)
        out = []
        for ch in expired:
            log.warning("consumer channel %s expired (no heartbeat for %ss)", getattr(ch, "remote_address", ch),
                        self.channel_expired_seconds)
            out += self.do_channel_close(ch)
        return out

    def _notify(self, group: str) -> None:
        if self.on_ids_changed is not None:
            g = self._groups.get(group)
            self.on_ids_changed(group, [c.channel for c in g.channels.values()] if g else [])

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self._groups.get(group)

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        g = self._groups.get(group)
        return g.subscriptions.get(topic) if g else None

    def groups(self) -> dict[str, ConsumerGroupInfo]:
        with self._lock:
            return dict(self._groups)

    def query_topic_consume_by_who(self, topic: str) -> set[str]:
        return {name for name, g in self.groups().items() if topic in g.subscriptions}


class ProducerManager:
    def __init__(self, channel_expired_seconds: float = 120.0):
        self._groups: dict[str, dict[str, ClientChannelInfo]] = {}
        self._lock = threading.RLock()
        self.channel_expired_seconds = channel_expired_seconds

    def register_producer(self, group: str, info: ClientChannelInfo) -> None:
        with self._lock:
            chans = self._groups.setdefault(group, {})
            key = _channel_key(info.channel)
            if key in chans:
                chans[key].last_update_timestamp = time.time()
            else:
                chans[key] = info

    def unregister_producer(self, group: str, channel) -> None:
        with self._lock:
            chans = self._groups.get(group)
            if chans is not None:
                chans.pop(_channel_key(channel), None)
                if not chans:
                    del self._groups[group]

    def do_channel_close(self, channel) -> None:
        key = _channel_key(channel)
        with self._lock:
            for group in list(self._groups):
                self._groups[group].pop(key, None)
                if not self._groups[group]:
                    del self._groups[group]

    def scan_not_active_channel(self) -> None:
        deadline = time.time() - self.channel_expired_seconds
        with self._lock:
            for group in list(self._groups):
                for key, info in list(self._groups[group].items()):
                    if info.last_update_timestamp < deadline:
                        del self._groups[group][key]
                if not self._groups[group]:
                    del self._groups[group]

    def available_channels(self, group: str) -> list[ClientChannelInfo]:
        """Live producer channels of a group (for transaction check-back), freshest first."""
        with self._lock:
            chans = [c for c in self._groups.get(group, {}).values() if not getattr(c.channel, "closed", False)]
        return sorted(chans, key=lambda c: -c.last_update_timestamp)

    def groups(self) -> dict[str, list[ClientChannelInfo]]:
        with self._lock:
            return {g: list(c.values()) for g, c in self._groups.items()}


def parse_heartbeat(body: bytes | None) -> dict:
    """Decode a HEART_BEAT body leniently (C++ ints for enums, trailing newline, Java names)."""
    if not body:
        raise ValueError("heartbeat without a body")
    data = json.loads(bytes(body).decode("utf-8"))
    if not isinstance(data, dict) or not data.get("clientID"):
        raise ValueError("heartbeat body has no clientID")
    consumers = []
    for c in data.get("consumerDataSet") or []:
        consumers.append({
            "group": c.get("groupName"),
            "consume_type": _enum_name(c.get("consumeType"), _CONSUME_TYPE, "CONSUME_PASSIVELY"),
            "message_model": _enum_name(c.get("messageModel"), _MESSAGE_MODEL, MessageModel.CLUSTERING.value),
            "consume_from_where": _enum_name(c.get("consumeFromWhere"), _CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
            "subscriptions": [SubscriptionData.from_json(s) for s in c.get("subscriptionDataSet") or []],
        })
    producers = [p.get("groupName") for p in data.get("producerDataSet") or [] if p.get("groupName")]
    return {"client_id": str(data["clientID"]), "consumers": consumers, "producers": producers}
