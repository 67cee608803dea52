import pytest

from rmq_core.embedded import Cluster
from tests.rawclient import RawClient

# Small files and short timers keep the suite fast; behaviour is the same as with defaults.
SMALL = {
    "mappedFileSizeCommitLog": str(4 * 1024 * 1024),
    "mappedFileSizeConsumeQueue": str(1000 * 20),
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
    "messageDelayLevel": "1s 2s 3s 4s 5s 6s 7s 8s 9s 10s 11s 12s 13s 14s 15s 16s 17s 18s",
    "transactionTimeOut": "500",
    "transactionCheckInterval": "200",
    "transactionCheckMax": "3",
    "errorReplyDelayMs": "50",
    "lockRefuseReplyDelayMs": "50",
    "enablePropertyFilter": "true",
}


@pytest.fixture
def make_cluster(tmp_path):
    started = []

    def make(config=None, store=None, **overrides):
        c = Cluster(str(store or tmp_path / "store"), {**SMALL, **(config or {})}, **overrides)
        c.start()
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()


@pytest.fixture
def cluster(make_cluster):
    return make_cluster()


@pytest.fixture
def raw():
    r = RawClient()
    yield r
    r.close()
