"""A controller-mode broker group of real processes: etcd (tests.etcd_cluster), `rmq namesrv` with
the controller embedded, and N `rmq broker` replicas of one brokerName with no brokerId or
brokerRole, each restartable on its own config and store.

By default every server is on 127.0.0.1.  `hosts` (per replica) and `namesrv_host` place them on
other local addresses, and `prefixes` (replica index → command prefix, e.g. `ip netns exec NS`)
runs a replica elsewhere: a replica listens and advertises (brokerIP1, its HA address) on its host,
so each must be reachable from where the others run."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

from rmq_core import Message, Producer
from rmq_core.codec import decode_messages
from rmq_core.errors import RMQError
from rmq_core.message import SendStatus, decode_offset_msg_id
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.rawclient import RawClient
from tests.servers import RmqProcess, free_port, freeze, write_conf

GROUP = "broker-fo"
CLUSTER = "FailoverCluster"
TOPIC = "FailoverTopic"
QUEUES = 4
SEGMENT = 4 * 1024 * 1024


class FailoverGroup:
    def __init__(self, tmp_path, etcd_endpoints: str, replicas: int = 3, broker_props: dict | None = None,
                 namesrv_props: dict | None = None, verbose: bool = True, replica_props: list | None = None,
                 hosts: list[str] | None = None, namesrv_host: str = "127.0.0.1",
                 prefixes: dict[int, list[str]] | None = None, standalone_controllers: int = 0):
        """`standalone_controllers`: that many `rmq controller` processes instead of the one
        embedded in the name server; the brokers list them all in controllerAddr."""
        self.tmp_path = tmp_path
        self.etcd_endpoints = etcd_endpoints
        self.namesrv = f"{namesrv_host}:{free_port()}"
        self.hosts = list(hosts or ["127.0.0.1"] * replicas)
        self.prefixes = dict(prefixes or {})
        self.raw = RawClient()
        self.verbose = verbose
        controller_conf = {"controllerEtcdEndpoints": etcd_endpoints,
                           "controllerEtcdRoot": f"/rmq-test-{os.getpid()}-{id(self)}"}
        self.controllers: list[RmqProcess] = []
        if standalone_controllers:
            self.ns_args = [*(["-v"] if verbose else []), "namesrv", "--listen", self.namesrv]
            self.ns = RmqProcess(self.ns_args, ("The Name Server boot success",))
            conf = write_conf(tmp_path / "controller.conf", {**controller_conf, **(namesrv_props or {})})
            self.controller_addrs = [f"{namesrv_host}:{free_port()}" for _ in range(standalone_controllers)]
            for addr in self.controller_addrs:
                self.controllers.append(RmqProcess([*(["-v"] if verbose else []), "controller", "-c", conf,
                                                    "--listen", addr], ("The controller boot success",)))
            for c in self.controllers:
                c.wait_boot()
        else:
            ns_conf = write_conf(tmp_path / "namesrv.conf", {
                "enableControllerInNamesrv": "true", **controller_conf, **(namesrv_props or {})})
            self.ns_args = [*(["-v"] if verbose else []), "namesrv", "--listen", self.namesrv, "-c", ns_conf]
            self.ns = RmqProcess(self.ns_args, ("The Name Server boot success", "The controller boot success"))
            self.controller_addrs = [self.namesrv]
        self.ns.wait_boot()
        self.ports = [free_port() for _ in range(replicas)]
        self.confs = []
        for i, port in enumerate(self.ports):
            self.confs.append(write_conf(tmp_path / f"replica{i}.conf", {
                "brokerClusterName": CLUSTER, "brokerName": GROUP, "brokerIP1": self.hosts[i], "listenPort": port,
                "haListenPort": free_port(), "storePathRootDir": tmp_path / f"store{i}",
                "namesrvAddr": self.namesrv, "enableControllerMode": "true",
                "controllerAddr": ";".join(self.controller_addrs),
                "allAckInSyncStateSet": "true", "mappedFileSizeCommitLog": SEGMENT,
                "mappedFileSizeConsumeQueue": 6000 * 20, "maxHashSlotNum": 10000, "maxIndexNum": 40000,
                "registerNameServerPeriod": 1000, **(broker_props or {}),
                **((replica_props or [{}] * replicas)[i])}))
        self.procs: list[RmqProcess | None] = [None] * replicas

    # -- processes -------------------------------------------------------------------------------
    def addr(self, i: int) -> str:
        return f"{self.hosts[i]}:{self.ports[i]}"

    def index_of(self, addr: str) -> int:
        return self.ports.index(int(addr.rpartition(":")[2]))

    def start(self, i: int) -> RmqProcess:
        p = RmqProcess([*(["-v"] if self.verbose else []), "broker", "-c", self.confs[i], "--listen-host", self.hosts[i]],
                       prefix=self.prefixes.get(i, ()))
        self.procs[i] = p
        p.wait_boot()
        return p

    def start_all(self) -> None:
        for i in range(len(self.procs)):
            self.start(i)

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            p.kill()

    def signal(self, i: int, sig) -> None:
        if sig == signal.SIGSTOP:
            freeze(self.procs[i].proc.pid)
        else:
            os.kill(self.procs[i].proc.pid, sig)

    def stop(self) -> None:
        for p in [*self.procs, *self.controllers, self.ns]:
            if p is None:
                continue
            if p.proc.poll() is None:
                try:
                    os.kill(p.proc.pid, signal.SIGCONT)  # a frozen process must be able to stop
                except ProcessLookupError:
                    pass
            p.terminate()
        self.raw.close()

    # -- what the controller says ----------------------------------------------------------------
    def sync_state(self) -> dict | None:
        """The group's row of CONTROLLER_GET_SYNC_STATE_DATA (None before any replica registered)."""
        alive = [a for a, c in zip(self.controller_addrs, self.controllers) if c.proc.poll() is None] \
            if self.controllers else self.controller_addrs
        r = self.raw.invoke(alive[0], RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, {},
                            json.dumps([GROUP]).encode(), timeout=5)
        assert r.code == ResponseCode.SUCCESS, r.remark
        return json.loads(r.body).get(GROUP)

    def master(self) -> tuple[int | None, str | None, int]:
        s = self.sync_state() or {}
        return s.get("masterBrokerId"), s.get("masterAddress"), s.get("masterEpoch", 0)

    def wait(self, pred, timeout: float = 60.0, what: str = "the group", interval: float = 0.05):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.sync_state()
                if last is not None and pred(last):
                    return last
            except (AssertionError, OSError, TimeoutError, RuntimeError) as e:
                last = e
            time.sleep(interval)
        raise TimeoutError(f"{what}: not reached in {timeout}s; last state: {last}")

    def wait_master(self, not_addr: str | None = None, timeout: float = 60.0) -> dict:
        """Until a master other than `not_addr` is elected and alive."""
        def ok(s):
            m = s.get("masterAddress")
            alive = {r["address"]: r["alive"] for r in s.get("replicas", [])}
            return m and m != not_addr and alive.get(m)
        return self.wait(ok, timeout, f"a master other than {not_addr}")

    def wait_full_sync_state_set(self, size: int | None = None, timeout: float = 60.0) -> dict:
        size = size or len(self.procs)
        return self.wait(lambda s: len(s.get("syncStateSet", [])) >= size, timeout,
                         f"a sync state set of {size}")

    def start_ready(self) -> dict:
        """Start every replica, create TOPIC on the elected master, and return the group's state
        once every replica is in the sync state set."""
        self.start_all()
        self.create_topic(self.wait_master()["masterAddress"])
        return self.wait_full_sync_state_set()

    def create_topic(self, addr: str, topic: str = TOPIC) -> None:
        r = self.raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                            {"topic": topic, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"})
        assert r.code == ResponseCode.SUCCESS, r.remark


class Stream:
    """A producer thread sending until stopped; records each key answered SEND_OK, when it was
    answered and when it began (`started`), and which broker answered it (`answered_by`: key ->
    the store host of its offsetMsgId)."""

    def __init__(self, producer, topic=TOPIC):
        self.producer = producer
        self.topic = topic
        self.ok: list[tuple[float, str]] = []
        self.started: list[float] = []
        self.answered_by: dict[str, str] = {}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        i = 0
        while not self._stop.is_set():
            key = f"k{i:07d}"
            i += 1
            began = time.monotonic()
            try:
                r = self.producer.send(Message(self.topic, key.encode() + b"-" + b"x" * 200, keys=key))
            except RMQError:
                self.failed += 1
                time.sleep(0.02)
                continue
            if r.status is SendStatus.SEND_OK:
                host, port, _offset = decode_offset_msg_id(r.offset_msg_id)
                self.answered_by[key] = f"{host}:{port}"
                self.started.append(began)
                self.ok.append((time.monotonic(), key))

    def first_ok_after(self, t: float, by: str | None = None) -> float | None:
        """When the first send that began after `t` was acknowledged (from broker `by` only, if
        given); a send in flight at `t` may have been answered by the old master."""
        return next((ts for began, (ts, k) in zip(self.started, self.ok)
                     if began > t and (by is None or self.answered_by.get(k) == by)), None)

    def stop(self):
        self._stop.set()
        self._thread.join(60)


def keys_on(raw, addr, topic=TOPIC) -> set[str]:
    out = set()
    for q in range(QUEUES):
        offset = 0
        while True:
            resp = raw.pull(addr, topic, q, offset, max_nums=32)
            if resp.code != ResponseCode.SUCCESS:
                break
            out.update(m.keys for m in decode_messages(resp.body))
            offset = int(resp.ext_fields["nextBeginOffset"])
    return out


def kill_rounds(g: FailoverGroup, rounds: int, per_round: int = 100) -> tuple[list[float], Stream]:
    """Start the group, stream with rmq's producer, and `rounds` times: wait for `per_round`
    acknowledged sends, SIGKILL the master, wait for the next master and the first SEND_OK of a
    send begun after the kill, restart the killed replica and wait until it is back in the sync
    state set.  Returns each round's kill -> first SEND_OK seconds and the (stopped) stream."""
    g.start_ready()
    producer = Producer("PG_FAILOVER", namesrv=g.namesrv, send_msg_timeout=3.0).start()
    stream = Stream(producer)
    times = []
    try:
        for round_ in range(rounds):
            n = len(stream.ok)
            deadline = time.monotonic() + 60
            while len(stream.ok) < n + per_round and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(stream.ok) >= n + per_round, f"round {round_}: writes did not resume ({stream.failed} failed)"
            _mid, master_addr, epoch = g.master()
            victim = g.index_of(master_addr)
            killed_at = time.monotonic()
            g.kill(victim)
            new = g.wait_master(not_addr=master_addr)
            assert new["masterEpoch"] > epoch
            deadline = time.monotonic() + 60
            while stream.first_ok_after(killed_at) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            first = stream.first_ok_after(killed_at)
            assert first is not None, f"round {round_}: no SEND_OK after the kill"
            times.append(first - killed_at)
            g.start(victim)  # rejoins as a slave, its unacknowledged tail cut
            g.wait_full_sync_state_set()
    finally:
        stream.stop()
        producer.shutdown()
    return times, stream
