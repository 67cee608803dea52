"""The console's cluster page for a controller-mode group, in headless Chromium: each replica's
role, the master epoch it follows and the sync state set, as the controller has them."""
import pytest

from tests.controller.conftest import etcd  # noqa: F401 (fixture: one real etcd member)
from tests.controller.failover_group import FailoverGroup
from tests.dashboard.test_console_browser import browser, rows, shot, wait_css  # noqa: F401 (fixture)
from tests.servers import RmqProcess, free_port


@pytest.fixture
def failover_console(tmp_path, etcd):  # noqa: F811
    g = FailoverGroup(tmp_path, etcd.endpoints, verbose=False)
    proc = None
    try:
        g.start_all()
        g.wait_master()
        g.state = g.wait_full_sync_state_set()
        port = free_port()
        proc = RmqProcess(["dashboard", "-n", g.namesrv, "--listen", f"127.0.0.1:{port}"], ("rmq console",))
        proc.wait_boot()
        g.console_url = f"http://127.0.0.1:{port}/"
        yield g
    finally:
        if proc is not None:
            proc.terminate()
        g.stop()


def test_cluster_page_shows_epoch_and_sync_state_set(failover_console, browser, tmp_path):  # noqa: F811
    g = failover_console
    state = g.state
    members = "{" + ", ".join(str(b) for b in state["syncStateSet"]) + "}"
    browser.get(g.console_url + "#/cluster")
    wait_css(browser, "#brokers td", members)
    table = rows(browser, "brokers")
    assert len(table) == 3
    master = next(r for r in table if r[2] == "0")
    assert master[3:5] == ["MASTER", state["masterAddress"]]
    assert str(state["masterEpoch"]) in master and members in master
    slaves = [r for r in table if r[2] != "0"]
    assert all(r[3] == "SLAVE" and str(state["masterEpoch"]) in r for r in slaves)
    shot(browser, tmp_path, "cluster-controller-mode")
