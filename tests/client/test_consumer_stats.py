"""A push consumer's per-topic consumption (ConsumerStatsManager's ConsumeStatus) over a clock the
test moves: rates over the last minute, failures over the last hour, idle windows reading 0."""
from rmq_core.client.stats import ConsumerStats
from tests.client.test_fault_and_route import Clock


def test_rates_over_the_last_minute_and_failures_over_the_hour():
    clock = Clock()
    s = ConsumerStats(clock)
    assert s.status_table() == {} and s.totals() == (0, 0)
    for _ in range(6):  # a minute of 10 calls a second: 30 OK and 2 failed messages each, 4 ms a call
        s.consumed("T", 30, 2, 40.0, 10)
        s.pulled("T", 32, 6.0)
        s.pulled("T", 0, 14.0)
        clock.now += 10
    st = s.status_table()["T"]
    assert st == {"pullRT": 10.0, "pullTPS": 3.2, "consumeRT": 4.0, "consumeOKTPS": 3.0, "consumeFailedTPS": 0.2,
                  "consumeFailedMsgs": 12}
    assert s.totals() == (180, 12)
    clock.now += 600  # idle ten minutes: no rate, the failures still within the hour
    st = s.status_table()["T"]
    assert (st["consumeOKTPS"], st["consumeFailedTPS"], st["consumeRT"], st["consumeFailedMsgs"]) == (0, 0, 0, 12)
    s.consumed("T", 5, 1, 10.0, 1)  # activity again: measured from where it started
    clock.now += 5
    st = s.status_table()["T"]
    assert (st["consumeOKTPS"], st["consumeFailedTPS"], st["consumeRT"], st["consumeFailedMsgs"]) == (1.0, 0.2, 10.0, 13)
    clock.now += 3600  # an hour later the old failures are out of the window
    s.consumed("U", 1, 0, 1.0, 1)
    clock.now += 1
    table = s.status_table()
    assert table["T"]["consumeFailedMsgs"] == 0 and table["U"]["consumeOKTPS"] == 1.0
