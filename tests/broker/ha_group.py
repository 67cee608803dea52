"""A broker group of real processes for replication tests: `rmq namesrv`, a master (brokerId 0)
and a slave (brokerId 1) of one brokerName, each restartable on the same config and store."""
from __future__ import annotations

import os
import time

from tests.servers import RmqProcess, free_port, write_conf

SEGMENT = 1024 * 1024  # small commit-log segments: a burst rolls several (blanks replicated too)


class HAGroup:
    def __init__(self, tmp_path, role: str = "ASYNC_MASTER", master_props: dict | None = None,
                 slave_props: dict | None = None):
        self.tmp_path = tmp_path
        self.namesrv = f"127.0.0.1:{free_port()}"
        self.ns = RmqProcess(["namesrv", "--listen", self.namesrv], ("The Name Server boot success",))
        self.ns.wait_boot()
        common = {"brokerClusterName": "HACluster", "brokerName": "broker-ha", "brokerIP1": "127.0.0.1",
                  "mappedFileSizeCommitLog": SEGMENT, "mappedFileSizeConsumeQueue": 6000 * 20,
                  "maxHashSlotNum": 10000, "maxIndexNum": 40000, "registerNameServerPeriod": 1000}
        self.master_port, self.slave_port = free_port(), free_port()
        self.master_ha_port = free_port()
        self.master_store = tmp_path / "store-master"
        self.slave_store = tmp_path / "store-slave"
        self.master_conf = write_conf(tmp_path / "master.conf", {
            **common, "brokerId": 0, "brokerRole": role, "listenPort": self.master_port,
            "haListenPort": self.master_ha_port, "storePathRootDir": self.master_store, **(master_props or {})})
        self.slave_conf = write_conf(tmp_path / "slave.conf", {
            **common, "brokerId": 1, "brokerRole": "SLAVE", "listenPort": self.slave_port,
            "haListenPort": free_port(), "storePathRootDir": self.slave_store, **(slave_props or {})})
        self.master: RmqProcess | None = None
        self.slave: RmqProcess | None = None

    def move_master_ha_port(self) -> int:
        """A new haListenPort for the master's next start; returns it."""
        self.master_ha_port = free_port()
        with open(self.master_conf) as f:
            lines = [l for l in f if not l.startswith("haListenPort=")]
        with open(self.master_conf, "w") as f:
            f.writelines(lines + [f"haListenPort={self.master_ha_port}\n"])
        return self.master_ha_port

    @property
    def master_addr(self) -> str:
        return f"127.0.0.1:{self.master_port}"

    @property
    def slave_addr(self) -> str:
        return f"127.0.0.1:{self.slave_port}"

    def start_master(self) -> RmqProcess:
        self.master = RmqProcess(["broker", "-n", self.namesrv, "-c", self.master_conf, "--listen-host", "127.0.0.1"])
        self.master.wait_boot()
        return self.master

    def start_slave(self) -> RmqProcess:
        self.slave = RmqProcess(["broker", "-n", self.namesrv, "-c", self.slave_conf, "--listen-host", "127.0.0.1"])
        self.slave.wait_boot()
        return self.slave

    def stop(self) -> None:
        for p in (self.slave, self.master, self.ns):
            if p is not None:
                if p.proc.poll() is None:
                    try:
                        os.kill(p.proc.pid, 18)  # SIGCONT: a frozen process must be able to stop
                    except ProcessLookupError:
                        pass
                p.terminate()


def commit_log_segments(store_dir) -> dict[str, bytes]:
    """The commit-log segments holding data, by name (a preallocated, still empty next segment is
    left out)."""
    d = os.path.join(store_dir, "commitlog")
    out = {}
    if not os.path.isdir(d):
        return out
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        if data.rstrip(b"\0"):
            out[name] = data
    return out


def log_end(segments: dict[str, bytes]) -> int:
    """Where the data of a commit log ends (its last segment's last non-zero byte + 1)."""
    if not segments:
        return 0
    name = max(segments)
    return int(name) + len(segments[name].rstrip(b"\0"))


def wait_replicated(master_store, slave_store, timeout: float = 60.0) -> dict[str, bytes]:
    """Wait until the slave's commit log equals the master's, segment for segment, byte for byte;
    returns the master's segments.  On timeout, names the first segment that differs."""
    deadline = time.monotonic() + timeout
    while True:
        m, s = commit_log_segments(master_store), commit_log_segments(slave_store)
        if m and m == s:
            return m
        if time.monotonic() > deadline:
            diff = next((n for n in sorted(set(m) | set(s)) if m.get(n) != s.get(n)), None)
            raise AssertionError(f"slave never caught up: master ends at {log_end(m)}, slave at {log_end(s)}; "
                                 f"first different segment {diff}")
        time.sleep(0.2)
