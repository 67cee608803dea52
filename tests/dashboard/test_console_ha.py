"""The console's cluster page for a replicated broker group, in headless Chromium: a master and
its slave (`rmq broker` each) side by side, the slave naming its master, both with their lag."""
import pytest

from tests.broker.ha_cluster import TOPIC, running_group
from tests.broker.ha_group import wait_replicated
from tests.dashboard.test_console_browser import browser, rows, shot, wait_css  # noqa: F401 (fixture)
from tests.servers import RmqProcess, free_port


@pytest.fixture
def ha_console(tmp_path):
    port = free_port()
    with running_group(tmp_path) as (g, raw):
        for i in range(20):
            assert raw.send(g.master_addr, TOPIC, b"x" * 200, queue_id=i % 4).code == 0
        wait_replicated(g.master_store, g.slave_store)
        proc = RmqProcess(["dashboard", "-n", g.namesrv, "--listen", f"127.0.0.1:{port}"], ("rmq console",))
        try:
            proc.wait_boot()
            g.console_url = f"http://127.0.0.1:{port}/"
            yield g
        finally:
            proc.terminate()


def test_cluster_page_shows_master_and_slave_with_the_lag(ha_console, browser, tmp_path):  # noqa: F811
    g = ha_console
    browser.get(g.console_url + "#/cluster")
    wait_css(browser, "#brokers td", f"SLAVE of {g.master_addr}")
    master, slave = rows(browser, "brokers")
    assert master[:5] == ["HACluster", "broker-ha", "0", "MASTER", g.master_addr]
    assert slave[:5] == ["HACluster", "broker-ha", "1", "SLAVE", g.slave_addr]
    assert master[10:12] == ["ASYNC_MASTER, 1 slave", "0 B"]
    assert slave[10:12] == [f"SLAVE of {g.master_addr}", "0 B"]
    shot(browser, tmp_path, "cluster-replicated")
