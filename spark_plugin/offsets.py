"""Offset ranges of a topic's queues, positions by time or group, and committing a group's offsets.

Everything here runs on the driver (or the data source's planner process) and talks to the name
server and the brokers through rmq_core's client instance (the same route look-ups and offset
requests the pull consumer makes).  Nothing here imports pyspark.

Positions are keyed by (broker name, queue id): two brokers that both have a queue 0 are two queues.
In JSON (startingOffsets / endingOffsets, streaming offsets) they read
``{"broker-a": {"0": 23, "1": -2}}`` with -2 = earliest and -1 = latest, as Kafka's source does.
"""
from __future__ import annotations

import json
import logging
import uuid

import attrs

from rmq_core.errors import IllegalArgumentError, MQBrokerError, MQClientError, RemotingError
from rmq_core.message import MessageQueue, TopicValidator

log = logging.getLogger("rmq.spark")

EARLIEST = -2
LATEST = -1
_ADMIN_TIMEOUT = 10.0


class DataLossError(IllegalArgumentError):
    """Retention deleted part of a requested range (failOnDataLoss=true)."""


@attrs.frozen
class Account:
    """The ACL account (options accessKey / secretKey) the driver's and the executors' clients sign
    with; picklable, so that a partition carries it to its executor (the secret kept out of reprs)."""

    access_key: str
    secret_key: str = attrs.field(repr=False)

    @classmethod
    def of(cls, access_key: str | None, secret_key: str | None) -> "Account | None":
        """None when neither is given; one without the other is refused naming the missing option."""
        from rmq_core.acl import signer_from
        from rmq_core.errors import ConfigError
        try:
            if signer_from(access_key, secret_key, owner="rmq Spark") is None:
                return None
        except ConfigError:
            missing = "secretKey" if access_key else "accessKey"
            raise IllegalArgumentError(f"option {missing!r} is missing: ACL credentials need both accessKey and "
                                       "secretKey") from None
        return cls(str(access_key), str(secret_key))

    @property
    def kwargs(self) -> dict:
        """As a client's access_key= / secret_key=."""
        return {"access_key": self.access_key, "secret_key": self.secret_key}


def account_kwargs(account: "Account | None") -> dict:
    return account.kwargs if account is not None else {}


def _non_negative(inst, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise IllegalArgumentError(f"OffsetRange.{attribute.name} must be an int >= 0, got {value!r}")


def _until_not_before_from(inst, attribute, value):
    _non_negative(inst, attribute, value)
    if value < inst.from_offset:
        raise IllegalArgumentError(
            f"reversed offset range of {inst.topic}@{inst.broker_name}:{inst.queue_id}: "
            f"until_offset {value} < from_offset {inst.from_offset}")


@attrs.frozen
class OffsetRange:
    """Messages [from_offset, until_offset) of one queue (KafkaRDD's OffsetRange, keyed by broker
    and queue)."""

    topic: str
    broker_name: str
    queue_id: int = attrs.field(validator=_non_negative)
    from_offset: int = attrs.field(validator=_non_negative)
    until_offset: int = attrs.field(validator=_until_not_before_from)

    @property
    def count(self) -> int:
        return self.until_offset - self.from_offset

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id} [{self.from_offset}, {self.until_offset})"


