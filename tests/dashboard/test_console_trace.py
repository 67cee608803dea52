"""The console's message page shows a message's trace as a timeline, in a real headless Chromium
against `rmq dashboard` over real `rmq namesrv` + `rmq broker` processes (traceTopicEnable)."""
import threading

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until
from tests.dashboard.test_console_browser import browser, running_console, shot, wait_css  # noqa: F401 - the fixture

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

from tests.dashboard.test_console_browser import pytestmark  # noqa: E402,F401 - needs chromium as the other

TOPIC, GROUP = "ConsoleTraced", "CG_CONSOLE_TRACE"


@pytest.fixture
def console(tmp_path):
    with running_console(tmp_path, {"traceTopicEnable": "true"}) as servers:
        yield servers


def test_message_page_shows_the_trace_timeline(console, browser, tmp_path):  # noqa: F811
    from rmq_core.admin.client import AdminClient

    ns = console.namesrv
    got = threading.Event()
    with Producer("PG_CONSOLE_TRACE", namesrv=ns, enable_msg_trace=True, **FAST) as p:
        r = p.send(Message(TOPIC, b"traced body", keys="trace-1"))
    c = PushConsumer(GROUP, namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", enable_msg_trace=True,
                     **FAST_CONSUMER)
    c.subscribe(TOPIC, "*")
    c.register_message_listener(lambda msgs: (got.set(), ConsumeStatus.CONSUME_SUCCESS)[1])
    c.start()
    try:
        assert got.wait(30)
    finally:
        c.shutdown()  # (its last records are sent before it stops)
    with AdminClient(ns) as admin:
        wait_until(lambda: {v.type for v in admin.message_trace(r.msg_id)} >= {"Pub", "SubBefore", "SubAfter"},
                   what="the trace stored")

    d = browser
    d.get(console.console_url + "#/messages")
    Select(wait_css(d, "#search-by")).select_by_value("key")
    d.find_element(By.ID, "search-topic").send_keys(TOPIC)
    d.find_element(By.ID, "search-key").send_keys("trace-1")
    d.find_element(By.ID, "search").click()
    wait_css(d, "#trace-timeline li", GROUP)
    items = d.find_elements(By.CSS_SELECTOR, "#trace-timeline li")
    kinds = [li.get_attribute("data-type") for li in items]
    assert kinds[0] == "Pub" and {"SubBefore", "SubAfter"} <= set(kinds)
    assert "PG_CONSOLE_TRACE" in items[0].text and console.broker_addrs[0] in items[0].text
    after = items[kinds.index("SubAfter")].text
    assert GROUP in after and "success" in after
    assert {li.get_attribute("data-msg-id") for li in items} == {r.msg_id}
    shot(d, tmp_path, "message-trace")
