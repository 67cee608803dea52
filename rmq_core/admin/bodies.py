"""The admin client's readers of answer bodies in both dialects: rmq's plain JSON and a Java
broker's fastjson, whose maps keyed by MessageQueue objects are not JSON and are read with regexes."""
from __future__ import annotations

import json
import re

from rmq_core.admin.values import OffsetReset
from rmq_core.config import parse_properties
from rmq_core.errors import RMQError
from rmq_core.remoting.body import decode_reset_offset_body, loads_lenient


def _parse_props_text(body: bytes | None) -> dict[str, str]:
    """A `key=value` per line body (GET_BROKER_CONFIG, GET_NAMESRV_CONFIG)."""
    return parse_properties((body or b"").decode("utf-8", "replace"), "config answer")


def parse_mq_offset_table(body: bytes | None) -> list[OffsetReset]:
    """A ResetOffsetBody's offsetTable as OffsetReset rows (remoting.body's decoder, every form)."""
    return [OffsetReset(mq.topic, mq.broker_name, mq.queue_id, offset)
            for mq, offset in decode_reset_offset_body(body).items()]


def _stats_body(body) -> tuple[dict, list[tuple[dict, dict]]]:
    """(the body's other fields, [(MessageQueue json, stats json)]) of a TopicStatsTable /
    ConsumeStats body: rmq writes the offset table as a list of flat rows; Java's fastjson writes a
    map keyed by MessageQueue objects (not JSON), whose entries are read with a regex."""
    if not body:
        return {}, []
    text = bytes(body).decode("utf-8", "replace")
    try:
        d = json.loads(text)
    except ValueError:
        rows = [({"brokerName": m.group(1), "queueId": int(m.group(2)), "topic": m.group(3)}, json.loads(m.group(4)))
                for m in _JAVA_ROW.finditer(text)]
        tps = re.search(r'"consumeTps":(-?[0-9.Ee+-]+)', text)
        return ({"consumeTps": float(tps.group(1))} if tps else {}), rows
    table = d.get("offsetTable") if isinstance(d, dict) else None
    rows = [({"topic": r["topic"], "brokerName": r["brokerName"], "queueId": r["queueId"]}, r)
            for r in table] if isinstance(table, list) else []
    return (d if isinstance(d, dict) else {}), rows


def _consume_stats_list(body) -> dict:
    """ConsumeStatsList with each ConsumeStats' offsetTable as a list of flat rows (rmq's form); a
    Java broker's object-keyed tables are cut per group and read row by row."""
    if not body:
        return {}
    try:
        return loads_lenient(body)
    except RMQError:
        pass
    text = bytes(body).decode("utf-8", "replace")
    starts = list(re.finditer(r'\{"((?:[^"\\]|\\.)*)":\[\{"consumeTps":(-?[0-9.Ee+-]+)', text))
    groups = []
    for i, m in enumerate(starts):
        segment = text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        rows = [{"brokerName": r.group(1), "queueId": int(r.group(2)), "topic": r.group(3), **json.loads(r.group(4))}
                for r in _JAVA_ROW.finditer(segment)]
        groups.append({m.group(1): [{"consumeTps": float(m.group(2)), "offsetTable": rows}]})
    addr = re.search(r'"brokerAddr":"([^"]*)"', text)
    total = re.search(r'"totalDiff":(-?\d+)', text)
    return {"brokerAddr": addr.group(1) if addr else "", "totalDiff": int(total.group(1)) if total else 0,
            "consumeStatsList": groups}


def _running_info(body) -> dict:
    """ConsumerRunningInfo: rmq clients send plain JSON (mqTable a list); a Java client's fastjson
    body keys mqTable by MessageQueue objects, so its rows and properties are read with regexes."""
    try:
        return loads_lenient(body)
    except RMQError:
        pass
    text = bytes(body).decode("utf-8", "replace")
    props = re.search(r'"properties":(\{[^{}]*\})', text)
    subs = re.search(r'"subscriptionSet":(\[[^\]]*\])', text)
    out = {"properties": json.loads(props.group(1)) if props else {}, "mqTable": []}
    try:
        out["subscriptionSet"] = json.loads(subs.group(1)) if subs else []
    except ValueError:
        out["subscriptionSet"] = []
    for m in _JAVA_ROW.finditer(text):
        out["mqTable"].append({"brokerName": m.group(1), "queueId": int(m.group(2)), "topic": m.group(3),
                               **json.loads(m.group(4))})
    return out


_JAVA_ROW = re.compile(r'\{"brokerName":"((?:[^"\\]|\\.)*)","queueId":(\d+),"topic":"((?:[^"\\]|\\.)*)"\}:(\{[^{}]*\})')