# --- the driver's client ----------------------------------------------------------------------------
class QueueAdmin:
    """Routes and offsets of topics over one client instance (closed by `close()` / `with`)."""

    def __init__(self, namesrv: str, account: Account | None = None):
        from rmq_core.client.config import ClientConfig
        from rmq_core.client.instance import MQClientInstance

        if not namesrv or not isinstance(namesrv, str):
            raise IllegalArgumentError(f"the name server address (option 'namesrv') is missing: got {namesrv!r}")
        self.namesrv = namesrv
        try:
            config = ClientConfig(namesrv=namesrv, instance_name=f"spark-{uuid.uuid4().hex[:12]}",
                                  **account_kwargs(account))
        except Exception as e:
            raise IllegalArgumentError(f"bad name server address {namesrv!r}: {e}") from None
        self.instance = MQClientInstance(config)
        self.instance.start()
        self._closed = False

    def __enter__(self) -> "QueueAdmin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.instance.shutdown()

    def _run(self, coro):
        return self.instance.run(coro, timeout=_ADMIN_TIMEOUT + 5)

    def route(self, topic: str):
        try:
            TopicValidator.check_topic(topic)
        except Exception as e:
            raise IllegalArgumentError(f"bad topic {topic!r}: {e}") from None
        try:
            route = self._run(self.instance.get_topic_route(topic, _ADMIN_TIMEOUT))
        except (MQClientError, RemotingError) as e:
            raise MQClientError(f"name server {self.namesrv!r} unreachable while looking up topic {topic!r}: {e}") from None
        if route is None or not route.queue_datas:
            raise IllegalArgumentError(f"topic {topic!r} does not exist on name server {self.namesrv!r}")
        # remember the brokers (the offset requests below find them through this table)
        for bd in route.broker_datas:
            self.instance.broker_addr_table[bd.broker_name] = dict(bd.broker_addrs)
        self.instance.topic_route_table[topic] = route
        return route

    def queues(self, topic: str) -> tuple[list[MessageQueue], dict[str, dict[int, str]]]:
        """The readable queues of `topic` (sorted by broker, queue id) and each broker's addresses
        (broker id -> host:port, so an executor can follow suggestWhichBrokerId)."""
        route = self.route(topic)
        addrs = {bd.broker_name: dict(bd.broker_addrs) for bd in route.broker_datas}
        return [mq for mq in route.subscribe_queues(topic) if mq.broker_name in addrs], addrs

    def min_offset(self, mq: MessageQueue) -> int:
        from rmq_core.client.pull_api import min_offset
        # a queue that never had a message has no consume queue yet: the broker says -1
        return max(0, self._call(min_offset(self.instance, mq), mq))

    def max_offset(self, mq: MessageQueue) -> int:
        from rmq_core.client.pull_api import max_offset
        return max(0, self._call(max_offset(self.instance, mq), mq))

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        from rmq_core.client.pull_api import search_offset
        return self._call(search_offset(self.instance, mq, timestamp_ms), mq)

    def committed_offset(self, group: str, mq: MessageQueue) -> int | None:
        """The group's broker-side offset of mq, None when it has none."""
        from rmq_core.client.pull_api import query_consumer_offset
        from rmq_core.remoting.codes import ResponseCode
        try:
            return self._call(query_consumer_offset(self.instance, group, mq), mq)
        except MQBrokerError as e:
            if e.code == ResponseCode.QUERY_NOT_FOUND:
                return None
            raise

    def group_knows_topic(self, group: str, topic: str) -> bool:
        """True when some broker of `topic` holds an offset of `group` for it (GET_CONSUME_STATS
        over the group's topics, as mqadmin consumerProgress asks)."""
        from rmq_core.remoting.codes import RequestCode
        from rmq_core.remoting.command import RemotingCommand
        for name, addrs in sorted(self.instance.broker_addr_table.items()):
            addr = addrs.get(0)
            if addr is None or name not in {q.broker_name for q in self.route(topic).queue_datas}:
                continue
            req = RemotingCommand.create_request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": group})
            try:
                resp = self._run(self.instance.invoke_broker(addr, req, _ADMIN_TIMEOUT))
            except RemotingError as e:
                raise MQClientError(f"broker {name!r} unreachable: {e}") from None
            table = json.loads(resp.body or b"{}").get("offsetTable") or []
            if any(e.get("topic") == topic for e in table):
                return True
        return False

    def commit_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        from rmq_core.client.pull_api import update_consumer_offset
        self._call(update_consumer_offset(self.instance, group, mq, offset, False), mq)

    def _call(self, coro, mq: MessageQueue):
        try:
            return self._run(coro)
        except RemotingError as e:
            raise MQClientError(f"broker {mq.broker_name!r} unreachable for {mq}: {e}") from None


