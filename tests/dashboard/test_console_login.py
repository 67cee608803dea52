"""The console's login and its ACL account, against real `rmq namesrv` + `rmq broker` processes with
aclEnable=true and `rmq dashboard --users FILE --access-key ... --secret-key ...`: in headless
Chromium no session shows the login page, a wrong password is refused, the right one opens the
console, logout ends the session; an API call without the session cookie is answered 401; the
console's admin calls are signed with its account (and refused by the broker without one)."""
import http.client
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.dashboard.test_console_api import get, post
from tests.dashboard.test_console_browser import browser, wait_css  # noqa: F401 (the browser fixture)
from tests.servers import NamesrvAndBroker, RmqProcess, free_port

ADMIN_AK, ADMIN_SK = "console-admin", "console-secret-1"
PLAIN_ACL = f"""\
accounts:
  - accessKey: {ADMIN_AK}
    secretKey: {ADMIN_SK}
    admin: true
  - accessKey: console-app
    secretKey: console-app-secret
    admin: false
    defaultTopicPerm: PUB|SUB
"""


def adduser(path, name, password):
    return subprocess.run([sys.executable, "-m", "rmq_core.cli", "dashboard", "adduser", str(path), name],
                          input=password + "\n", capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console-acl")
    acl = tmp / "plain_acl.yml"
    acl.write_text(PLAIN_ACL)
    c = NamesrvAndBroker(tmp, broker_props={"aclEnable": "true", "plainAclFile": str(acl)})
    c.tmp = tmp
    try:
        yield c
    finally:
        c.stop()


def start_console(cluster, *args, env=None):
    port = free_port()
    proc = RmqProcess(["dashboard", "-n", cluster.namesrv, "--listen", f"127.0.0.1:{port}", *args], ("rmq console",),
                      env=env)
    proc.wait_boot()
    return proc, f"http://127.0.0.1:{port}/"


def test_adduser_writes_salted_hashes_only(tmp_path):
    users = tmp_path / "users"
    r = adduser(users, "alice", "s3cret-pass")
    assert r.returncode == 0 and "user alice added" in r.stdout, r.stderr
    assert adduser(users, "bob", "s3cret-pass").returncode == 0
    text = users.read_text()
    assert "s3cret-pass" not in text and oct(users.stat().st_mode & 0o777) == "0o600"
    [a, b] = text.splitlines()
    # the same password under two random salts: two different hashes
    assert a.startswith("alice:scrypt$") and b.startswith("bob:scrypt$") and a.split(":")[1] != b.split(":")[1]
    r = adduser(users, "bad name!", "x")
    assert r.returncode == 2 and r.stderr.strip().startswith("rmq dashboard: error: bad user name 'bad name!'")
    r = adduser(users, "carol", "abc")  # a 3-character password is refused, and nothing is written
    assert r.returncode == 2 and "a console password needs at least 8 characters; the one given for carol has 3" \
        in r.stderr, r.stderr
    assert "carol" not in users.read_text()


def test_non_loopback_without_users_is_refused_in_one_line():
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "dashboard", "-n", "127.0.0.1:1", "--listen",
                        f"0.0.0.0:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "refusing to serve the console on 0.0.0.0 without a login" in r.stderr and "--users FILE" in r.stderr


def test_any_address_with_users_serves_behind_the_login(acl_cluster, tmp_path):
    users = tmp_path / "users"
    assert adduser(users, "ops", "right-password").returncode == 0
    port = free_port()
    proc = RmqProcess(["dashboard", "-n", acl_cluster.namesrv, "--listen", f"0.0.0.0:{port}", "--users", str(users)],
                      ("rmq console",))
    try:
        proc.wait_boot()
        status, _, body = get(f"http://127.0.0.1:{port}/api/topics")
        assert status == 401 and "not logged in" in json.loads(body)["error"]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/", method="GET")
        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(req, timeout=20)
            raise AssertionError("the console page was served without a session")
        except urllib.error.HTTPError as e:
            assert e.code == 302 and e.headers["Location"] == "/login.html"
    finally:
        assert proc.terminate() == 0


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None


def test_login_in_chromium_and_signed_admin_calls(acl_cluster, browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    users = tmp_path / "users"
    assert adduser(users, "ops", "right-password").returncode == 0
    # the account from the environment, as `rmq admin` reads it
    proc, url = start_console(acl_cluster, "--users", str(users),
                              env={"RMQ_ACCESS_KEY": ADMIN_AK, "RMQ_SECRET_KEY": ADMIN_SK})
    try:
        # the API without a session: 401 with a JSON error, for GETs and POSTs alike
        status, ctype, body = get(url + "api/cluster")
        assert status == 401 and ctype.startswith("application/json") and "not logged in" in json.loads(body)["error"]
        status, err = post(url + "api/topic", json.dumps({"topic": "Sneaky", "queues": 1}).encode())
        assert status == 401 and "not logged in" in err["error"]

        d = browser
        d.get(url + "#/topics")  # no session: the login page
        wait_css(d, "#login-form")
        assert d.current_url.startswith(url + "login.html")
        d.find_element(By.ID, "user").send_keys("ops")
        d.find_element(By.ID, "password").send_keys("wrong-password")
        d.find_element(By.ID, "login").click()
        wait_css(d, "#error", "wrong user name or password")
        assert d.current_url.startswith(url + "login.html")

        d.find_element(By.ID, "password").send_keys("right-password")
        d.find_element(By.ID, "login").click()
        wait_css(d, "#chart-broker-in svg")  # the dashboard: the charts the console samples, signed
        d.get(url + "#/cluster")
        wait_css(d, "#brokers td", "broker-a")  # the cluster page: broker runtime info, signed
        assert wait_css(d, "#session-user").text == "ops"
        cookie = d.get_cookie("rmq_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and len(cookie["value"]) >= 40
        # the console's account is admin: creating a topic (an admin-only request code) passes
        d.get(url + "#/topics")
        wait_css(d, "#new-topic").send_keys("LoginCreated")
        d.find_element(By.ID, "create-topic").click()
        wait_css(d, "#notice", "topic LoginCreated created on broker-a")

        # the session's cookie works from another client too, until logout
        req = urllib.request.Request(url + "api/topics", headers={"Cookie": f"rmq_session={cookie['value']}"})
        with urllib.request.urlopen(req, timeout=20) as r:
            assert {"topic": "LoginCreated", "kind": "normal"} in json.loads(r.read())
        d.find_element(By.ID, "logout").click()
        wait_css(d, "#login-form")
        try:
            urllib.request.urlopen(req, timeout=20)
            raise AssertionError("the session outlived its logout")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        d.get(url)
        wait_css(d, "#login-form")
    finally:
        assert proc.terminate() == 0


def test_console_without_an_account_is_refused_by_the_broker(acl_cluster):
    # no credentials (and none in the environment): the broker's ACL refuses the admin call and
    # the page's error bar says so in one line
    env = {k: "" for k in ("RMQ_ACCESS_KEY", "RMQ_SECRET_KEY", "ROCKETMQ_HOME")}
    proc, url = start_console(acl_cluster, env=env)
    try:
        status, err = post(url + "api/topic", json.dumps({"topic": "NoAccount", "queues": 1}).encode())
        assert status == 400 and "\n" not in err["error"], err
        assert "No accessKey is configured: UPDATE_AND_CREATE_TOPIC" in err["error"], err
        # the wrong secret: the signature check names the account
        proc2, url2 = start_console(acl_cluster, "--access-key", ADMIN_AK, "--secret-key", "not-the-secret", env=env)
        try:
            status, err = post(url2 + "api/topic", json.dumps({"topic": "WrongSecret", "queues": 1}).encode())
            assert status == 400 and f"accessKey={ADMIN_AK}" in err["error"], err
        finally:
            assert proc2.terminate() == 0
    finally:
        assert proc.terminate() == 0


def login(port, user, password, source="127.0.0.1"):
    """POST /api/login from a loopback `source` address: (status, JSON answer, headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", "/api/login", json.dumps({"user": user, "password": password}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read()), r.headers
    finally:
        conn.close()


def test_standalone_console_limits_failed_logins_and_rereads_its_users(tmp_path):
    users = tmp_path / "users"
    assert adduser(users, "ops", "right-password").returncode == 0
    port = free_port()
    proc = RmqProcess(["standalone", "--store", str(tmp_path / "store"), "--namesrv-listen", f"127.0.0.1:{free_port()}",
                       "--broker-listen", f"127.0.0.1:{free_port()}", "--dashboard", f"127.0.0.1:{port}",
                       "--users", str(users)], ("rmq console",))
    try:
        proc.wait_boot()
        status, _, body = get(f"http://127.0.0.1:{port}/api/topics")
        assert status == 401 and "not logged in" in json.loads(body)["error"]
        # five failed logins from one address, then its logins are refused - even the right one
        for _ in range(5):
            status, answer, _ = login(port, "ops", "wrong-password")
            assert status == 401 and answer["error"] == "wrong user name or password"
        status, answer, headers = login(port, "ops", "right-password")
        assert status == 429, answer
        assert answer["error"].startswith("too many failed logins from 127.0.0.1: try again in ")
        assert 1 <= int(headers["Retry-After"]) <= 60
        # another address is not held back
        status, answer, headers = login(port, "ops", "right-password", source="127.0.0.2")
        assert status == 200 and answer == {"user": "ops"}
        ops_cookie = headers["Set-Cookie"].split(";")[0]

        # the users file changed on disk: a new user logs in, a removed one's session ends
        assert adduser(users, "dev", "dev-password").returncode == 0
        status, answer, _ = login(port, "dev", "dev-password", source="127.0.0.2")
        assert status == 200 and answer == {"user": "dev"}
        users.write_text("".join(line + "\n" for line in users.read_text().splitlines() if not line.startswith("ops:")))
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/topics", headers={"Cookie": ops_cookie})
        try:
            urllib.request.urlopen(req, timeout=20)
            raise AssertionError("a removed user's session went on")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        assert login(port, "ops", "right-password", source="127.0.0.2")[0] == 401
    finally:
        assert proc.terminate() == 0


def test_failed_logins_count_within_the_window_only(tmp_path):
    from rmq_core.dashboard.auth import LOGIN_FAILURE_WINDOW, Sessions, TooManyLogins, hash_password

    now = [1000.0]
    sessions = Sessions({"ops": hash_password("right", n=1 << 4)}, clock=lambda: now[0])
    for i in range(5):
        now[0] += 1
        assert sessions.login("ops", "wrong", "10.0.0.1") is None
    with pytest.raises(TooManyLogins, match=r"too many failed logins from 10.0.0.1: try again in 56 s") as e:
        sessions.login("ops", "right", "10.0.0.1")
    assert e.value.retry_after == LOGIN_FAILURE_WINDOW - 4
    now[0] += LOGIN_FAILURE_WINDOW - 4  # the first failure is a window old: one more try
    assert sessions.login("ops", "wrong", "10.0.0.1") is None
    with pytest.raises(TooManyLogins):
        sessions.login("ops", "right", "10.0.0.1")
    now[0] += LOGIN_FAILURE_WINDOW
    assert sessions.login("ops", "right", "10.0.0.1") is not None  # and a success forgets the failures
    assert sessions.login("ops", "wrong", "10.0.0.1") is None


def test_standalone_users_without_a_console_is_refused_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "standalone", "--store", str(tmp_path / "store"),
                        "--users", str(tmp_path / "users")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--users asks for a login to the console: give --dashboard HOST:PORT too" in r.stderr
