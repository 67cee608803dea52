"""Start real rmq servers for tests: in-process (`rmq_core.standalone`) or as `rmq` subprocesses on
free 127.0.0.1 ports, waiting for RocketMQ's boot line before returning."""
from __future__ import annotations

import collections
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time


def _port_slice() -> range | None:
    """Ports this process hands out: a slice of the 12,000 below the kernel's ephemeral range (no
    outgoing connection's source port lands there), one slice per pytest-xdist worker, so two
    workers never hand out the same port.  None where that range starts too low to leave room."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    low = ephemeral_low - 12_000
    if low < 10_000:
        return None
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = (ephemeral_low - low) // max(1, workers)
    return range(low + index * size, low + (index + 1) * size)


_SLICE = _port_slice()
_HANDED_OUT: collections.deque = collections.deque(maxlen=512)
# every other port of the slice, from a random start: a broker also listens on listenPort + 1 (its
# default HA port), so that one is never handed out; a start of its own for each process (a test's
# subprocess hands out ports too)
_NEXT = random.randrange(len(_SLICE) // 2) if _SLICE else 0


def free_port() -> int:
    """A port free now, and not one this process handed out lately (a test asks for several
    before any server binds them)."""
    global _NEXT
    while True:
        if _SLICE is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        else:
            port = _SLICE[(2 * _NEXT) % len(_SLICE)]
            _NEXT += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


def write_conf(path, props: dict) -> str:
    with open(path, "w") as f:
        for k, v in props.items():
            f.write(f"{k}={v}\n")
    return str(path)


def acl_broker_props(tmp, plain_acl_yml: str) -> dict:
    """The broker.conf keys of a broker with ACL on, its accounts from `plain_acl_yml` (written
    into tmp; rocketmqHome there too, so nothing is read from a real home)."""
    path = os.path.join(str(tmp), "plain_acl.yml")
    with open(path, "w") as f:
        f.write(plain_acl_yml)
    return {"aclEnable": "true", "plainAclFile": path, "rocketmqHome": str(tmp)}


def freeze(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP `pid` and return once every one of its threads has stopped.  kill() only queues the
    stop: the group stop begins when one of its threads next runs, so until then its other threads
    may still answer (a slave acknowledging the very message a test sends to time out)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_threads_stopped(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not stop within {timeout} s of SIGSTOP")
        time.sleep(0.002)


def _all_threads_stopped(pid: int) -> bool:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        if state not in ("T", "t"):
            return False
    return True


class RmqProcess:
    """`rmq <args>` in a child process; `wait_boot()` returns once the boot line(s) are printed.
    `prefix` runs it through a command that then execs it (`ip netns exec NS`: the pid stays the
    server's, so signals reach it)."""

    def __init__(self, args: list[str], boot_markers=("boot success",), env=None, cwd=None, prefix=()):
        self.rmq_args, self.env, self.cwd, self.prefix = list(args), env, cwd, prefix  # (for again())
        self.args = [*prefix, sys.executable, "-m", "rmq_core.cli", *args]
        self.boot_markers = list(boot_markers)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})}, cwd=cwd)
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, needle: str, timeout: float = 30.0, count: int = 1) -> str:
        deadline = time.time() + timeout
        with self._cond:
            while True:
                hits = [l for l in self.lines if needle in l]
                if len(hits) >= count:
                    return hits[count - 1]
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(f"{self.args} exited with {self.proc.returncode}:\n" + "\n".join(self.lines[-30:]))
                left = deadline - time.time()
                if left <= 0:
                    raise TimeoutError(f"{needle!r} not printed by {self.args} in {timeout}s:\n" + "\n".join(self.lines[-30:]))
                self._cond.wait(min(left, 0.2))

    def wait_boot(self, timeout: float = 30.0) -> list[str]:
        return [self.wait_for(m, timeout) for m in self.boot_markers]

    def again(self) -> "RmqProcess":
        """The same command started anew (same config, store and ports), e.g. after kill()."""
        return RmqProcess(self.rmq_args, self.boot_markers, env=self.env, cwd=self.cwd, prefix=self.prefix)

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


# A test broker keeps its data whatever the host's disk holds: the broker counts reserved blocks as
# used, so on a file system reporting most of its blocks reserved (df's Avail far below Size - Used)
# the stores of a long run (make bench keeps them until the session ends) take it past RocketMQ's
# 75 / 85 / 90 % levels, and retention would delete a benchmark's messages while it reads them.
# Tests of those levels set their own; store benchmarks use these too.
KEEP_DATA = {"diskMaxUsedSpaceRatio": 99, "diskSpaceCleanForciblyRatio": 0.99, "diskSpaceWarningLevelRatio": 0.995}


