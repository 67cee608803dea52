"""The store's runtime gauges behind mqadmin's PCWait and rocketmq_storage_dispatch_behind_bytes,
on a real store: the put lock's holding time while a put holds it, and the commit-log bytes the
index has not yet been built for while its builder is held."""
from tests.admin.test_admin_cli import wait_for
from tests.store.conftest import msg


def test_page_cache_lock_time_while_a_put_holds_the_lock(store):
    assert store.runtime_info()["pageCacheLockTimeMills"] == "0"
    with store.commit_log._timed_put_lock:  # a put in progress, as far as the gauge can tell
        held = wait_for(lambda: int(store.runtime_info()["pageCacheLockTimeMills"]), what="PCWait > 0")
        assert held >= 1
    assert store.runtime_info()["pageCacheLockTimeMills"] == "0"
    assert store.put_message(msg()).is_ok()
    assert store.commit_log.begin_time_in_lock == 0


def test_dispatch_behind_bytes_while_the_index_waits(store):
    builder = store.index_build_service
    assert store.dispatch_behind_bytes() == 0
    before = store.get_max_phy_offset()
    with builder._build_lock:  # the builder cannot take a round: puts queue their index work
        for i in range(5):
            assert store.put_message(msg(keys=f"k{i}")).is_ok()
        behind = store.dispatch_behind_bytes()
        assert behind == store.get_max_phy_offset() - before > 0
        assert store.runtime_info()["dispatchBehindBytes"] == str(behind)
    builder.drain()
    assert store.dispatch_behind_bytes() == 0
