"""rmq_core.controller.etcd.EtcdClient against real etcd members (tests/etcd_cluster.py)."""
import os
import signal
import threading
import time

import pytest

from rmq_core.controller.etcd import EtcdClient, EtcdError, EtcdLeaseNotFound, EtcdUnavailable
from rmq_core.errors import ConfigError
from tests.etcd_cluster import etcd_binary
from tests.servers import free_port, freeze


def wait_until(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        time.sleep(0.05)


@pytest.fixture
def client(etcd):
    c = EtcdClient(etcd.endpoints)
    yield c
    c.close()


def test_without_etcd_the_fixture_says_make_test_installs_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="`make test` installs it"):
        etcd_binary()


def test_get_put_delete(client):
    assert client.get("/t/a") == (None, 0)
    rev = client.put("/t/a", b"\x00v\xff")
    assert client.get("/t/a") == (b"\x00v\xff", rev)
    rev2 = client.put("/t/a", b"")  # the gateway leaves an empty value out of its answer
    assert rev2 > rev and client.get("/t/a") == (b"", rev2)
    client.delete("/t/a")
    assert client.get("/t/a") == (None, 0)
    client.delete("/t/a")  # deleting what is not there is no error


def test_get_prefix(client):
    r1 = client.put("/t/grp/meta", b"m")
    r2 = client.put("/t/grp/alive/1", b"a1")
    client.put("/t/grp0", b"sibling")  # same leading bytes, not under the prefix
    assert client.get_prefix("/t/grp/") == {"/t/grp/meta": (b"m", r1), "/t/grp/alive/1": (b"a1", r2)}
    assert client.get_prefix("/t/none/") == {}


