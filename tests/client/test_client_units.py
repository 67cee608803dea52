"""Request building and response parsing without a server: send header, pull response,
heartbeat body, subscriptions, the scheduler, the offset-table parser."""
import json
import threading
import time

import pytest

from rmq_core.client.config import ClientConfig
from rmq_core.client.scheduler import Scheduler
from rmq_core.remoting.body import decode_reset_offset_body
from rmq_core._native.frame import SendHeader, read_send_responses
from rmq_core.client.producer import _RESULTS
from rmq_core.client.pull_api import build_pull_request, process_pull_response
from rmq_core.common.sysflag import build_pull_sys_flag
from rmq_core.client.subscription import build_subscription, heartbeat_body, retry_subscription
from tests.codec_oracle import encode_message_record
from rmq_core.errors import ConfigError, FilterExpressionError, IllegalArgumentError, MQBrokerError
from rmq_core.message import MessageQueue, MessageSelector, PullStatus, SendStatus, java_string_hash
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

MQ = MessageQueue("T", "broker-a", 2)


def _send_header(*, topic, queue_id, sys_flag, born_timestamp, flag, properties, max_reconsume_times=None,
                 batch=False, broker_name="", v2=True):
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE
    header = SendHeader("PG", topic, queue_id, broker_name, "TBW102", 4, code, batch, "PYTHON", 0, v2)
    frame = header.build_frame(sys_flag, flag, properties, 7, b"", born_timestamp, 0, max_reconsume_times)
    return RemotingCommand.decode(frame[4:]).ext_fields


def test_send_header_v2_short_names_and_long_names():
    h = _send_header(topic="T", queue_id=1, sys_flag=0, born_timestamp=5, flag=0, properties={"a": "1"},
                     batch=True, broker_name="broker-a")
    assert h == {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "5", "h": "0",
                 "i": "a\x011\x02", "j": "0", "k": "false", "m": "true", "n": "broker-a"}
    long = _send_header(topic="T", queue_id=1, sys_flag=1, born_timestamp=5, flag=3, properties={},
                        max_reconsume_times=3, v2=False)
    assert long["producerGroup"] == "PG" and long["maxReconsumeTimes"] == "3" and long["batch"] == "false"
    assert long["flag"] == "3" and "a" not in long


def test_send_results_read_from_responses():
    def read(cmd):
        return _RESULTS.make(read_send_responses(cmd.encode(), 1 << 20)[0][0], MQ, "UNIQ")

    r = read(RemotingCommand.create_response(ResponseCode.SUCCESS, ext_fields={
        "msgId": "7F00000100002A9F00000000000007E7", "queueId": "3", "queueOffset": "42"}))
    assert (r.status, r.msg_id, r.offset_msg_id, r.queue.queue_id, r.queue_offset) == (
        SendStatus.SEND_OK, "UNIQ", "7F00000100002A9F00000000000007E7", 3, 42)
    slow = RemotingCommand.create_response(ResponseCode.FLUSH_DISK_TIMEOUT, ext_fields={"queueId": "2", "queueOffset": "1"})
    assert read(slow).status is SendStatus.FLUSH_DISK_TIMEOUT
    assert read(RemotingCommand.create_response(13, "bad")) is None  # a refusal: SendAttempts raises MQBrokerError


def _record(offset, tags, body=b"hello"):
    return encode_message_record(topic="T", body=body, queue_id=2, queue_offset=offset,
                                 properties={"TAGS": tags, "UNIQ_KEY": f"U{offset}"})


def test_pull_response_rechecks_tags_exactly():
    # "Aa" and "BB" share a Java hash code: the broker's tag-code filter cannot tell them apart
    assert java_string_hash("Aa") == java_string_hash("BB")
    sub = build_subscription("T", "Aa")
    body = _record(0, "Aa") + _record(1, "BB") + _record(2, "Aa")
    resp = RemotingCommand.create_response(ResponseCode.SUCCESS, body=body, ext_fields={
        "nextBeginOffset": "3", "minOffset": "0", "maxOffset": "3", "suggestWhichBrokerId": "0"})
    r = process_pull_response(resp, MQ, sub, "addr")
    assert r.status is PullStatus.FOUND and r.next_begin_offset == 3 and r.scanned == 3
    assert [m.queue_offset for m in r.messages] == [0, 2]
    assert r.messages[0].msg_id == "U0" and r.messages[0].broker_name == "broker-a"


@pytest.mark.parametrize("code,status", [(19, PullStatus.NO_NEW_MSG), (20, PullStatus.NO_MATCHED_MSG),
                                         (21, PullStatus.OFFSET_ILLEGAL)])
def test_pull_response_statuses(code, status):
    resp = RemotingCommand.create_response(code, ext_fields={"nextBeginOffset": "7", "minOffset": "1", "maxOffset": "9"})
    r = process_pull_response(resp, MQ, build_subscription("T", "*"), "addr")
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.messages) == (status, 7, 1, 9, [])
    with pytest.raises(MQBrokerError, match="code 24"):
        process_pull_response(RemotingCommand.create_response(24, "no sub"), MQ, build_subscription("T"), "addr")


