"""The broker's topic configs: `TopicConfig` (one topic's queues and permissions), their table
`topics.json` (`TopicConfigTable`, persisted as `config_file.VersionedTable`) and the broker's policy
over it: system topics, auto-creation from TBW102, retry/DLQ topics (RocketMQ's TopicConfigManager).

Writing the table is coalesced (`ConfigManager.persist_soon`): a change schedules a batch,
and every change made while a batch is written shares the next one, so a burst of N creations
costs about two writes, not N.  A batch appends its changes to `topics.json.log` (fdatasync) and
the whole `topics.json` is rewritten (temp file, fsync, rename, fsync of the directory) only once
that journal outgrows the table, so a creation costs the same with 1,000 or 10,000 topics.  An admin creation
(`update_topic_config`) is answered after the write that holds it has finished, and after the
registration that carries it: an acknowledged topic survives a crash (kill -9, power cut) right
after its answer.  A topic a send or a consumer's heartbeat creates on the fly (auto-create, retry,
DLQ) is served at once and written by the next batch, a moment later: a crash in that moment loses
it (the next send or heartbeat creates it again).  On a stop the broker waits for the last batch.
"""
from __future__ import annotations

import asyncio
import logging
import threading

import attrs

from rmq_core.broker.config_file import JsonFields, VersionedTable, non_negative
from rmq_core.broker.message_type import check_topic_attributes
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MixAll, PermName, TopicValidator

log = logging.getLogger("rmq.broker")

TOPICS_FILE = "topics.json"


# --- topic configs (topics.json) ------------------------------------------------------------
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