def test_txn_compare_mod_revision_one_of_two_racing_writers_wins(etcd):
    """Both read the same revision, both write comparing it: exactly one wins, the other learns
    the winner's value in the same answer (the lost update the controller's CAS prevents)."""
    a, b = EtcdClient(etcd.endpoints), EtcdClient(etcd.endpoints)
    try:
        rev = a.put("/t/meta", b"epoch=1")
        assert b.get("/t/meta") == (b"epoch=1", rev)
        barrier = threading.Barrier(2)
        results = {}

        def write(name, c):
            barrier.wait()
            results[name] = c.txn([("mod", "/t/meta", "=", rev)], [("put", "/t/meta", name.encode())],
                                  [("get", "/t/meta")])

        threads = [threading.Thread(target=write, args=(n, c)) for n, c in (("A", a), ("B", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, (ok, _) in results.items() if ok]
        assert len(winners) == 1, results
        loser = "B" if winners == ["A"] else "A"
        won_rev = results[winners[0]][1][0]
        assert results[loser][1] == [(winners[0].encode(), won_rev)]
        assert a.get("/t/meta") == (winners[0].encode(), won_rev)
    finally:
        a.close()
        b.close()


def test_txn_create_if_absent_value_compare_and_ops(client):
    ok, resp = client.txn([("version", "/t/ids/1", "=", 0)], [("put", "/t/ids/1", b"host-a"), ("get", "/t/ids/1")])
    assert ok and resp[1] == (b"host-a", resp[0])
    ok, resp = client.txn([("version", "/t/ids/1", "=", 0)], [("put", "/t/ids/1", b"host-b")], [("get", "/t/ids/1")])
    assert not ok and resp[0][0] == b"host-a"
    ok, resp = client.txn([("value", "/t/ids/1", "=", b"host-a"), ("mod", "/t/ids/1", ">", 0)],
                          [("delete", "/t/ids/1"), ("get", "/t/ids/1")])
    assert ok and resp == [1, (None, 0)]
    ok, resp = client.txn([("value", "/t/ids/1", "!=", b"x")], [("get", "/t/ids/1")])
    assert not ok and resp == []  # compare on an absent key's value fails; an empty failure branch


@pytest.mark.parametrize("compare, ops, bad", [
    ([("mod", "/k", "==", 1)], [], "'=='"),
    ([("rev", "/k", "=", 1)], [], "'rev'"),
    ([("mod", "/k", "=")], [], "('mod', '/k', '=')"),
    ([], [("set", "/k", b"v")], "('set'"),
    ([], [("put", "/k")], "('put', '/k')"),
])
def test_txn_bad_items_name_the_item(client, compare, ops, bad):
    with pytest.raises(ValueError, match=bad.replace("(", r"\(").replace(")", r"\)")):
        client.txn(compare, ops)


def test_lease_expires_without_keepalive_and_lives_with_it(client):
    kept, kept_ttl = client.grant(1)
    lapsing, ttl = client.grant(1)
    assert ttl == kept_ttl == 1  # the floor of these members' timings is 1 s
    client.put("/t/alive/1", b"kept", lease=kept)
    client.put("/t/alive/2", b"lapsing", lease=lapsing)
    deadline = time.monotonic() + 2.5  # more than twice the TTL
    while time.monotonic() < deadline:
        assert client.keepalive(kept) >= 1
        time.sleep(0.2)
    assert client.get("/t/alive/1")[0] == b"kept"
    wait_until(lambda: client.get("/t/alive/2") == (None, 0), what="the key of a lease not kept alive vanishing")
    assert client.keepalive(lapsing) == 0
    with pytest.raises(EtcdLeaseNotFound, match="/t/alive/2"):
        client.put("/t/alive/2", b"again", lease=lapsing)


def test_revoke_deletes_the_leases_keys_at_once(client):
    lease, _ = client.grant(30)
    client.put("/t/alive/3", b"x", lease=lease)
    client.revoke(lease)
    assert client.get("/t/alive/3") == (None, 0)
    assert client.keepalive(lease) == 0
    client.revoke(lease)  # gone already: no error


@pytest.mark.parametrize("endpoints, named", [
    ("127.0.0.1", "'127.0.0.1'"), ("127.0.0.1:2379,:80", "':80'"), ("127.0.0.1:99999", "'127.0.0.1:99999'"),
    ("https://127.0.0.1:2379", "'https://127.0.0.1:2379'"), ("", "''"), ([], "none given"),
])
def test_bad_endpoints_are_config_errors_naming_the_value(endpoints, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        EtcdClient(endpoints)


def test_endpoint_forms_and_bad_timeout():
    c = EtcdClient(" 127.0.0.1:2479 ;http://localhost:2579,[::1]:2679")
    assert c.endpoints == ["127.0.0.1:2479", "localhost:2579", "[::1]:2679"]
    c.close()
    with pytest.raises(ConfigError, match="-1"):
        EtcdClient("127.0.0.1:2479", timeout=-1)


def test_no_endpoint_answering_is_unavailable_naming_them():
    ports = [free_port(), free_port()]
    c = EtcdClient(",".join(f"127.0.0.1:{p}" for p in ports), timeout=0.5)
    with pytest.raises(EtcdUnavailable) as e:
        c.put("/t/x", b"1")
    assert all(f"127.0.0.1:{p}" in str(e.value) for p in ports), str(e.value)
    c.close()
    with pytest.raises(EtcdError, match="closed"):
        c.get("/t/x")


def test_three_members_one_killed_leader_included(etcd3):
    """The remembered endpoint and then the leader die one at a time (restarting the first):
    every call still answers."""
    # the remembered endpoint a follower: its death needs no election (a leader's may outlast a
    # call's deadline on a loaded machine; the leader's death is the second step's)
    first = next(i for i in range(3) if i != etcd3.leader())
    ordered = [f"127.0.0.1:{etcd3.client_ports[i]}" for i in (first, *(j for j in range(3) if j != first))]
    c = EtcdClient(ordered, timeout=2.0)
    try:
        lease, _ = c.grant(30)
        rev = c.put("/t/k", b"1", lease=lease)
        etcd3.kill(first)  # the endpoint the client used
        assert c.get("/t/k") == (b"1", rev)
        assert c.keepalive(lease) > 0
        ok, _ = c.txn([("mod", "/t/k", "=", rev)], [("put", "/t/k", b"2", lease)])
        assert ok
        etcd3.restart(first)
        leader = etcd3.leader()
        etcd3.kill(leader)  # a new election; the client retries on the others within its deadline
        wait_until(lambda: _serves(c), what="the two remaining members electing a leader")
        assert c.get("/t/k")[0] == b"2"
        assert c.keepalive(lease) > 0
        assert len(c.members()) == 3
        health = c.health()
        assert sorted(health.values()) == [False, True, True], health
    finally:
        c.close()


def _serves(c) -> bool:
    try:
        c.put("/t/probe", b"")
        return True
    except EtcdUnavailable:
        return False


def test_quorum_lost_is_unavailable_within_the_timeout_then_recovers(etcd3):
    timeout = 1.0
    c = EtcdClient(etcd3.endpoints, timeout=timeout)
    try:
        lease, _ = c.grant(60)
        c.put("/t/k", b"1", lease=lease)
        survivor = etcd3.leader()
        dead = [i for i in range(3) if i != survivor]
        for i in dead:
            etcd3.kill(i)
        # etcd itself would hold these for its request timeout (5 s + 2 election timeouts)
        # keep-alive first: etcd 3.4's old leader renews leases alone until it steps down
        for call in (lambda: c.keepalive(lease), lambda: c.put("/t/k", b"2"), lambda: c.get("/t/k"),
                     lambda: c.txn([("mod", "/t/k", ">", 0)], [("put", "/t/k", b"3")])):
            t0 = time.monotonic()
            with pytest.raises(EtcdUnavailable) as e:
                call()
            # bounded by the client's deadline, far from etcd's own hold of 6 s
            assert time.monotonic() - t0 < 3 * timeout
            assert f"127.0.0.1:{etcd3.client_ports[survivor]}" in str(e.value)
        assert len(c.members()) == 3  # not linearizable: a member without quorum still answers
        for i in dead:
            etcd3.restart(i)
        wait_until(lambda: _serves(c), what="the cluster serving again")
        # the writes that timed out may have been applied once a quorum came back: "unavailable"
        # means "outcome unknown" for a write, as etcd's own request timeout does
        assert c.get("/t/k")[0] in (b"1", b"2", b"3")
        assert c.keepalive(lease) > 0  # a leader change extends leases instead of expiring them
    finally:
        c.close()


def test_write_txn_is_not_retried_once_a_hung_member_took_it(etcd3):
    """A member stopped (SIGSTOP) accepts connections and never answers: a read fails over to
    another member within the call; a writing transaction raises (it may have been applied) and
    the client's next call starts at another member."""
    follower = next(i for i in range(3) if i != etcd3.leader())  # the others keep quorum
    ordered = [f"127.0.0.1:{etcd3.client_ports[i]}" for i in (follower, *(j for j in range(3) if j != follower))]
    reader, writer = EtcdClient(ordered, timeout=2.0), EtcdClient(ordered, timeout=2.0)
    pid = etcd3.procs[follower].pid
    try:
        rev = reader.put("/t/k", b"1")
        freeze(pid)
        assert reader.get("/t/k") == (b"1", rev)
        with pytest.raises(EtcdUnavailable, match="may have been applied"):
            writer.txn([("mod", "/t/k", "=", rev)], [("put", "/t/k", b"2")])
        ok, _ = writer.txn([("mod", "/t/k", "=", rev)], [("put", "/t/k", b"2")])
        assert ok  # the stopped member never passed the first one on
        assert reader.get("/t/k")[0] == b"2"
    finally:
        os.kill(pid, signal.SIGCONT)
        reader.close()
        writer.close()
