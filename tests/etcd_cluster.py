"""Real etcd members for tests: each on free 127.0.0.1 ports (never 2379/2380) with its own data
dir, started from Debian's etcd-server (`make test` installs it).

Small raft timings keep tests fast: heartbeat 50 ms and election timeout 500 ms make an election
take well under a second after a leader dies, and etcd's lease floor (1.5 election timeouts,
rounded up to whole seconds) 1 s."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid

from tests.servers import free_port

HEARTBEAT_MS = 50
ELECTION_MS = 500
START_TIMEOUT = 20.0


def etcd_binary() -> str:
    path = shutil.which("etcd")
    if path is None:
        raise RuntimeError("etcd is not installed (no `etcd` on PATH): `make test` installs it "
                           "(Debian's etcd-server package)")
    return path


def _get_json(url: str, timeout: float = 0.5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _post_json(url: str, body: dict, timeout: float = 0.5):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class EtcdCluster:
    """`members` etcd processes forming one cluster.  `start()` returns once every member answers
    /health; `kill(i)` is SIGKILL; `restart(i)` starts member i again on its data dir and ports."""

    def __init__(self, tmp_path, members: int = 1):
        if members not in (1, 3, 5):
            raise ValueError(f"members={members!r}: an etcd cluster for tests has 1, 3 or 5 members")
        self.dir = tmp_path / f"etcd-{uuid.uuid4().hex[:8]}"
        self.n = members
        self.procs: list[subprocess.Popen | None] = [None] * members
        self._pick_ports()

    def _pick_ports(self):
        self.client_ports = [free_port() for _ in range(self.n)]
        self.peer_ports = [free_port() for _ in range(self.n)]
        assert not {2379, 2380} & {*self.client_ports, *self.peer_ports}
        self.token = uuid.uuid4().hex  # a member of another test's cluster can never join this one

    @property
    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def client_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.client_ports[i]}"

    def log(self, i: int) -> str:
        try:
            return (self.dir / f"m{i}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _spawn(self, i: int, state: str):
        peers = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        args = [
            etcd_binary(), "--name", f"m{i}", "--data-dir", str(self.dir / f"m{i}"),
            "--listen-client-urls", self.client_url(i), "--advertise-client-urls", self.client_url(i),
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
            "--initial-cluster", peers, "--initial-cluster-state", state,
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
            "--logger", "zap", "--log-level", "warn",
        ]
        # The package's /etc/default/etcd is for its service; an ETCD_* variable here would
        # override or clash with the flags above.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"m{i}.log", "ab") as log:
            self.procs[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             stdin=subprocess.DEVNULL)

    def _healthy(self, i: int) -> bool:
        try:
            return _get_json(self.client_url(i) + "/health").get("health") == "true"
        except (OSError, ValueError):
            return False

    def _wait_healthy(self, members, timeout: float = START_TIMEOUT):
        deadline = time.monotonic() + timeout
        waiting = set(members)
        while waiting:
            for i in list(waiting):
                proc = self.procs[i]
                if proc.poll() is not None:
                    raise RuntimeError(f"etcd member m{i} exited with {proc.returncode}:\n{self.log(i)[-3000:]}")
                if self._healthy(i):
                    waiting.discard(i)
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"etcd members {sorted(waiting)} not healthy in {timeout}s:\n"
                                   + "\n".join(self.log(i)[-1500:] for i in waiting))
            if waiting:
                time.sleep(0.05)

    def start(self) -> "EtcdCluster":
        """Start every member; a member that lost a port race to another process makes a new
        pick of ports (free_port can only say a port was free a moment ago)."""
        for attempt in range(3):
            for i in range(self.n):
                self._spawn(i, "new")
            try:
                self._wait_healthy(range(self.n))
                return self
            except RuntimeError as e:
                self.stop()
                if "address already in use" not in str(e) or attempt == 2:
                    raise
                shutil.rmtree(self.dir, ignore_errors=True)
                self._pick_ports()
        return self

    def kill(self, i: int):
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def restart(self, i: int):
        """Member i again, same data dir and ports.  Waits for /health when a quorum of members
        runs (without one no member is healthy), else only for its client port to answer."""
        self.kill(i)
        self._spawn(i, "existing")
        running = sum(p is not None and p.poll() is None for p in self.procs)
        if running > self.n // 2:
            self._wait_healthy([i])
            return
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"etcd member m{i} exited with {self.procs[i].returncode}:\n{self.log(i)[-3000:]}")
            try:
                _get_json(self.client_url(i) + "/version")
                return
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd member m{i} does not answer on {self.client_url(i)}")
                time.sleep(0.05)

    def leader(self) -> int:
        """The index of the member the running members agree leads (waits out an election)."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            ids = {}
            for i, proc in enumerate(self.procs):
                if proc is None or proc.poll() is not None:
                    continue
                try:
                    st = _post_json(self.client_url(i) + "/v3/maintenance/status", {})
                except (OSError, ValueError):
                    continue
                ids[int(st["header"]["member_id"])] = (i, int(st.get("leader", 0)))
            leaders = {lead for _, lead in ids.values()}
            if len(leaders) == 1 and (lead := leaders.pop()) in ids:
                return ids[lead][0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no etcd leader agreed on: {ids}")
            time.sleep(0.05)

    def stop(self):
        for i in range(self.n):
            self.kill(i)