# --- positions ---------------------------------------------------------------------------------------
def parse_positions(value, option: str = "startingOffsets"):
    """'earliest' | 'latest' | JSON {"broker": {"queue id": offset}} | dict -> EARLIEST, LATEST or
    {(broker, queue id): offset}.  Raises IllegalArgumentError naming the option and the value."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "earliest":
            return EARLIEST
        if text.lower() == "latest":
            return LATEST
        try:
            value = json.loads(text)
        except ValueError as e:
            raise IllegalArgumentError(
                f"malformed {option} {text!r}: expected 'earliest', 'latest' or JSON like "
                f'{{"broker-a": {{"0": 23, "1": -2}}}} ({e})') from None
    if not isinstance(value, dict):
        raise IllegalArgumentError(f"malformed {option} {value!r}: expected a JSON object of brokers")
    out: dict[tuple[str, int], int] = {}
    for broker, queues in value.items():
        if not isinstance(queues, dict):
            raise IllegalArgumentError(f"malformed {option}: broker {broker!r} maps to {queues!r}, "
                                       "expected an object of queue id -> offset")
        for qid, off in queues.items():
            try:
                q = int(qid)
            except (TypeError, ValueError):
                raise IllegalArgumentError(f"malformed {option}: queue id {qid!r} of broker {broker!r} "
                                           "is not an integer") from None
            if not isinstance(off, int) or isinstance(off, bool) or off < -2 or q < 0:
                raise IllegalArgumentError(f"bad {option}: offset {off!r} of {broker}:{qid} (expected an "
                                           "offset >= 0, -2 = earliest or -1 = latest)")
            out[(broker, q)] = off
    return out


def positions_to_json(positions: dict[tuple[str, int], int]) -> dict:
    """{(broker, qid): offset} -> {"broker": {"qid": offset}} (a streaming offset)."""
    out: dict[str, dict[str, int]] = {}
    for (broker, qid), off in sorted(positions.items()):
        out.setdefault(broker, {})[str(qid)] = int(off)
    return out


def positions_from_json(value: dict) -> dict[tuple[str, int], int]:
    if isinstance(value, str):
        value = json.loads(value)
    return {(b, int(q)): int(o) for b, qs in value.items() for q, o in qs.items()}


def _parse_bound(value, option):
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise IllegalArgumentError(f"bad {option} {value!r}: a timestamp (epoch ms) must be >= 0")
        return ("time", value)
    if value is None:
        return None
    return ("pos", parse_positions(value, option))


def resolve(admin: QueueAdmin, mq: MessageQueue, spec, default: int, lo: int, hi: int, option: str) -> int:
    """One queue's offset for a start/end spec: ('time', ms), ('pos', EARLIEST|LATEST|{...}), None."""
    if spec is None:
        pos = default
    elif spec[0] == "time":
        return min(max(admin.offset_for_timestamp(mq, spec[1]), lo), hi)
    else:
        table = spec[1]
        pos = table.get((mq.broker_name, mq.queue_id), default) if isinstance(table, dict) else table
    if pos == EARLIEST:
        return lo
    if pos == LATEST:
        return hi
    return pos


def check_positions_name_queues(spec, queues: list[MessageQueue], topic: str, option: str) -> None:
    """A JSON position naming a broker/queue the topic does not have is a typo: say so."""
    if spec is None or spec[0] != "pos" or not isinstance(spec[1], dict):
        return
    known = {(mq.broker_name, mq.queue_id) for mq in queues}
    for key in spec[1]:
        if key not in known:
            raise IllegalArgumentError(
                f"{option} names queue {key[1]} of broker {key[0]!r}, which topic {topic!r} does not have "
                f"(queues: {sorted(known)})")


def offset_ranges(namesrv: str, topic: str, *, group: str | None = None, start=None, end=None,
                  admin: QueueAdmin | None = None, access_key: str | None = None,
                  secret_key: str | None = None) -> list[OffsetRange]:
    """Every (broker, queue) of `topic` as an OffsetRange.

    start: 'earliest' (default), 'latest', an epoch-ms timestamp (the broker's offset by time), or
    positions JSON/dict; with `group`, from the group's committed offset (queues it never
    committed start at their earliest).  end: 'latest' (default), 'earliest', a timestamp or
    positions.  access_key / secret_key: the ACL account to sign with."""
    if group is not None and start is not None:
        raise IllegalArgumentError("offset_ranges: give either group= or start=, not both")
    start_spec = _parse_bound(start, "start")
    end_spec = _parse_bound(end, "end")
    account = Account.of(access_key, secret_key)
    own = admin is None
    admin = admin or QueueAdmin(namesrv, account)
    try:
        queues, _ = admin.queues(topic)
        check_positions_name_queues(start_spec, queues, topic, "start")
        check_positions_name_queues(end_spec, queues, topic, "end")
        committed = {}
        if group is not None:
            if not admin.group_knows_topic(group, topic):
                raise IllegalArgumentError(f"consumer group {group!r} has no committed offset on any queue of "
                                           f"topic {topic!r}")
            committed = {mq: admin.committed_offset(group, mq) for mq in queues}
        out = []
        for mq in queues:
            lo, hi = admin.min_offset(mq), admin.max_offset(mq)
            if group is not None:
                c = committed[mq]
                frm = lo if c is None or c < 0 else c
            else:
                frm = resolve(admin, mq, start_spec, EARLIEST, lo, hi, "start")
            until = resolve(admin, mq, end_spec, LATEST, lo, hi, "end")
            check_range(mq, frm, until, hi)
            out.append(OffsetRange(topic, mq.broker_name, mq.queue_id, frm, until))
        return out
    finally:
        if own:
            admin.close()


