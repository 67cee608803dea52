"""Pieces of `rmq admin` that need no server: header keys, timestamps, Java's fastjson bodies."""
import argparse
import datetime

import pytest

from rmq_core.admin.bodies import _stats_body, parse_mq_offset_table
from rmq_core.admin.values import OffsetReset
from rmq_core.admin.commands import parse_bool, parse_timestamp
from rmq_core.admin.output import Output, snake


@pytest.mark.parametrize("header,key", [
    ("Broker Name", "broker_name"), ("QID", "qid"), ("Min Offset", "min_offset"), ("ClientId", "client_id"),
    ("InTPS", "in_tps"), ("PCWait(ms)", "pc_wait_ms"), ("InMsg24Hour", "in_msg24_hour"), ("LastTime", "last_time"),
    ("#Diff Total", "diff_total"), ("BID", "bid"), ("SPACE", "space")])
def test_json_keys_are_the_headers_in_snake_case(header, key):
    assert snake(header) == key


def test_mqadmin_timestamp_forms():
    assert parse_timestamp("1700000000123") == 1700000000123
    want = int(datetime.datetime(2026, 11, 25, 14, 0, 0, 5000).timestamp() * 1000)
    assert parse_timestamp("2026-11-25#14:00:00:005") == want
    assert abs(parse_timestamp("now") - datetime.datetime.now().timestamp() * 1000) < 5000
    with pytest.raises(argparse.ArgumentTypeError, match="bad timestamp 'yesterday'"):
        parse_timestamp("yesterday")
    assert parse_bool("true") is True and parse_bool("False") is False
    with pytest.raises(argparse.ArgumentTypeError, match="bad boolean 'maybe'"):
        parse_bool("maybe")


def test_java_object_keyed_offset_tables_are_read():
    # fastjson writes Map<MessageQueue, X> with object keys (not JSON): what an Apache broker answers
    reset = b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:12,{"brokerName":"broker-a","queueId":1,"topic":"T"}:7}}'
    assert parse_mq_offset_table(reset) == [OffsetReset("T", "broker-a", 0, 12), OffsetReset("T", "broker-a", 1, 7)]
    ours = b'{"offsetTable":[{"brokerName":"b","queueId":2,"topic":"T","offset":3}]}'
    assert parse_mq_offset_table(ours) == [OffsetReset("T", "b", 2, 3)]
    stats = (b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:'
             b'{"brokerOffset":10,"consumerOffset":4,"lastTimestamp":1700000000000}}}')
    meta, rows = _stats_body(stats)
    assert meta == {"consumeTps": 1.5}
    assert rows == [({"brokerName": "broker-a", "queueId": 0, "topic": "T"},
                     {"brokerOffset": 10, "consumerOffset": 4, "lastTimestamp": 1700000000000})]


def test_json_output_is_the_table_rows(capsys):
    out = Output(as_json=True)
    out.table(["Broker Name", "QID", "Max Offset"], [("broker-a", 0, 5), ("broker-a", 1, 7)])
    out.message("not in the JSON")
    out.finish()
    import json
    assert json.loads(capsys.readouterr().out) == [{"broker_name": "broker-a", "qid": 0, "max_offset": 5},
                                                   {"broker_name": "broker-a", "qid": 1, "max_offset": 7}]


def test_java_consumer_running_info_is_read():
    from rmq_core.admin.bodies import _running_info
    body = (b'{"jstack":"","mqTable":{{"brokerName":"broker-a","queueId":1,"topic":"T"}:{"cachedMsgCount":2,'
            b'"commitOffset":40,"locked":false}},"properties":{"consumeType":"CONSUME_PASSIVELY","messageModel":'
            b'"CLUSTERING"},"statusTable":{},"subscriptionSet":[{"subString":"*","topic":"T"}]}')
    info = _running_info(body)
    assert info["properties"]["messageModel"] == "CLUSTERING"
    assert info["subscriptionSet"] == [{"subString": "*", "topic": "T"}]
    assert info["mqTable"] == [{"brokerName": "broker-a", "queueId": 1, "topic": "T", "cachedMsgCount": 2,
                                "commitOffset": 40, "locked": False}]


def test_java_broker_consume_stats_list_is_read():
    from rmq_core.admin.bodies import _consume_stats_list
    row = b'{{"brokerName":"broker-a","queueId":%d,"topic":"T"}:{"brokerOffset":%d,"consumerOffset":%d,"lastTimestamp":0}}'
    body = (b'{"brokerAddr":"10.0.0.1:10911","consumeStatsList":[{"G1":[{"consumeTps":0.5,"offsetTable":'
            + row % (0, 10, 4) + b'}]},{"G2":[{"consumeTps":0.0,"offsetTable":' + row % (1, 3, 3) + b'}]}],"totalDiff":6}')
    d = _consume_stats_list(body)
    assert d["brokerAddr"] == "10.0.0.1:10911" and d["totalDiff"] == 6
    assert [list(item) for item in d["consumeStatsList"]] == [["G1"], ["G2"]]
    g1 = d["consumeStatsList"][0]["G1"][0]
    assert g1["consumeTps"] == 0.5
    assert g1["offsetTable"] == [{"brokerName": "broker-a", "queueId": 0, "topic": "T", "brokerOffset": 10,
                                  "consumerOffset": 4, "lastTimestamp": 0}]
