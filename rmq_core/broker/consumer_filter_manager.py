"""Broker-side registry of expression subscriptions (RocketMQ's ConsumerFilterManager).

For every (topic, consumer group) that subscribes with a non-TAG expression (SQL92, or a type a
filter plugin adds) the manager keeps the compiled filter, the group's bloom bit positions and the
subscription version, and persists them to `<store>/config/consumerFilter.json`.

Two users:
- the dispatcher (`CalcBitMapDispatcher`, RocketMQ's CommitLogDispatcherCalcBitMap) asks
  `calc_bit_map(topic, properties, store_timestamp)` once per stored message: each registered
  filter of the topic is evaluated once and the groups that match get their bits set in the
  message's bit map, which the store keeps beside the consume-queue entry;
- the pull path asks `build_message_filter(group, topic, type, expression, sub_version)` for the
  `MessageFilter` the store's scan applies: tag hash codes for TAG, bloom bits + the expression
  for the rest.

Correctness rule: a bloom miss may only skip a message that truly does not match.  A bit map only
says something about the subscriptions that were registered when it was computed, so the bloom
test is limited to entries stored after the subscription's `born_time` (RocketMQ's
ConsumerFilterData.isMsgInLive); older entries, entries without a bit map and entries whose map has
another size are candidates and get the full expression evaluation.  To make "stored after
born_time" imply "bit map computed with this subscription" even if the clock steps back, the born
time is never earlier than the newest store timestamp the dispatcher has seen (both under one
lock), and on load from disk every subscription is re-born at load time, because messages
dispatched while it was not in memory (before a crash, during recovery) lack its bits.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Callable, Iterable, Mapping

import attrs

from rmq_core.common.clock import now_ms
from rmq_core.common.files import atomic_write
from rmq_core.config import BrokerConfig, MessageStoreConfig
from rmq_core.errors import ConfigError, FilterExpressionError, PluginNotFoundError
from rmq_core.filtering import MessageFilter
from rmq_core.message import ExpressionType
from rmq_core.plugins import get_filter_factory

log = logging.getLogger("rmq.broker.filter")  # (RocketMQ's RocketmqFilter log)

CONSUMER_FILTER_FILE = "consumerFilter.json"
DEAD_FILTER_RETENTION_MS = 24 * 3600 * 1000  # RocketMQ's filterDataCleanTimeSpan default



class PropertyFilterDisabledError(ConfigError):
    """A consumer asked for property (SQL92) filtering on a broker where it is switched off."""

    def __init__(self, expression_type: str, broker_config=None):
        self.expression_type = expression_type
        super().__init__(
            f"the broker does not support filtering messages by {expression_type}: property "
            "filtering is off (enablePropertyFilter=false); set enablePropertyFilter=true in "
            f"broker.conf, or on the running broker with: {enable_command(broker_config)}"
        )


def enable_command(bc) -> str:
    """The `rmq admin` line that switches property filtering on for this broker, runnable as
    printed: its name servers (-n) and its own address (-b) as the name servers know it."""
    import shlex

    if bc is None:
        return "rmq admin updateBrokerConfig -b BROKER_ADDR -k enablePropertyFilter -v true"
    namesrv = ";".join(a for a in bc.namesrv_addr_list if "://" not in a)  # (in-proc: not for a shell)
    n = f"-n {shlex.quote(namesrv)} " if namesrv else ""
    return f"rmq admin updateBrokerConfig {n}-b {bc.broker_addr} -k enablePropertyFilter -v true"


def _bloom_module():
    # The bloom filter is broker infrastructure (the consume-queue ext bit map), needed whatever
    # expression plugins are installed, so it lives in rmq_core.
    from rmq_core import bloom

    return bloom


@attrs.define(eq=False)
class ConsumerFilterData:
    """One group's expression subscription to one topic (RocketMQ's ConsumerFilterData)."""

    consumer_group: str
    topic: str
    expression: str
    expression_type: str
    born_time: int
    dead_time: int = 0
    bloom_filter_data: Any = None  # BloomFilterData
    client_version: int = 0
    compiled: MessageFilter | None = attrs.field(default=None, repr=False)

    def is_dead(self) -> bool:
        return self.dead_time >= self.born_time

    def how_long_after_death(self, now_ms: int) -> int:
        return now_ms - self.dead_time if self.is_dead() else -1

    def is_msg_in_live(self, store_time_ms: int) -> bool:
        """True when a message stored at `store_time_ms` had its bit map computed with this data."""
        return store_time_ms > self.born_time

    def to_json(self) -> dict:
        return {
            "consumerGroup": self.consumer_group,
            "topic": self.topic,
            "expression": self.expression,
            "expressionType": self.expression_type,
            "bornTime": self.born_time,
            "deadTime": self.dead_time,
            "bloomFilterData": self.bloom_filter_data.to_json() if self.bloom_filter_data else None,
            "clientVersion": self.client_version,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "ConsumerFilterData":
        bloom = _bloom_module()
        bfd = d.get("bloomFilterData")
        return cls(
            consumer_group=str(d["consumerGroup"]),
            topic=str(d["topic"]),
            expression=str(d["expression"]),
            expression_type=str(d["expressionType"]),
            born_time=int(d.get("bornTime", 0)),
            dead_time=int(d.get("deadTime", 0)),
            bloom_filter_data=bloom.BloomFilterData.from_json(bfd) if bfd else None,
            client_version=int(d.get("clientVersion", 0)),
        )


class BloomMessageFilter(MessageFilter):
    """Pull-side filter for a registered subscription: bloom bits first, then the expression."""

    def __init__(self, compiled: MessageFilter, bloom_bits: tuple, bloom_bit_num: int, bloom_born_time: int):
        self.compiled = compiled
        self.expression_type = compiled.expression_type
        self.expression = compiled.expression
        self.tag_codes = compiled.tag_codes
        self.needs_commit_log_check = compiled.needs_commit_log_check
        self.bloom_bits = tuple(bloom_bits)
        self.bloom_bit_num = bloom_bit_num
        self.bloom_born_time = bloom_born_time
        self.is_matched_by_commit_log = compiled.is_matched_by_commit_log  # no extra call per message

    def is_matched_by_tag(self, tag: str | None) -> bool:
        return self.compiled.is_matched_by_tag(tag)

    def __repr__(self) -> str:
        return (
            f"BloomMessageFilter({self.expression_type} {self.expression!r}, bits={self.bloom_bits}, "
            f"born={self.bloom_born_time})"
        )


def _subscription_fields(sub) -> tuple[str, str, str, int]:
    """(topic, expression_type, expression, sub_version) from a tuple or a SubscriptionData-like object."""
    if isinstance(sub, tuple):
        topic, expression_type, expression, sub_version = sub
    else:
        topic = sub.topic
        expression_type = getattr(sub, "expression_type", None)
        expression = getattr(sub, "sub_string", None)
        if expression is None:
            expression = getattr(sub, "expression", None)
        sub_version = getattr(sub, "sub_version", 0)
    return topic, (expression_type or ExpressionType.TAG).upper(), expression, int(sub_version or 0)


class ConsumerFilterManager:
    def __init__(
        self,
        broker_config: BrokerConfig | None = None,
        store_config: MessageStoreConfig | None = None,
        *,
        config_path: str | None = None,
        clock: Callable[[], int] = now_ms,
    ):
        self.broker_config = broker_config or BrokerConfig()
        bloom = _bloom_module()
        self.bloom_filter = bloom.BloomFilter(
            expected_count=self.broker_config.expect_consumer_num_use_filter,
            error_rate_percent=self.broker_config.max_error_rate_of_bloom_filter,
        )
        if store_config is not None:
            # As RocketMQ does: the consume-queue ext's bit maps are exactly m bits.
            store_config.bit_map_length_consume_queue_ext = self.bloom_filter.m
        if config_path is None and store_config is not None:
            config_path = os.path.join(store_config.config_dir, CONSUMER_FILTER_FILE)
        self.config_path = config_path
        self._bit_map_bytes = self.bloom_filter.byte_length
        self._clock = clock
        self._lock = threading.RLock()
        self._by_topic: dict[str, dict[str, ConsumerFilterData]] = {}
        self._max_store_time_seen = 0
        # Per topic, what the dispatcher needs: (matcher, bloom mask) pairs.  Rebuilt lazily after
        # any change to the registry, so a dispatch does no per-group validation work.
        self._dispatch_plans: dict[str, tuple] = {}

    # --- registration ---------------------------------------------------------------------------
    def _changed(self) -> None:
        self._dispatch_plans.clear()

    def _born_time(self) -> int:
        return max(self._clock(), self._max_store_time_seen)

    def _build(self, topic: str, group: str, expression: str, expression_type: str, client_version: int):
        try:
            compiled = get_filter_factory(expression_type)(expression)
        except (FilterExpressionError, PluginNotFoundError) as e:
            log.error("consumer filter not registered: group=%s topic=%s: %s", group, topic, e)
            return None
        return ConsumerFilterData(
            consumer_group=group,
            topic=topic,
            expression=expression,
            expression_type=expression_type,
            born_time=self._born_time(),
            bloom_filter_data=self.bloom_filter.generate(f"{group}#{topic}"),
            client_version=client_version,
            compiled=compiled,
        )

    def register(self, topic: str, group: str, expression: str, expression_type: str, client_version: int = 0) -> bool:
        """Register or refresh one subscription; True when the registry now holds it (RocketMQ's rules:
        an older or equal version never replaces a newer one; a changed expression is re-born)."""
        expression_type = (expression_type or ExpressionType.TAG).upper()
        if ExpressionType.is_tag_type(expression_type) or not expression:
            return False
        with self._lock:
            self._changed()
            by_group = self._by_topic.setdefault(topic, {})
            old = by_group.get(group)
            if old is None:
                data = self._build(topic, group, expression, expression_type, client_version)
                if data is None:
                    return False
                by_group[group] = data
                log.info("new consumer filter registered: %s", data)
                return True
            if client_version <= old.client_version:
                if (expression_type, expression) != (old.expression_type, old.expression):
                    log.warning(
                        "ignore consumer filter of %s on %s: version %d <= %d but the expression changed "
                        "(kept %s %r, ignored %s %r)", group, topic, client_version, old.client_version,
                        old.expression_type, old.expression, expression_type, expression,
                    )
                if client_version == old.client_version and old.is_dead():
                    old.dead_time = 0
                    return True
                return False
            changed = (expression_type, expression) != (old.expression_type, old.expression) or (
                old.bloom_filter_data != self.bloom_filter.generate(f"{group}#{topic}")
            )
            if changed:
                data = self._build(topic, group, expression, expression_type, client_version)
                if data is None:
                    # The new expression does not compile: drop the old one, the client reports the error.
                    del by_group[group]
                    return False
                by_group[group] = data
                log.info("consumer filter changed: old=%s new=%s", old, data)
                return True
            old.client_version = client_version
            if old.is_dead():
                old.dead_time = 0
            return True

    def register_group(self, group: str, subscriptions: Iterable) -> None:
        """Register a heartbeat's subscriptions of `group`; its other expression subscriptions die.

        Each subscription is a (topic, expression_type, expression, sub_version) tuple or an object
        with `topic`, `expression_type`, `sub_string` (or `expression`) and `sub_version`."""
        subs = [_subscription_fields(s) for s in subscriptions]
        for topic, expression_type, expression, sub_version in subs:
            self.register(topic, group, expression, expression_type, sub_version)
        topics = {s[0] for s in subs}
        with self._lock:
            now = self._clock()
            for data in self.get_by_group(group):
                if data.topic not in topics and not data.is_dead():
                    data.dead_time = max(now, data.born_time)
                    log.info("consumer filter of %s no longer subscribed, dead: %s", group, data)

    def unregister(self, group: str) -> None:
        """The group left (all its consumers are gone): its filters die, and are removed a day later."""
        with self._lock:
            now = self._clock()
            for by_group in self._by_topic.values():
                data = by_group.get(group)
                if data is not None and not data.is_dead():
                    data.dead_time = max(now, data.born_time)

    def get(self, topic: str, group: str) -> ConsumerFilterData | None:
        with self._lock:
            return self._by_topic.get(topic, {}).get(group)

    def get_by_topic(self, topic: str) -> list[ConsumerFilterData]:
        with self._lock:
            return list(self._by_topic.get(topic, {}).values())

    def get_by_group(self, group: str) -> list[ConsumerFilterData]:
        with self._lock:
            return [d for by_group in self._by_topic.values() for g, d in by_group.items() if g == group]

    def check_expression_type_supported(self, expression_type: str | None) -> None:
        """Raise PropertyFilterDisabledError for SQL92 when enablePropertyFilter is off."""
        t = (expression_type or ExpressionType.TAG).upper()
        if t == ExpressionType.SQL92 and not self.broker_config.enable_property_filter:
            raise PropertyFilterDisabledError(t, self.broker_config)

    # --- dispatch side --------------------------------------------------------------------------
    def calc_bit_map(self, topic: str, properties: Mapping[str, str] | None, store_timestamp: int | None = None) -> bytes | None:
        """The message's filter bit map (m/8 bytes), or None when no bit map is kept for the topic."""
        if not self.broker_config.enable_calc_filter_bit_map:
            return None
        with self._lock:
            # Plan and store time under one lock: a subscription registered after this point is
            # born no earlier than this message's store time, so its bloom test will not trust
            # this bit map (which lacks its bits).
            if store_timestamp is not None and store_timestamp > self._max_store_time_seen:
                self._max_store_time_seen = store_timestamp
            plan = self._dispatch_plans.get(topic)
            if plan is None:
                plan = self._dispatch_plans[topic] = self._dispatch_plan(topic)
        if not plan:
            return None
        props = properties if properties is not None else {}
        bits = 0
        for matches, mask in plan:
            try:
                if matches(props):
                    bits |= mask
            except Exception:  # a plugin's filter failing must not stop the dispatch
                log.exception("calc filter bit map failed on topic %s", topic)
        return bits.to_bytes(self._bit_map_bytes, "little")

    def _dispatch_plan(self, topic: str) -> tuple:
        # Every registered data of the topic, dead ones included (as RocketMQ): a consumer that
        # comes back with the same subscription finds the bits of what was stored meanwhile.
        plan = []
        for data in self._by_topic.get(topic, {}).values():
            if data.compiled is None or not self.bloom_filter.is_valid(data.bloom_filter_data):
                continue
            plan.append((data.compiled.is_matched_by_commit_log, data.bloom_filter_data.mask))
        return tuple(plan)

    # --- pull side ------------------------------------------------------------------------------
    def build_message_filter(
        self, group: str, topic: str, expression_type: str | None, expression: str | None, sub_version: int = 0
    ) -> MessageFilter:
        """The filter the store's scan applies for one pull (raises FilterExpressionError for a
        malformed expression and PropertyFilterDisabledError for SQL92 on a broker without it)."""
        t = (expression_type or ExpressionType.TAG).upper()
        if ExpressionType.is_tag_type(t):
            return get_filter_factory(ExpressionType.TAG)(expression)
        self.check_expression_type_supported(t)
        compiled = get_filter_factory(t)(expression)
        if not self.broker_config.enable_calc_filter_bit_map:
            return compiled
        data = self.get(topic, group)
        # Bits are only meaningful when they were computed from this very expression.  The
        # subscription version does not matter for correctness: an equal expression gives equal
        # bits, and born_time limits the test to maps computed while this data was registered.
        if (
            data is None
            or data.compiled is None
            or (data.expression_type, data.expression) != (t, expression)
            or not self.bloom_filter.is_valid(data.bloom_filter_data)
        ):
            return compiled
        return BloomMessageFilter(compiled, data.bloom_filter_data.bit_pos, self.bloom_filter.m, data.born_time)

    # --- persistence ----------------------------------------------------------------------------
    def clean(self) -> None:
        """Forget subscriptions dead for longer than a day, and topics left without any."""
        with self._lock:
            now = self._clock()
            for topic in list(self._by_topic):
                by_group = self._by_topic[topic]
                for group in list(by_group):
                    if by_group[group].how_long_after_death(now) >= DEAD_FILTER_RETENTION_MS:
                        log.info("remove consumer filter dead for too long: %s", by_group[group])
                        del by_group[group]
                        self._changed()
                if not by_group:
                    del self._by_topic[topic]

    def encode(self) -> str:
        self.clean()
        with self._lock:
            table = {
                topic: {"topic": topic, "groupFilterData": {g: d.to_json() for g, d in by_group.items()}}
                for topic, by_group in self._by_topic.items()
            }
        return json.dumps({"filterDataByTopic": table}, indent=2, sort_keys=True)

    def _require_path(self) -> str:
        if not self.config_path:
            raise ConfigError("ConsumerFilterManager has no config path: pass store_config or config_path")
        return self.config_path

    def persist(self) -> None:
        """Write consumerFilter.json atomically: a temporary file, fsync, rename, fsync the folder."""
        path = self._require_path()
        with self._lock:  # one writer of the .tmp file at a time
            atomic_write(path, self.encode().encode("utf-8"))

    def load(self) -> bool:
        """Read consumerFilter.json if present; True when something was loaded.

        Every loaded subscription is marked dead (its consumers must heartbeat again) and re-born
        now: bit maps written while it was not in memory lack its bits."""
        path = self._require_path()
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return False
        try:
            doc = json.loads(raw.decode("utf-8"))
            table = doc.get("filterDataByTopic") or {}
            loaded = {
                topic: {g: ConsumerFilterData.from_json(d) for g, d in (entry.get("groupFilterData") or {}).items() if d}
                for topic, entry in table.items()
                if entry
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        now = self._born_time()
        for by_group in loaded.values():
            for data in by_group.values():
                if not self.bloom_filter.is_valid(data.bloom_filter_data):
                    log.info("bloom filter changed (%s): ignoring the persisted consumer filters", self.bloom_filter)
                    return False
        for by_group in loaded.values():
            for data in by_group.values():
                try:
                    data.compiled = get_filter_factory(data.expression_type)(data.expression)
                except (FilterExpressionError, PluginNotFoundError) as e:
                    log.error("cannot compile persisted consumer filter %s: %s", data, e)
                data.born_time = max(data.born_time, now)
                data.dead_time = max(data.dead_time, data.born_time)
        with self._lock:
            self._by_topic = loaded
            self._changed()
        return True


class CalcBitMapDispatcher:
    """Store dispatcher computing each message's filter bit map (CommitLogDispatcherCalcBitMap).

    Add it before the consume-queue dispatcher so the map is set when the ext entry is written,
    and add it (and load the manager) before the store recovers, so re-dispatched messages get
    bits too."""

    def __init__(self, manager: ConsumerFilterManager):
        self.manager = manager

    def dispatch(self, request) -> None:
        request.bit_map = self.manager.calc_bit_map(
            request.topic, request.properties, getattr(request, "store_timestamp", None)
        )
