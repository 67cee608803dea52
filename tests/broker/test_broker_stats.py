"""BrokerStats: per-topic put/get counters and the per-second rates admin reads (putTps...)."""
import threading

from rmq_core.broker import stats as stats_mod
from rmq_core.broker.stats import BrokerStats


def _at(monkeypatch, sec):
    monkeypatch.setattr(stats_mod, "_time", lambda: sec + 0.5)
    monkeypatch.setattr(stats_mod.time, "time", lambda: sec + 0.5)


def test_put_counters_and_tps_over_the_last_minute(monkeypatch):
    s = BrokerStats()
    _at(monkeypatch, 1000)
    s.inc_put("A", 1, 100)
    s.inc_put("A", 2, 50)
    s.inc_put("B", 1, 10)
    assert s.put_nums == {"A": 3, "B": 1} and s.put_size == {"A": 150, "B": 10}
    assert s.put_rate.tps() == 0.0  # the current second is not finished yet
    _at(monkeypatch, 1001)
    assert s.put_rate.tps() == 4 / 60
    s.inc_put("A", 6, 1)
    _at(monkeypatch, 1030)
    assert s.put_rate.tps() == 10 / 60
    assert s.snapshot()["msgPutTotalTodayNow"] == "10" and s.snapshot()["putTps"] == "0.17"
    _at(monkeypatch, 1061)  # second 1000 left the minute, 1001 is still in it
    assert s.put_rate.tps() == 6 / 60
    _at(monkeypatch, 1062)
    assert s.put_rate.tps() == 0.0


def test_rate_keeps_a_minute_of_busy_seconds(monkeypatch):
    s = BrokerStats()
    for sec in range(2000, 2100):
        _at(monkeypatch, sec)
        s.inc_put("T", 1, 1)
    _at(monkeypatch, 2100)
    assert s.put_rate.tps() == 1.0
    assert len(s.put_rate.samples) <= 60


def test_get_counters_per_group(monkeypatch):
    s = BrokerStats()
    _at(monkeypatch, 5000)
    s.inc_get("G1", "T", 4, 400)
    s.inc_get("G2", "T", 1, 100)
    _at(monkeypatch, 5001)
    assert s.group_get_tps("G1") == 4 / 60 and s.group_get_tps("nobody") == 0.0
    assert s.get_nums == {"T@G1": 4, "T@G2": 1}
    assert s.snapshot()["msgGetTotalTodayNow"] == "5"


def test_puts_from_several_threads_are_all_counted():
    s = BrokerStats()

    def put():
        for _ in range(20_000):
            s.inc_put("T", 1, 3)

    threads = [threading.Thread(target=put) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.put_nums["T"] == 80_000 and s.put_size["T"] == 240_000
