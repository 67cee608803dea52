"""The web console in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium) against `rmq dashboard` over real `rmq namesrv` + `rmq broker` processes: every page
loads, a message search finds a sent message, a reset moves a group's offsets, a DLQ resend
redelivers.  A screenshot of each page is kept under the test's tmp dir."""
import contextlib
import datetime
import os
import shutil
import threading
import time

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until
from tests.servers import NamesrvAndBroker, RmqProcess, free_port

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                reason="Debian's chromium and chromium-driver are not installed (make test installs them)")

TOPIC, GROUP, DLQ_GROUP = "ConsoleTopic", "CG_CONSOLE", "CG_CONSOLE_DLQ"


@pytest.fixture
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@contextlib.contextmanager
def running_console(tmp_path, broker_props=None):
    """`rmq dashboard` over a name server and a broker: the servers, with their console_url."""
    servers = NamesrvAndBroker(tmp_path, broker_props=broker_props)
    port = free_port()
    # (charts sampled every second, so a test sees lines after a few)
    proc = RmqProcess(["dashboard", "-n", servers.namesrv, "--listen", f"127.0.0.1:{port}", "--stats-interval", "1"],
                      ("rmq console",))
    try:
        proc.wait_boot()
        servers.console_url = f"http://127.0.0.1:{port}/"
        yield servers
    finally:
        proc.terminate()
        servers.stop()


@pytest.fixture
def console(tmp_path):
    with running_console(tmp_path) as servers:
        yield servers


def consume(namesrv, group, topic, listener, **kw):
    c = PushConsumer(group, namesrv=namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER, **kw)
    c.subscribe(topic, "*")
    c.register_message_listener(listener)
    return c.start()


def wait_css(driver, css, text=None, timeout=20):
    """The first element matching `css` (containing `text`), once the page shows it."""
    def found(d):
        for el in d.find_elements(By.CSS_SELECTOR, css):
            try:
                if text is None or text in el.text:
                    return el
            except StaleElementReferenceException:  # the page re-rendered meanwhile: look again
                return False
        return False
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(found, f"{css} with {text!r}")