def test_pull_request_fields():
    sub = build_subscription("T", "TagA || TagB")
    req = build_pull_request(group="CG", mq=MQ, sub=sub, offset=10, max_nums=32,
                             sys_flag=build_pull_sys_flag(True, True, True), commit_offset=8, suspend_timeout_ms=15000)
    e = req.ext_fields
    assert (e["consumerGroup"], e["topic"], e["queueId"], e["queueOffset"], e["maxMsgNums"], e["sysFlag"],
            e["commitOffset"], e["suspendTimeoutMillis"], e["subscription"], e["expressionType"]) == (
        "CG", "T", "2", "10", "32", "7", "8", "15000", "TagA || TagB", "TAG")
    assert build_pull_sys_flag(False, True, True) == 6 and build_pull_sys_flag(False, False, True, lite_pull=True) == 20


def test_subscriptions():
    s = build_subscription("T", " TagA ||  || TagB ")
    assert s.tags_set == ["TagA", "TagB"] and s.code_set == [java_string_hash("TagA"), java_string_hash("TagB")]
    assert s.matches_tag("TagA") and not s.matches_tag("TagC") and not s.matches_tag(None)
    star = build_subscription("T", "*")
    assert star.sub_string == "*" and star.tags_set == [] and star.matches_tag(None)
    sql = build_subscription("T", MessageSelector.by_sql("a > 5"))
    assert sql.expression_type == "SQL92" and sql.sub_string == "a > 5" and sql.matches_tag("anything")
    with pytest.raises(FilterExpressionError):
        build_subscription("T", MessageSelector.by_sql("a > > 5"))
    with pytest.raises(IllegalArgumentError, match="bad subscription expression"):
        build_subscription("T", 5)
    with pytest.raises(IllegalArgumentError, match="bad topic name"):
        build_subscription("bad topic", "*")
    assert retry_subscription("CG").topic == "%RETRY%CG"


def test_heartbeat_body_java_style():
    class C:
        group = "CG"
        consume_type = "CONSUME_PASSIVELY"
        message_model_name = "CLUSTERING"
        consume_from_where_name = "CONSUME_FROM_FIRST_OFFSET"

        def subscriptions(self):
            return [build_subscription("T", "TagA")]

    data = json.loads(heartbeat_body("1.2.3.4@x", ["PG"], [C()]))
    assert data["clientID"] == "1.2.3.4@x" and data["producerDataSet"] == [{"groupName": "PG"}]
    cd = data["consumerDataSet"][0]
    assert cd["consumeType"] == "CONSUME_PASSIVELY" and cd["messageModel"] == "CLUSTERING"
    sd = cd["subscriptionDataSet"][0]
    assert sd["tagsSet"] == ["TagA"] and sd["expressionType"] == "TAG" and isinstance(sd["subVersion"], int)


def test_client_config_validation():
    with pytest.raises(ConfigError, match="bad name server address 'nohost'"):
        ClientConfig(namesrv="nohost")
    with pytest.raises(ConfigError, match="heartbeat_broker_interval must be > 0"):
        ClientConfig(namesrv="127.0.0.1:9876", heartbeat_broker_interval=0)
    c = ClientConfig(namesrv="127.0.0.1:9876;127.0.0.1:9877")
    assert c.namesrv == ["127.0.0.1:9876", "127.0.0.1:9877"]
    # default instance names are unique per object, so two clients never share an id by accident
    assert ClientConfig(namesrv="inproc://x").client_id != ClientConfig(namesrv="inproc://x").client_id


def test_reset_offset_body_forms():
    mq = MessageQueue("T", "b", 1)
    assert decode_reset_offset_body(b'{"offsetTable":{"T@b@1":5}}', "T") == {mq: 5}
    assert decode_reset_offset_body(b'{"offsetTable":[{"brokerName":"b","queueId":1,"offset":6}]}', "T") == {mq: 6}
    nested = b'{"offsetTable":[{"mq":{"topic":"T","brokerName":"b","queueId":1},"offset":8}]}'
    assert decode_reset_offset_body(nested, "T") == {mq: 8}
    fastjson = b'{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:7}}'
    assert decode_reset_offset_body(fastjson, "T") == {mq: 7}


def test_scheduler_runs_periodic_and_once_jobs_and_cancels():
    s = Scheduler("test-sched")
    s.start()
    hits = []
    done = threading.Event()
    h = s.schedule(lambda: hits.append("p"), 0.01, 0.0, "periodic")
    s.schedule(lambda: (hits.append("once"), done.set()), None, 0.05, "once")

    def boom():
        raise RuntimeError("job failure must not kill the scheduler")
    s.schedule(boom, None, 0.0, "boom")
    assert done.wait(5)
    s.cancel(h)
    time.sleep(0.05)
    n = hits.count("p")
    time.sleep(0.05)
    assert hits.count("p") <= n + 1 and hits.count("once") == 1 and n >= 2
    s.stop()
    assert not s._thread.is_alive()


def test_one_group_name_per_producer_and_per_consumer_on_an_instance():
    from rmq_core.client.instance import MQClientInstance
    from rmq_core.errors import MQClientError

    inst = MQClientInstance(ClientConfig(namesrv="127.0.0.1:1"))
    first, second = object(), object()
    inst.register_producer("G", first)
    inst.register_producer("G", first)  # the same producer again: fine
    with pytest.raises(MQClientError, match=r"producer group 'G' is already used by another producer"):
        inst.register_producer("G", second)
    inst.register_consumer("G", second)  # producer and consumer groups are separate tables
    with pytest.raises(MQClientError, match=r"consumer group 'G' is already used by another consumer"):
        inst.register_consumer("G", first)
    assert inst.producers == {"G": first} and inst.consumers == {"G": second}
