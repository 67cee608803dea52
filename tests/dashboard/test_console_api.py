"""The console's HTTP side without a browser: static pages shipped in the package, the JSON API's
answers and its one-line errors, `rmq dashboard`'s own errors, `rmq standalone --dashboard`."""
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from rmq_core import Message, Producer, standalone
from rmq_core.dashboard import serve
from tests.servers import RmqProcess, free_port


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def post(url, body: bytes):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with standalone(store=str(tmp_path_factory.mktemp("console-api") / "store")) as cluster:
        with Producer("PG_API", namesrv=cluster.namesrv) as p:
            sent = [p.send(Message("ApiTopic", f"m{i}".encode(), keys=f"k{i}")) for i in range(5)]
        server = serve(cluster.tcp_namesrv, "127.0.0.1", 0, stats_interval=0.2)
        try:
            yield server.url, sent
        finally:
            server.stop()


def test_static_pages_are_served_from_the_package(console):
    url, _ = console
    status, ctype, body = get(url)
    assert status == 200 and ctype.startswith("text/html") and b'<script src="app.js">' in body
    for name, kind in (("index.html", "text/html"), ("app.js", "javascript"), ("style.css", "text/css")):
        status, ctype, body = get(url + name)
        assert status == 200 and kind in ctype and len(body) > 500
        # nothing is fetched from elsewhere at run time: no absolute URL in any asset
        assert b"http://" not in body and b"https://" not in body and b'"//' not in body, name
    status, _, body = get(url + "../../etc/passwd")
    assert status == 404 and b"no such page" in body


def test_api_answers_and_one_line_errors(console):
    url, sent = console
    status, _, body = get(url + "api/cluster")
    c = json.loads(body)
    assert status == 200 and [b["broker_name"] for b in c["brokers"]] == ["broker-a"]
    assert {"topic": "ApiTopic", "kind": "normal"} in c["topics"]
    status, _, body = get(url + "api/topic?topic=ApiTopic")
    assert status == 200 and sum(q["max_offset"] for q in json.loads(body)) == 5
    status, _, body = get(url + f"api/messages?id={sent[2].msg_id}&topic=ApiTopic")
    [m] = json.loads(body)
    assert (m["msg_id"], m["body_preview"], m["keys"]) == (sent[2].msg_id, "m2", "k2")

    status, _, body = get(url + f"api/messages?id={sent[2].msg_id}")  # a unique id without its topic
    assert status == 400 and "give its topic too" in json.loads(body)["error"]
    status, _, body = get(url + f"api/messages?id={sent[2].offset_msg_id}")  # an offset id needs none
    assert status == 200 and json.loads(body)[0]["body_preview"] == "m2"
    for path, needle in (("api/topic?topic=NoSuchTopic", "NoSuchTopic"), ("api/group?group=NoSuchGroup", "NoSuchGroup"),
                         ("api/topic", "missing parameter 'topic'"), ("api/dlq?group=G&max=many", "'max' must be an integer"),
                         ("api/messages?topic=ApiTopic", "search by id=")):
        status, ctype, body = get(url + path)
        err = json.loads(body)["error"]
        assert status == 400 and ctype.startswith("application/json") and needle in err and "\n" not in err, (path, err)
    status, _, body = get(url + "api/nothing")
    assert status == 404 and "no such API" in json.loads(body)["error"]
    status, err = post(url + "api/topic", b"{not json")
    assert status == 400 and err["error"].startswith("bad JSON body")
    status, err = post(url + "api/topic", json.dumps({"topic": "bad topic!", "queues": 4}).encode())
    assert status == 400 and "bad topic!" in err["error"]
    status, err = post(url + "api/dlq/resend", json.dumps({"group": "G", "ids": "one"}).encode())
    assert status == 400 and "'ids' must be a list" in err["error"]


def test_dashboard_command_errors_are_one_line():
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "dashboard"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and r.stderr.strip() == "rmq dashboard: error: no name server: pass -n HOST:PORT or set NAMESRV_ADDR"
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "dashboard", "-n", "127.0.0.1:1", "--stats-interval", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == ("rmq dashboard: error: bad stats interval -1.0: expected seconds > 0 "
                                                      "(or 0 for a console without charts)"), r.stderr


def test_charts_draw_the_sampled_series(console):
    url, _ = console

    def history():
        status, _, body = get(url + "api/history")
        assert status == 200
        return json.loads(body)

    # the brokers' TPS every sample; ApiTopic, which had sends, among the busiest topics
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        h = history()
        if len(h["brokers"].get("broker-a/0", ())) >= 2 and "ApiTopic" in h["topics"]:
            break
        time.sleep(0.2)
    assert h["interval"] == 0.2 and len(h["brokers"]["broker-a/0"]) >= 2, h
    t, in_tps, out_tps = h["brokers"]["broker-a/0"][-1]
    assert t > 0 and in_tps >= 0 and out_tps >= 0
    assert any(tps > 0 for _, tps in h["topics"]["ApiTopic"]), h["topics"]
    status, _, body = get(url + "api/charts")
    charts = json.loads(body)
    assert status == 200 and charts["points"] >= 2
    for key, title in (("brokers_in", "Broker InTPS"), ("brokers_out", "Broker OutTPS"), ("topics", "Busiest topics")):
        assert charts[key].startswith("<svg") and title in charts[key] and "broker-a/0" in charts["brokers_in"]
    assert "ApiTopic" in charts["topics"]
    status, _, body = get(url + "api/chart/topic?topic=ApiTopic")
    one = json.loads(body)
    assert status == 200 and one["points"] >= 1 and "ApiTopic InTPS" in one["svg"]
    status, _, body = get(url + "api/chart/group?group=NoSuchGroup")  # never sampled: an empty chart that says why
    assert status == 200 and json.loads(body)["points"] == 0 and "collecting: a point every 0.2 s" in json.loads(body)["svg"]


def test_standalone_serves_the_console(tmp_path):
    ns, broker, console = free_port(), free_port(), free_port()
    proc = RmqProcess(["standalone", "--store", str(tmp_path / "store"), "--namesrv-listen", f"127.0.0.1:{ns}",
                       "--broker-listen", f"127.0.0.1:{broker}", "--dashboard", f"127.0.0.1:{console}"],
                      ("rmq console on",))
    try:
        proc.wait_boot()
        status, _, body = get(f"http://127.0.0.1:{console}/api/cluster")
        assert status == 200 and json.loads(body)["brokers"][0]["addr"] == f"127.0.0.1:{broker}"
    finally:
        assert proc.terminate() == 0