class NamesrvAndBroker:
    """`rmq namesrv` + one or more `rmq broker` subprocesses (a real cluster on loopback)."""

    def __init__(self, tmp_path, brokers: int = 1, broker_props: dict | None = None, cluster: str = "DefaultCluster",
                 namesrv_props: dict | None = None):
        self.tmp_path = tmp_path
        self.ns_port = free_port()
        self.namesrv = f"127.0.0.1:{self.ns_port}"
        ns_args = ["namesrv", "--listen", self.namesrv]
        if namesrv_props:
            ns_args += ["-c", write_conf(tmp_path / "namesrv.conf", namesrv_props)]
        self.ns = RmqProcess(ns_args, ("The Name Server boot success",))
        self.brokers: list[RmqProcess] = []
        self.broker_addrs: list[str] = []
        try:
            self.ns.wait_boot()
            for i in range(brokers):
                self.add_broker(f"broker-{chr(ord('a') + i)}", broker_props or {}, cluster)
        except BaseException:
            self.stop()  # a part that failed to boot leaves no server of this cluster running
            raise

    def add_broker(self, name: str, props: dict, cluster: str = "DefaultCluster", verbose: bool = False) -> RmqProcess:
        port = free_port()
        store = self.tmp_path / f"store-{name}"
        conf = write_conf(self.tmp_path / f"{name}.conf", {
            "brokerClusterName": cluster, "brokerName": name, "listenPort": port, "brokerIP1": "127.0.0.1",
            "storePathRootDir": store, "mappedFileSizeCommitLog": 64 * 1024 * 1024,
            "mappedFileSizeConsumeQueue": 6000 * 20, "maxHashSlotNum": 10000, "maxIndexNum": 40000,
            "registerNameServerPeriod": 2000, "haListenPort": free_port(), **KEEP_DATA, **props})
        proc = RmqProcess([*(["-v"] if verbose else []), "broker", "-n", self.namesrv, "-c", conf,
                           "--listen-host", "127.0.0.1"], ("boot success",))
        self.brokers.append(proc)  # (before its boot: stop() ends it whether or not it booted)
        proc.wait_boot()
        self.broker_addrs.append(f"127.0.0.1:{port}")
        return proc

    def restart_broker(self, i: int = 0, timeout: float = 60.0) -> RmqProcess:
        """Broker i started again on its config and store (after it was stopped or killed)."""
        self.brokers[i] = self.brokers[i].again()
        self.brokers[i].wait_boot(timeout)
        return self.brokers[i]

    def stored_messages(self, topic: str, broker: str = "broker-a") -> list:
        """The records of `topic` in a broker's first commit log file, read from the file as stored
        (bodies not inflated, sysFlag as written)."""
        from rmq_core._native.record import decode_message
        buf = (self.tmp_path / f"store-{broker}" / "commitlog" / f"{0:020d}").read_bytes()
        out, pos = [], 0
        while pos + 4 <= len(buf) and (size := int.from_bytes(buf[pos:pos + 4], "big", signed=True)) > 0:
            m = decode_message(buf, pos, decompress=False)
            if m.topic == topic:
                out.append(m)
            pos += size
        return out

    def stop(self) -> None:
        for b in self.brokers:
            b.terminate()
        self.ns.terminate()


class Tmpfs:
    """A small tmpfs mounted at `path` for a test (as root: `mount -t tmpfs -o size=...`),
    unmounted by `close()`.  `Tmpfs.mount` skips the calling test, with the reason, where the
    mount is impossible (not root, no mount binary, a container without CAP_SYS_ADMIN)."""

    def __init__(self, path, size: str):
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", self.path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(f"mount -t tmpfs -o size={size} at {self.path} failed: {(r.stderr or r.stdout).strip()}")

    @classmethod
    def mount(cls, path, size: str) -> "Tmpfs":
        import pytest

        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        try:
            return cls(path, size)
        except (OSError, FileNotFoundError) as e:
            pytest.skip(f"cannot mount a tmpfs here: {e}")

    def fill(self, name: str = "filler") -> int:
        """Another process (dd) writes a file until the file system is full; returns its size."""
        path = os.path.join(self.path, name)
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=64k"], capture_output=True)
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4k", "oflag=append", "conv=notrunc"],
                       capture_output=True)  # the last partial 64 KiB
        return os.path.getsize(path)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        r = subprocess.run(["umount", self.path], capture_output=True, text=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", self.path], capture_output=True)


class UnreachableBroker:
    """`rmq namesrv` + an `rmq broker` that registers 127.0.0.1:PORT (brokerIP1) but listens on
    127.0.0.2: the routes name a broker no client reaches (connection refused), as when brokerIP1 is
    an address the clients cannot reach.  Its store already holds `topic` (created while the broker
    still listened on 127.0.0.1)."""

    def __init__(self, tmp_path, topic: str = "TopicA"):
        self.namesrv = f"127.0.0.1:{free_port()}"
        port = free_port()
        self.broker_addr = f"127.0.0.1:{port}"
        self.ns = RmqProcess(["namesrv", "--listen", self.namesrv], ("The Name Server boot success",))
        self.ns.wait_boot()
        conf = write_conf(tmp_path / "unreachable-broker.conf", {
            "brokerIP1": "127.0.0.1", "listenPort": port, "storePathRootDir": tmp_path / "unreachable-store",
            "mappedFileSizeCommitLog": 4 * 1024 * 1024, "maxHashSlotNum": 1000, "maxIndexNum": 4000})
        try:
            from rmq_core.admin import AdminClient

            first = RmqProcess(["broker", "-n", self.namesrv, "-c", conf, "--listen-host", "127.0.0.1"])
            try:
                first.wait_boot()
                with AdminClient(self.namesrv) as admin:
                    admin.create_or_update_topic(self.broker_addr, topic, read_queue_nums=2, write_queue_nums=2)
            finally:
                first.terminate()
            self.broker = RmqProcess(["broker", "-n", self.namesrv, "-c", conf, "--listen-host", "127.0.0.2"])
            self.broker.wait_boot()
        except BaseException:
            self.ns.terminate()
            raise

    def stop(self) -> None:
        self.broker.terminate()
        self.ns.terminate()

    def __enter__(self) -> "UnreachableBroker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