def _perm(inst, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 15:
        raise IllegalArgumentError(f"{type(inst).__name__}.perm must be within 0..15 (R=4, W=2, X=1), got {value!r}")


def _filter_type(inst, attribute, value):
    if value not in TOPIC_FILTER_TYPES:
        raise IllegalArgumentError(f"bad topicFilterType {value!r}; expected one of {', '.join(TOPIC_FILTER_TYPES)}")


def _attributes(inst, attribute, value):
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise IllegalArgumentError(f"bad topic attribute {k!r}={v!r}: names and values are strings")
    check_topic_attributes(value)


def _topic_name(inst, attribute, value):
    TopicValidator.check_topic(value)


@attrs.frozen
class TopicConfig(JsonFields):
    """One topic's queue counts and permissions (RocketMQ TopicConfig)."""

    topic_name: str = attrs.field(validator=_topic_name)
    read_queue_nums: int = attrs.field(default=16, validator=non_negative)
    write_queue_nums: int = attrs.field(default=16, validator=non_negative)
    perm: int = attrs.field(default=PermName.PERM_READ | PermName.PERM_WRITE, validator=_perm)
    topic_filter_type: str = attrs.field(default="SINGLE_TAG", validator=_filter_type)
    topic_sys_flag: int = attrs.field(default=0, validator=non_negative)
    order: bool = False
    # RocketMQ 5's topic attributes, e.g. {"message.type": "FIFO"} (rmq_core.broker.message_type);
    # written to JSON only when there are some, so a 4.x topic's JSON stays as 4.x writes it
    attributes: dict = attrs.field(factory=dict, converter=lambda v: dict(v or {}), validator=_attributes,
                                   hash=False)

    _JSON = (("topic_name", "topicName"), ("read_queue_nums", "readQueueNums"),
             ("write_queue_nums", "writeQueueNums"), ("perm", "perm"),
             ("topic_filter_type", "topicFilterType"), ("topic_sys_flag", "topicSysFlag"), ("order", "order"),
             ("attributes", "attributes"))
    _WHAT = "topic config"

    def to_json(self) -> dict:
        out = super().to_json()
        if not self.attributes:
            del out["attributes"]
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "TopicConfig":
        kwargs = cls._json_kwargs(obj)
        if "order" in kwargs:
            kwargs["order"] = bool(kwargs["order"])
        return cls(**kwargs)


class TopicConfigTable(VersionedTable):
    """`topics.json`: `{"dataVersion": {...}, "topicConfigTable": {name: TopicConfig JSON}}`.

    Storage only: policy (auto-create, system topics, permissions) lives in the broker."""

    FILE_NAME = TOPICS_FILE
    TABLE_KEY = "topicConfigTable"
    ITEM_TYPE = TopicConfig
    NAME_FIELD = "topic_name"


# --- the broker's policy over the table ---------------------------------------------------------
class TopicConfigManager:
    SCHEDULE_QUEUE_NUMS = 18

    def __init__(self, broker_config, config_dir: str, delay_level_count: int = 18):
        self.broker_config = broker_config
        self.table = TopicConfigTable(config_dir)
        self._lock = threading.RLock()
        self.delay_level_count = delay_level_count
        # fn(topic_config, or None for a deletion) -> a future of the registration carrying it, or None
        self.on_change = None

    def load(self) -> None:
        self.table.load()
        bc = self.broker_config
        sys_topics = [
            (TopicValidator.RMQ_SYS_SELF_TEST_TOPIC, 1, 1, 6),
            (TopicValidator.RMQ_SYS_BENCHMARK_TOPIC, 1024, 1024, 6),
            (bc.broker_cluster_name, 16, 16, PermName.PERM_INHERIT | (PermName.PERM_READ | PermName.PERM_WRITE if bc.cluster_topic_enable else 0)),
            (bc.broker_name, 1, 1, PermName.PERM_INHERIT | (PermName.PERM_READ | PermName.PERM_WRITE if bc.broker_topic_enable else 0)),
            (TopicValidator.RMQ_SYS_OFFSET_MOVED_EVENT, 1, 1, 6),
            (TopicValidator.RMQ_SYS_SCHEDULE_TOPIC, max(self.SCHEDULE_QUEUE_NUMS, self.delay_level_count), max(self.SCHEDULE_QUEUE_NUMS, self.delay_level_count), 6),
            (TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC, 1, 1, 6),
            (TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC, 1, 1, 6),
        ]
        if bc.trace_topic_enable:  # message traces land here (one queue, as RocketMQ makes it)
            sys_topics.append((bc.msg_trace_topic_name, 1, 1, PermName.PERM_READ | PermName.PERM_WRITE))
        if bc.auto_create_topic_enable:
            n = bc.default_topic_queue_nums
            sys_topics.append((TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC, n, n,
                               PermName.PERM_INHERIT | PermName.PERM_READ | PermName.PERM_WRITE))
        for name, r, w, perm in sys_topics:
            existing = self.table.get(name)
            if existing is None or (name == TopicValidator.RMQ_SYS_SCHEDULE_TOPIC and existing.read_queue_nums < r):
                self.table.put(TopicConfig(topic_name=name, read_queue_nums=r, write_queue_nums=w, perm=perm))
        self.table.persist()

    def select(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def all(self) -> dict[str, TopicConfig]:
        return dict(self.table.items())

    async def flush(self) -> None:
        """Wait for the writes under way (a stopping broker calls this)."""
        await self.table.flush()

    def _changed(self, tc: TopicConfig | None, notify: bool) -> list:
        waits = [self.table.persist_soon()]
        if notify and self.on_change:
            waits.append(self.on_change(tc))
        return [w for w in waits if w is not None]

    # --- changes -----------------------------------------------------------------------------------
    def create_or_update(self, tc: TopicConfig, notify: bool = True) -> TopicConfig:
        """Apply at once; the write and the registration follow in the next batch."""
        self._apply(tc, notify)
        return tc

    async def update_topic_config(self, tc: TopicConfig) -> TopicConfig:
        """An admin's creation or update: returns once written to disk and registered (the
        registration is retried by the periodic one if a name server does not answer)."""
        await asyncio.gather(*self._apply(tc, True))
        return tc

    def _apply(self, tc: TopicConfig, notify: bool) -> list:
        TopicValidator.check_topic(tc.topic_name)
        if tc.read_queue_nums < 0 or tc.write_queue_nums < 0:
            raise IllegalArgumentError(f"bad queue numbers for topic {tc.topic_name!r}: "
                                       f"read={tc.read_queue_nums} write={tc.write_queue_nums}")
        with self._lock:
            self.table.put(tc)
        log.info("create/update topic config %s", tc)
        return self._changed(tc, notify)

    def adopt_stored_topics(self, queue_ids: dict[str, list[int]]) -> list[str]:
        """Topics the store holds messages of but this table does not know (a slave that became
        master before its 10 s metadata sync copied a new topic): created with as many queues as
        the store has and full permission, so the new master registers them and the name server
        keeps their routes.  Returns the topics created."""
        made = []
        for topic, qids in queue_ids.items():
            if self.table.get(topic) is not None or not qids:
                continue
            n = max(qids) + 1
            self.create_or_update(TopicConfig(topic_name=topic, read_queue_nums=n, write_queue_nums=n, perm=6))
            made.append(topic)
        if made:
            log.warning("topics held in the store but missing from the topic table, created: %s", ", ".join(made))
        return made

    def delete(self, topic: str) -> bool:
        with self._lock:
            if self.table.get(topic) is None:
                return False
            self.table.delete(topic)
        self._changed(None, True)
        return True

    def create_topic_in_send_message_method(self, topic: str, default_topic: str | None, remote_addr: str,
                                            client_default_topic_queue_nums: int, topic_sys_flag: int = 0) -> TopicConfig | None:
        """Auto-create `topic` on first send, inheriting from the default topic (TBW102) as RocketMQ
        does when autoCreateTopicEnable is on.  Returns None when not allowed."""
        with self._lock:
            tc = self.table.get(topic)
            if tc is not None:
                return tc
            default_topic = default_topic or TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC
            default_tc = self.table.get(default_topic)
            if default_tc is None or not self.broker_config.auto_create_topic_enable:
                return None
            if default_topic == TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC and not self.broker_config.auto_create_topic_enable:
                return None
            if not (default_tc.perm & PermName.PERM_INHERIT):
                log.warning("create new topic failed: default topic %s has no inherit permission", default_topic)
                return None
            n = max(1, min(client_default_topic_queue_nums or default_tc.write_queue_nums, default_tc.write_queue_nums))
            tc = TopicConfig(topic_name=topic, read_queue_nums=n, write_queue_nums=n,
                             perm=default_tc.perm & ~PermName.PERM_INHERIT, topic_sys_flag=topic_sys_flag)
            log.info("auto create topic %s from default topic %s for %s", topic, default_topic, remote_addr)
        return self.create_or_update(tc)

    def create_topic_in_send_back(self, topic: str, queue_nums: int, perm: int, topic_sys_flag: int = 0) -> TopicConfig:
        with self._lock:
            tc = self.table.get(topic)
            if tc is not None:
                return tc
            tc = TopicConfig(topic_name=topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums,
                             perm=perm, topic_sys_flag=topic_sys_flag)
        return self.create_or_update(tc)

    def retry_topic(self, group: str, queue_nums: int = 1) -> TopicConfig:
        return self.create_topic_in_send_back(MixAll.get_retry_topic(group), queue_nums, 6)

    def dlq_topic(self, group: str) -> TopicConfig:
        return self.create_topic_in_send_back(MixAll.get_dlq_topic(group), 1, 6)

    def serialize_wrapper(self) -> dict:
        """TopicConfigSerializeWrapper for REGISTER_BROKER / GET_ALL_TOPIC_CONFIG."""
        return {
            "topicConfigTable": {name: tc.to_json() for name, tc in self.table.items()},
            "dataVersion": self.table.data_version.to_json(),
        }
