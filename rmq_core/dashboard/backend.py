"""What the console's pages ask the cluster, over the admin client (rmq_core.admin): each call is
an admin call or a few of them, shaped into the rows the pages show (plain dicts, JSON-ready).

Lookups that fail because a name is unknown raise AdminError with one line naming it; the HTTP
app turns that into the page's error bar."""
from __future__ import annotations

import time

import attrs

from rmq_core.admin.values import TOOLS_CONSUMER_GROUP, replica_state
from rmq_core.dashboard.charts import line_chart
from rmq_core.dashboard.history import DEFAULT_INTERVAL, StatsHistory
from rmq_core.errors import IllegalArgumentError, RMQError
from rmq_core.message import MixAll, TopicValidator
from rmq_core.remoting.codes import MQVersion

BODY_PREVIEW = 512  # characters of a body shown in tables
NOT_CONSUMED, CONSUMED = "NOT_CONSUMED_YET", "CONSUMED"


def topic_kind(topic: str, system: set[str]) -> str:
    if MixAll.is_retry_topic(topic):
        return "retry"
    if MixAll.is_dlq_topic(topic):
        return "dlq"
    if topic in system or TopicValidator.is_system_topic(topic):
        return "system"
    return "normal"


def body_preview(body: bytes | None) -> str:
    body = bytes(body or b"")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:  # binary: its first bytes in hex
        return "0x" + body[:BODY_PREVIEW // 2].hex() + ("…" if len(body) > BODY_PREVIEW // 2 else "")
    return text[:BODY_PREVIEW] + ("…" if len(text) > BODY_PREVIEW else "")


def message_row(m) -> dict:
    return {
        "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id, "topic": m.topic, "tags": m.tags or "",
        "keys": m.keys or "", "broker_name": m.broker_name or "", "qid": m.queue_id, "queue_offset": m.queue_offset,
        "store_time": m.store_timestamp, "born_time": m.born_timestamp, "born_host": m.born_host,
        "reconsume_times": m.reconsume_times, "body_size": len(m.body or b""), "body_preview": body_preview(m.body),
        "properties": dict(m.properties),
    }


class Backend:
    """The console's calls over one AdminClient (shared by the HTTP server's threads)."""

    def __init__(self, admin, namesrv: str = "", history: StatsHistory | None = None):
        self.admin = admin
        self.namesrv = namesrv
        self.history = history  # the sampled time series the charts draw (None: no charts)

    @classmethod
    def connect(cls, namesrv: str, access_key: str | None = None, secret_key: str | None = None,
                stats_interval: float | None = DEFAULT_INTERVAL) -> "Backend":
        """A backend over a new AdminClient; with `stats_interval` (seconds), a sampler of the
        charts' time series (started by `serve`) over its own AdminClient, so a slow sample never
        holds a page."""
        from rmq_core.admin.client import AdminClient

        history = None
        if stats_interval:
            history = StatsHistory(AdminClient(namesrv, access_key=access_key, secret_key=secret_key),
                                   interval=stats_interval)
        return cls(AdminClient(namesrv, access_key=access_key, secret_key=secret_key), namesrv, history)

    def close(self) -> None:
        if self.history is not None:
            self.history.stop()
            self.history.admin.close()
        self.admin.close()

    # --- charts (history.py's series drawn by charts.py) ------------------------------------------
    def _history(self) -> StatsHistory:
        if self.history is None:
            raise IllegalArgumentError("this console samples no statistics (started with a stats interval of 0)")
        return self.history

    def charts(self) -> dict:
        """The dashboard page: every broker's in and out TPS and the busiest topics' TPS over time."""
        h = self._history()
        brokers = h.broker_series()
        waiting = f"collecting: a point every {h.interval:g} s"
        return {
            "interval": h.interval,
            "points": max((len(s) for s in brokers.values()), default=0),
            "brokers_in": line_chart("Broker InTPS", {n: [(p[0], p[1]) for p in s] for n, s in brokers.items()},
                                     "messages/s", waiting),
            "brokers_out": line_chart("Broker OutTPS", {n: [(p[0], p[2]) for p in s] for n, s in brokers.items()},
                                      "messages/s", waiting),
            "topics": line_chart("Busiest topics' InTPS", h.busiest_topics(5), "messages/s",
                                 waiting if not brokers else "no topic has had messages in yet"),
        }

    def history_data(self) -> dict:
        h = self._history()
        return {"interval": h.interval, "brokers": h.broker_series(), "topics": h.busiest_topics(10)}

    def topic_chart(self, topic: str) -> dict:
        h = self._history()
        series = h.topic_series(topic)
        return {"points": len(series), "svg": line_chart(f"{topic} InTPS", {topic: series} if series else {},
                                                         "messages/s", f"collecting: a point every {h.interval:g} s")}

    def group_chart(self, group: str) -> dict:
        h = self._history()
        series = h.group_series(group)
        lag = {"lag": [(p[0], p[1]) for p in series]} if series else {}
        return {"points": len(series), "svg": line_chart(f"{group} lag (Diff Total)", lag, "messages",
                                                         f"collecting: a point every {h.interval:g} s")}

    # --- cluster and topics ------------------------------------------------------------------------
    def _system_names(self, brokers) -> set[str]:
        # a broker's and a cluster's own name are topics too (clusterTopicEnable / brokerTopicEnable)
        return {b.cluster for b in brokers} | {b.broker_name for b in brokers}

    def cluster(self) -> dict:
        admin = self.admin
        brokers = admin.brokers()
        rows = []
        for b in brokers:
            row = {"cluster": b.cluster, "broker_name": b.broker_name, "bid": b.broker_id,
                   "role": "MASTER" if b.broker_id == 0 else "SLAVE", "addr": b.addr, "version": "",
                   "in_tps": None, "out_tps": None, "msg_put_total": None, "msg_get_total": None, "disk_ratio": None,
                   "replication": "", "lag_bytes": None, "epoch": None, "sync_state_set": None}
            try:
                rt = admin.broker_runtime_info(b.addr)
            except RMQError as e:  # a broker that does not answer still gets its row
                row["version"] = f"unreachable: {e}"
            else:
                row.update(version=rt.get("brokerVersionDesc", ""), in_tps=_float(rt.get("putTps")),
                           out_tps=_float(rt.get("getTransferedTps")), msg_put_total=_int(rt.get("msgPutTotalTodayNow")),
                           msg_get_total=_int(rt.get("msgGetTotalTodayNow")), disk_ratio=_float(rt.get("commitLogDiskRatio")))
                row.update(replication_of(rt))
                # controller mode: the master epoch and sync state set the broker follows (its
                # runtime info has them from its last heartbeat, so no controller address is needed)
                _role, row["epoch"], row["sync_state_set"] = replica_state(rt)
            rows.append(row)
        return {"namesrv": self.namesrv, "brokers": rows, "topics": self._topics(brokers)}

    def _topics(self, brokers) -> list[dict]:
        system = self._system_names(brokers)
        return [{"topic": t, "kind": topic_kind(t, system)} for t in sorted(self.admin.topic_list())]

    def topics(self) -> list[dict]:
        return self._topics(self.admin.brokers())

    def topic_status(self, topic: str) -> list[dict]:
        return [{"broker_name": q.broker_name, "qid": q.queue_id, "min_offset": q.min_offset,
                 "max_offset": q.max_offset, "last_updated": q.last_update_timestamp}
                for q in self.admin.topic_stats(topic)]

    def create_topic(self, topic: str, queues: int, cluster: str | None = None) -> dict:
        TopicValidator.check_topic(topic)  # IllegalArgumentError naming the bad name
        if not 1 <= queues <= 1024:
            raise IllegalArgumentError(f"queue count {queues} outside 1..1024")
        admin = self.admin
        names = []
        for b in admin.brokers(cluster):
            if b.broker_id != 0:
                continue
            admin.create_or_update_topic(b.addr, topic, read_queue_nums=queues, write_queue_nums=queues)
            names.append(b.broker_name)
        return {"topic": topic, "queues": queues, "brokers": names}

    def delete_topic(self, topic: str) -> dict:
        admin = self.admin
        clusters = admin.topic_clusters(topic)  # raises naming an unknown topic
        addrs = []
        for c in clusters:
            addrs += admin.delete_topic(topic, c)
        return {"topic": topic, "brokers": addrs}

    # --- consumer groups ---------------------------------------------------------------------------
    def groups(self) -> list[dict]:
        admin = self.admin
        rows = []
        for g in admin.consumer_groups():
            if g == TOOLS_CONSUMER_GROUP:
                continue  # the group the admin tools (this console too) pull with
            stats = admin.consume_stats(g)
            members, model, ctype, online = 0, "", "", False
            try:
                conn = admin.consumer_connection(g)
            except RMQError:  # no live member: the group is offline (its model and type are its members')
                pass
            else:
                members, model, ctype, online = len(conn.connections), conn.message_model, conn.consume_type, True
            rows.append({"group": g, "online": online, "members": members, "message_model": model, "consume_type": ctype,
                         "consume_tps": stats.consume_tps, "diff_total": stats.diff_total,
                         "inflight_total": stats.inflight_total})
        return rows

    def group(self, group: str) -> dict:
        admin = self.admin
        stats = admin.consume_stats(group)  # raises naming an unknown group
        members, subs = [], {}
        try:
            conn = admin.consumer_connection(group)
        except RMQError:
            conn = None
        if conn is not None:
            members = [{"client_id": c.client_id, "addr": c.client_addr, "language": c.language,
                        "version": MQVersion.desc(c.version)}  # V4_9_4, V5_1_2: as consumerConnection prints it
                       for c in conn.connections]
            subs = dict(conn.subscriptions)
        progress = [{"topic": q.topic, "broker_name": q.broker_name, "qid": q.queue_id, "broker_offset": q.broker_offset,
                     "consumer_offset": q.consumer_offset, "diff": q.diff, "inflight": q.inflight,
                     "last_time": q.last_timestamp}
                    for q in stats.queues]
        return {"group": group, "members": members, "subscriptions": subs, "progress": progress,
                "consume_tps": stats.consume_tps, "diff_total": stats.diff_total,
                "inflight_total": stats.inflight_total}

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict:
        moved = self.admin.reset_offset_by_time(topic, group, timestamp)
        return {"group": group, "topic": topic, "timestamp": timestamp,
                "queues": [{"broker_name": o.broker_name, "qid": o.queue_id, "offset": o.offset} for o in moved]}

    # --- messages ------------------------------------------------------------------------------------
    def _with_delivery(self, msgs) -> list[dict]:
        """Rows with, per group consuming the topic, whether its committed offset is past the message."""
        admin = self.admin
        consumers: dict[str, list[str]] = {}
        addrs: dict[str, str] = {}
        rows = []
        for m in msgs:
            row = message_row(m)
            if m.topic not in consumers:
                consumers[m.topic] = [g for g in admin.topic_consumed_by(m.topic)
                                      if g != TOOLS_CONSUMER_GROUP] if not MixAll.is_dlq_topic(m.topic) else []
            if m.broker_name and m.broker_name not in addrs:
                addrs[m.broker_name] = admin.broker_addr(m.broker_name)
            delivery = []
            for g in consumers[m.topic]:
                off = admin.query_consumer_offset(addrs[m.broker_name], g, m.topic, m.queue_id) if m.broker_name else -1
                delivery.append({"group": g, "consumer_offset": off,
                                 "state": CONSUMED if off > m.queue_offset else NOT_CONSUMED})
            row["delivery"] = delivery
            rows.append(row)
        return rows

    def message_by_id(self, msg_id: str, topic: str | None = None) -> list[dict]:
        try:
            msg = self.admin.view_message(msg_id, topic)
        except RMQError:
            if topic:
                raise
            # (the admin client's own hint names its CLI flag)
            raise IllegalArgumentError(f"message {msg_id!r} not found as an offset message id; to look it up "
                                       f"as the producer's unique id, give its topic too") from None
        return self._with_delivery([msg])

    def message_trace(self, msg_id: str, trace_topic: str | None = None) -> list[dict]:
        """The message's trace records (queryMsgTraceById's rows), oldest first."""
        return [v.to_json() for v in self.admin.message_trace(msg_id, trace_topic)]

    def messages_by_key(self, topic: str, key: str, max_num: int = 64) -> list[dict]:
        return self._with_delivery(self.admin.query_messages(topic, key, max_num))

    def messages_by_time(self, topic: str, begin: int, end: int | None, max_num: int = 64) -> list[dict]:
        """Messages stored between begin and end (ms; end defaults to now), oldest first, at most
        max_num over all queues."""
        admin = self.admin
        end = int(time.time() * 1000) if end is None else end
        if end < begin:
            raise IllegalArgumentError(f"end {end} is before begin {begin}")
        found = []
        for mq in admin.queues(topic):
            addr = admin.broker_addr(mq.broker_name)
            lo = admin.search_offset(addr, topic, mq.queue_id, begin)
            hi = admin.max_offset(addr, topic, mq.queue_id)
            for m in admin.iter_messages(mq, lo, min(hi, lo + max_num)):
                if m.store_timestamp > end:
                    break
                if m.store_timestamp >= begin:
                    found.append(m)
        found.sort(key=lambda m: (m.store_timestamp, m.broker_name or "", m.queue_id, m.queue_offset))
        return self._with_delivery(found[:max_num])

    def resend_message(self, topic: str, msg_id: str) -> dict:
        admin = self.admin
        msg = admin.view_message(msg_id, topic)
        out = admin.resend(msg, msg.topic)
        return {"msg_id": out.msg_id, "offset_msg_id": out.offset_msg_id, "status": out.status,
                "broker_name": out.broker_name, "qid": out.queue_id, "queue_offset": out.queue_offset}

    # --- dead letters --------------------------------------------------------------------------------
    def dlq_groups(self) -> list[dict]:
        """The groups that have a dead-letter queue (%DLQ%group) and how many dead letters it holds."""
        rows = []
        for t in self.admin.topic_list():
            if not MixAll.is_dlq_topic(t):
                continue
            try:
                count = sum(q.max_offset - q.min_offset for q in self.admin.topic_stats(t))
            except RMQError:  # (deleted meanwhile, or its broker away)
                count = None
            rows.append({"group": t[len(MixAll.DLQ_GROUP_TOPIC_PREFIX):], "dead_letters": count})
        return rows

    def dlq(self, group: str, max_num: int = 64) -> list[dict]:
        rows = []
        for m in self.admin.dlq_messages(group)[-max_num:]:
            row = message_row(m)
            row["origin_topic"] = m.properties.get("RETRY_TOPIC", "")
            rows.append(row)
        return rows

    def dlq_resend(self, group: str, msg_ids: list[str] | None = None) -> dict:
        out = self.admin.dlq_resend(group, msg_ids)
        return {"group": group, "resent": len(out), "ids": [o.msg_id for o in out]}


def replication_of(rt: dict) -> dict:
    """A broker's place in its group from its runtime info: a master's slaves and how far the
    furthest is behind, or a slave's master and how far it is behind (bytes)."""
    role = rt.get("brokerRole")
    if not role:
        return {}
    lag = _int(rt.get("slaveFallBehindBytes"))
    if role == "SLAVE":
        master = rt.get("masterBrokerAddr") or "?"
        connected = rt.get("haConnected") == "True"
        text = f"SLAVE of {master}" + ("" if connected else " (not connected)")
    else:
        n = _int(rt.get("haConnectionNum")) or 0
        text = f"{role}, {n} slave{'s' if n != 1 else ''}"
        if n == 0:
            lag = None  # no slave: nothing is behind
    return {"replication": text, "lag_bytes": lag}


def _float(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
