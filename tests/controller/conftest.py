"""Fixtures of real etcd members: `etcd` (one member) and `etcd3` (three), torn down after the
test, also when it fails.  Without an etcd binary they fail (not skip): `make test` installs it."""
import pytest

from tests.etcd_cluster import EtcdCluster, etcd_binary


def _cluster(tmp_path, members):
    try:
        etcd_binary()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    cluster = EtcdCluster(tmp_path, members)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def etcd(tmp_path):
    yield from _cluster(tmp_path, 1)


@pytest.fixture
def etcd3(tmp_path):
    yield from _cluster(tmp_path, 3)