def check_range(mq: MessageQueue, frm: int, until: int, max_offset: int) -> None:
    """A range is refused when reversed or past the queue's max offset."""
    name = f"queue {mq.queue_id} of broker {mq.broker_name!r} (topic {mq.topic!r})"
    if frm < 0 or until < 0:
        raise IllegalArgumentError(f"negative offset range [{frm}, {until}) of {name}")
    if until < frm:
        raise IllegalArgumentError(f"reversed offset range of {name}: from {frm} > until {until}")
    if until > max_offset:
        raise IllegalArgumentError(
            f"offset range [{frm}, {until}) of {name} runs past the queue's max offset {max_offset}")


def check_data_loss(mq: MessageQueue, frm: int, until: int, min_offset: int, fail: bool) -> int:
    """The first offset to read of [frm, until) when retention has moved the queue's min offset to
    `min_offset`: raises DataLossError (fail) or warns and skips to the first kept offset."""
    if frm >= min_offset or frm >= until:
        return frm
    lost_until = min(min_offset, until)
    msg = (f"data loss in queue {mq.queue_id} of broker {mq.broker_name!r} (topic {mq.topic!r}): offsets "
           f"[{frm}, {lost_until}) were deleted by retention (the queue now starts at {min_offset})")
    if fail:
        raise DataLossError(msg + "; set failOnDataLoss=false to continue from the first kept offset")
    log.warning("%s; continuing from offset %d (failOnDataLoss=false)", msg, lost_until)
    return lost_until


def split_by_backlog(backlog: dict, max_rows: int | None) -> dict:
    """How many messages each queue gives to a micro-batch of at most max_rows: all of its backlog
    when everything fits, else a share proportional to its backlog (rounded down, what rounding
    leaves going to the largest backlogs), never more than its backlog."""
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return dict(backlog)
    shares = {k: (max_rows * b) // total for k, b in backlog.items()}
    left = max_rows - sum(shares.values())
    for k in sorted(backlog, key=lambda k: (-backlog[k], k)):
        if left <= 0:
            break
        if shares[k] < backlog[k]:
            shares[k] += 1
            left -= 1
    return shares


def commit_offsets(namesrv: str, group: str, ranges, *, admin: QueueAdmin | None = None,
                   access_key: str | None = None, secret_key: str | None = None) -> None:
    """Set `group`'s broker-side offset of each range's queue to its until_offset (signed with the
    ACL account access_key / secret_key when given)."""
    if not group or not isinstance(group, str):
        raise IllegalArgumentError(f"bad consumer group {group!r}")
    account = Account.of(access_key, secret_key)
    own = admin is None
    admin = admin or QueueAdmin(namesrv, account)
    try:
        for r in ranges:
            if not isinstance(r, OffsetRange):
                raise IllegalArgumentError(f"commit_offsets takes OffsetRanges, got {r!r}")
            admin.commit_offset(group, r.queue, r.until_offset)
    finally:
        if own:
            admin.close()




__all__ = ["Account", "OffsetRange", "QueueAdmin", "DataLossError", "offset_ranges", "commit_offsets", "parse_positions",
           "positions_to_json", "positions_from_json", "check_range", "check_data_loss", "split_by_backlog",
           "EARLIEST", "LATEST"]
