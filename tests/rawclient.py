"""A synchronous raw remoting client for tests: its own event loop in a thread, so tests can send
exactly the frames a RocketMQ client would (and malformed ones) without the rmq client library."""
from __future__ import annotations

import asyncio
import json
import threading
import time

from rmq_core.remoting.client import RemotingClient
from rmq_core.remoting.codes import RequestCode
from rmq_core.remoting.command import RemotingCommand


class RawClient:
    def __init__(self, name="raw"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=f"{name}-loop")
        self._thread.start()
        self.client = self.run(self._make(name))

    async def _make(self, name):
        return RemotingClient(name=name)

    def run(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def invoke(self, addr, code, ext=None, body=None, timeout=10.0, language=None):
        req = RemotingCommand.create_request(int(code), ext or {}, body)
        if language:
            req.language = language
        return self.run(self.client.invoke(addr, req, timeout), timeout + 5)

    def invoke_async(self, addr, code, ext=None, body=None, timeout=30.0):
        """Start a request; returns a concurrent Future (for long-polling tests)."""
        req = RemotingCommand.create_request(int(code), ext or {}, body)
        return asyncio.run_coroutine_threadsafe(self.client.invoke(addr, req, timeout), self.loop)

    # --- RocketMQ requests -------------------------------------------------------------------------
    def send(self, addr, topic, body: bytes, tags=None, keys=None, queue_id=0, props=None, sys_flag=0,
             group="PG_RAW", code=RequestCode.SEND_MESSAGE, reconsume_times=0, max_reconsume_times=None):
        p = dict(props or {})
        if tags:
            p["TAGS"] = tags
        if keys:
            p["KEYS"] = keys
        p.setdefault("UNIQ_KEY", f"RAW{time.time_ns():029X}"[-32:])
        pstr = "".join(f"{k}\x01{v}\x02" for k, v in p.items())
        ext = {"producerGroup": group, "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": str(queue_id), "sysFlag": str(sys_flag), "bornTimestamp": str(int(time.time() * 1000)),
               "flag": "0", "properties": pstr, "reconsumeTimes": str(reconsume_times), "unitMode": "false",
               "batch": "false"}
        if max_reconsume_times is not None:
            ext["maxReconsumeTimes"] = str(max_reconsume_times)
        if code == RequestCode.SEND_MESSAGE_V2:
            short = {"producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d",
                     "queueId": "e", "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i",
                     "reconsumeTimes": "j", "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m"}
            ext = {short[k]: v for k, v in ext.items()}
        return self.invoke(addr, code, ext, body)

    def pull(self, addr, topic, queue_id, offset, group="CG_RAW", max_nums=32, sub="*", expression_type="TAG",
             suspend_ms=0, sys_flag=None, timeout=30.0, commit_offset=None, language=None, extra=None):
        flag = sys_flag if sys_flag is not None else (4 | (2 if suspend_ms else 0) | (1 if commit_offset is not None else 0))
        ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
               "maxMsgNums": str(max_nums), "sysFlag": str(flag), "commitOffset": str(commit_offset if commit_offset is not None else 0),
               "suspendTimeoutMillis": str(suspend_ms), "subscription": sub, "subVersion": "0",
               "expressionType": expression_type, **(extra or {})}
        return self.invoke(addr, RequestCode.PULL_MESSAGE, ext, None, timeout, language=language)

    def heartbeat(self, addr, client_id, group, topic, sub="*", model="CLUSTERING", expression_type="TAG"):
        body = {"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": model,
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
            "subscriptionDataSet": [{"topic": topic, "subString": sub, "tagsSet": [], "codeSet": [],
                                     "subVersion": int(time.time() * 1000), "expressionType": expression_type,
                                     "classFilterMode": False}]}]}
        return self.invoke(addr, RequestCode.HEART_BEAT, {}, json.dumps(body).encode())

    def route(self, namesrv, topic):
        resp = self.invoke(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        return resp, (json.loads(resp.body) if resp.code == 0 and resp.body else None)

    def close(self):
        if self.loop.is_closed():
            return
        try:
            self.run(self.client.close(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            self.loop.close()