def until_shown(driver, pred, what, timeout=60):
    """Wait for `pred` on a page that shows sampled data, reloading it every few seconds (the console
    samples once a second; the page draws what there was when it loaded)."""
    deadline = time.monotonic() + timeout
    reload_at = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except (NoSuchElementException, StaleElementReferenceException):
            pass  # (still loading)
        if time.monotonic() >= reload_at:
            driver.refresh()
            reload_at = time.monotonic() + 3
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def rows(driver, table_id):
    """The cells' text of a table's rows, read in one step (a re-render cannot split it)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(tr => [...tr.cells].map(td => td.innerText.trim()))",
        f"#{table_id} tbody tr[data-i]")


def shot(driver, tmp_path, name):
    path = tmp_path / "screenshots" / f"{name}.png"
    path.parent.mkdir(exist_ok=True)
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


def test_console_pages_search_reset_and_dlq_resend(console, browser, tmp_path):
    from rmq_core.admin.client import AdminClient

    ns = console.namesrv
    before_sends = int(time.time() * 1000) - 1000
    with Producer("PG_CONSOLE", namesrv=ns, **FAST) as p:
        sent = [p.send(Message(TOPIC, f"body-{i}".encode(), tags="TagA", keys=f"order-{i}")) for i in range(10)]
        p.send(Message(TOPIC + "Dlq", b"poison", keys="poison-1"))

    got, lock = [], threading.Lock()

    def ok(msgs):
        with lock:
            got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = consume(ns, GROUP, TOPIC, ok)
    try:
        wait_until(lambda: len(got) >= 10, what="10 messages consumed")
    finally:
        c.shutdown()  # offsets persisted to the broker; the group has no live member any more

    # a group whose listener fails: with max_reconsume_times=0 the first failure dead-letters it
    failed = []
    bad = consume(ns, DLQ_GROUP, TOPIC + "Dlq", lambda msgs: failed.extend(msgs) or ConsumeStatus.RECONSUME_LATER,
                  max_reconsume_times=0)
    with AdminClient(ns) as admin:
        try:
            wait_until(lambda: failed and _dlq_count(admin, DLQ_GROUP) == 1, timeout=30, what="one dead letter")
        finally:
            bad.shutdown()

        d = browser
        # --- dashboard (the landing page): the broker's and the busiest topics' TPS over time ----------
        d.get(console.console_url)
        until_shown(d, lambda: "broker-a/0" in d.find_element(By.ID, "chart-broker-in").text
                    and TOPIC in d.find_element(By.ID, "chart-topics").text, "charts with lines")
        assert d.find_elements(By.CSS_SELECTOR, "#chart-broker-in svg .series path.line")  # a drawn line
        assert "Broker OutTPS" in d.find_element(By.ID, "chart-broker-out").text
        shot(d, tmp_path, "dashboard")

        # --- cluster: brokers and topics without a click ---------------------------------------------
        d.get(console.console_url + "#/cluster")
        wait_css(d, "#brokers td", "broker-a")
        # all 15 columns fit a 1280 px window: nothing of the table cut off
        assert d.execute_script("const c = document.getElementById('brokers').parentElement;"
                                "return c.scrollWidth <= c.clientWidth")
        wait_css(d, "#cluster-topics td", TOPIC)
        broker = rows(d, "brokers")[0]
        assert broker[:6] == ["DefaultCluster", "broker-a", "0", "MASTER", console.broker_addrs[0], "V4_9_7"]
        # TPS: the broker's per-minute rates (finished seconds only, so maybe still 0 here)
        assert float(broker[6]) >= 0 and float(broker[7]) >= 0 and int(broker[8]) == 11
        assert broker[-1].endswith("%")  # disk use
        shot(d, tmp_path, "cluster")

        # --- topics: queues with offsets, create, delete ----------------------------------------------
        d.get(console.console_url + f"#/topics/{TOPIC}")
        wait_css(d, "#topic-queues td", "broker-a")
        queues = rows(d, "topic-queues")
        assert sum(int(r[3]) for r in queues) == 10 and {r[2] for r in queues} == {"0"}
        d.find_element(By.ID, "new-topic").send_keys("ConsoleCreated")
        qn = d.find_element(By.ID, "new-topic-queues")
        qn.clear()
        qn.send_keys("3")
        d.find_element(By.ID, "create-topic").click()
        wait_css(d, "#notice", "topic ConsoleCreated created on broker-a")
        wait_css(d, "#topic-title", "ConsoleCreated")
        wait_until(lambda: len(rows(d, "topic-queues")) == 3, what="3 queues shown")
        assert wait_css(d, "#topic-chart svg") is not None  # its TPS over time (no points yet)
        assert "ConsoleCreated" in admin.topic_list()
        shot(d, tmp_path, "topics")
        d.find_element(By.ID, "delete-topic").click()
        d.switch_to.alert.accept()
        wait_css(d, "#notice", "topic ConsoleCreated deleted")
        wait_until(lambda: "ConsoleCreated" not in admin.topic_list(), what="topic deleted")
        # an unknown topic: one line on the page
        d.get(console.console_url + "#/topics/NoSuchTopic")
        err = wait_css(d, "#error", "NoSuchTopic")
        assert "\n" not in err.text

        # --- messages: by key, by id, by topic + time; delivery state; resend -------------------------
        d.get(console.console_url + "#/messages")
        Select(wait_css(d, "#search-by")).select_by_value("key")
        d.find_element(By.ID, "search-topic").send_keys(TOPIC)
        d.find_element(By.ID, "search-key").send_keys("order-3")
        d.find_element(By.ID, "search").click()
        wait_css(d, "#messages td", sent[3].msg_id)
        assert rows(d, "messages")[0][0] == sent[3].msg_id
        assert wait_css(d, "#message-body").text == "body-3"
        assert [r[:2] for r in rows(d, "delivery")] == [[GROUP, "CONSUMED"]]
        shot(d, tmp_path, "messages")

        Select(d.find_element(By.ID, "search-by")).select_by_value("id")
        d.find_element(By.ID, "search-id").send_keys(sent[7].msg_id)
        d.find_element(By.ID, "search").click()
        wait_css(d, "#message-body", "body-7")
        d.find_element(By.ID, "resend-message").click()
        wait_css(d, "#notice", "resent as")
        wait_until(lambda: sum(q.max_offset for q in admin.topic_stats(TOPIC)) == 11, what="the resent copy stored")

        Select(d.find_element(By.ID, "search-by")).select_by_value("time")
        # the range is typed as the tables show times (local YYYY-MM-DD HH:MM:SS), whatever the locale
        local = datetime.datetime.fromtimestamp(before_sends // 1000).strftime("%Y-%m-%d %H:%M:%S")
        begin = d.find_element(By.ID, "search-begin")
        begin.clear()
        begin.send_keys("2026-13-01 00:00:00")
        d.find_element(By.ID, "search").click()
        wait_css(d, "#error", 'bad date and time "2026-13-01 00:00:00": expected YYYY-MM-DD HH:MM:SS')
        begin.clear()
        begin.send_keys(local)
        d.find_element(By.ID, "search").click()
        wait_until(lambda: len(rows(d, "messages")) == 11, what="11 messages by time")
        assert rows(d, "messages")[0][7][:10] == local[:10]  # the tables' format, the one typed

        # --- consumer groups: offline ones, lag per queue and over time, reset offset by time -----------
        d.get(console.console_url + f"#/groups/{GROUP}")
        wait_css(d, "#group-progress td", TOPIC)
        group_row = next(r for r in rows(d, "groups") if r[0] == GROUP)
        assert group_row[1:5] == ["offline", "0", "-", "-"]  # its consumer shut down: no blank columns
        assert d.find_element(By.ID, "diff-total").text == "1"  # the resent copy
        until_shown(d, lambda: "lag" in d.find_element(By.CSS_SELECTOR, "#group-chart svg").text, "the group's lag chart")
        assert not d.find_elements(By.ID, "reset-ms")  # one way to give the time
        t = d.find_element(By.ID, "reset-time")
        t.clear()
        t.send_keys(local)
        d.find_element(By.ID, "reset-offset").click()
        wait_css(d, "#notice", f"{GROUP} reset on {TOPIC}")
        wait_until(lambda: d.find_element(By.ID, "diff-total").text == "11", what="diff total 11 after the reset")
        assert all(q.consumer_offset == 0 for q in admin.consume_stats(GROUP, TOPIC).queues)
        shot(d, tmp_path, "groups")

        # --- DLQ: the groups that have one, browse, resend, redelivered ----------------------------------
        d.get(console.console_url + "#/dlq")
        wait_css(d, "#dlq-groups td", DLQ_GROUP)
        assert rows(d, "dlq-groups") == [[DLQ_GROUP, "1"]]
        d.find_element(By.CSS_SELECTOR, "#dlq-groups tbody tr[data-i]").click()
        wait_css(d, "#dlq-messages td", "poison")
        dead = rows(d, "dlq-messages")
        assert len(dead) == 1 and dead[0][2] == TOPIC + "Dlq"
        shot(d, tmp_path, "dlq")
        d.find_element(By.ID, "dlq-resend-all").click()
        wait_css(d, "#notice", f"1 dead letter(s) of {DLQ_GROUP} resent")

    again = []
    c = consume(ns, DLQ_GROUP, TOPIC + "Dlq", lambda msgs: again.extend(msgs) or ConsumeStatus.CONSUME_SUCCESS)
    try:
        wait_until(lambda: any(m.body == b"poison" for m in again), timeout=30, what="the dead letter redelivered")
    finally:
        c.shutdown()


def _dlq_count(admin, group) -> int:
    try:
        return len(admin.dlq_messages(group))
    except Exception:
        return 0
