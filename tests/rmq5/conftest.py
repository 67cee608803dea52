"""Apache's RocketMQ 5 Python client (rocketmq-python-client, installed by `make rmq5-client` into
.venv-rmq5) driven by tests/rmq5/driver.py in a child process against real rmq brokers."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import tempfile
import threading
import time

import pytest

from tests.admin.test_admin_cli import ok
from tests.proxy.conftest import grpc_cluster as proxy_grpc_cluster

DRIVER = os.path.join(os.path.dirname(__file__), "driver.py")
RMQ5_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           ".venv-rmq5", "bin", "python")


@pytest.fixture(scope="session")
def rmq5_python(tmp_path_factory) -> str:
    """The interpreter of the 5.x client's environment; a missing one fails the test, naming the fix."""
    if not os.access(RMQ5_PYTHON, os.X_OK):
        pytest.fail(f"Apache's RocketMQ 5 Python client is not installed: {RMQ5_PYTHON} is missing; "
                    f"run `make rmq5-client` (make test does it)", pytrace=False)
    home = tmp_path_factory.mktemp("rmq5-import")  # (importing the client makes ~/logs/rocketmq_python)
    r = subprocess.run([RMQ5_PYTHON, "-c", "import rocketmq.v5"], capture_output=True, text=True,
                       env={**os.environ, "HOME": str(home)})
    if r.returncode != 0:
        pytest.fail(f"{RMQ5_PYTHON} cannot import the client (rocketmq.v5): {r.stderr.strip()[-500:]}; "
                    f"remove .venv-rmq5 and run `make rmq5-client`", pytrace=False)
    return RMQ5_PYTHON


def grpc_cluster(tmp_path, **props):
    """tests/proxy's cluster (`rmq namesrv` + one `rmq broker` serving gRPC; `.endpoint` is what a 5.x
    client is given), whose receives may ask for invisible durations from 1 s: the proxy's minimum,
    10 s, would make each redelivery case wait."""
    return proxy_grpc_cluster(tmp_path, **{"minInvisibleTimeMillsForRecv": 1000, **props})


def make_group(cl, group: str, retry_max: int = 16, fifo: bool = False) -> None:
    """`rmq admin updateSubGroup` (-o true: a FIFO group, mqadmin's consumeMessageOrderly)."""
    ok("updateSubGroup", "-b", cl.broker_addrs[0], "-g", group, "-r", str(retry_max),
       *(["-o", "true"] if fifo else []), ns=cl.namesrv)


class Rmq5Client:
    """One driver.py child: `call(op, **args)` sends a command and returns its answer; `events`
    holds the lines it wrote on its own (pushed messages, transaction checks)."""

    def __init__(self, python: str, endpoint: str, home, access_key=None, secret_key=None):
        os.makedirs(home, exist_ok=True)
        self.home = str(home)
        # a temporary HOME: the client writes its logs under ~/logs; no proxy settings: the client's
        # gRPC channels go to the loopback endpoint itself
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["HOME"] = self.home
        if access_key is not None:
            env.update(RMQ5_ACCESS_KEY=access_key, RMQ5_SECRET_KEY=secret_key or "")
        self._stderr = tempfile.TemporaryFile(dir=self.home)
        self.proc = subprocess.Popen([python, DRIVER, endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, env=env)
        self.events: list[dict] = []
        self._answers: dict[int, dict] = {}
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_event(lambda e: e.get("event") == "ready", 60, "the driver's start")

    def _read(self):
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                obj = {"event": "unparsed", "line": line}
            with self._cond:
                if "id" in obj:
                    self._answers[obj["id"]] = obj
                else:
                    self.events.append(obj)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def call(self, op: str, timeout: float = 60, check: bool = True, **args) -> dict:
        cid = next(self._ids)
        self.proc.stdin.write(json.dumps({"id": cid, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        with self._cond:
            while cid not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no answer to {op} {args} in {timeout}s; driver stderr:\n{self.stderr_tail()}")
                self._cond.wait(min(left, 0.2))
            answer = self._answers.pop(cid)
        if check and not answer["ok"]:
            raise AssertionError(f"{op} failed: {answer['error']}\n{answer.get('trace', '')}\n"
                                 f"client log: {answer.get('log')}")
        return answer

    def wait_event(self, pred, timeout: float, what: str = "an event") -> list[dict]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                hits = [e for e in self.events if pred(e)]
                if hits:
                    return hits
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{what} not seen in {timeout}s; events {self.events[-5:]}; "
                                         f"driver stderr:\n{self.stderr_tail()}")
                self._cond.wait(min(left, 0.2))

    def messages(self) -> list[dict]:
        """What a push consumer handed its listener so far."""
        with self._cond:
            return [e for e in self.events if e.get("event") == "message"]

    def stderr_tail(self, limit=3000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]

    def log(self) -> str:
        """The client's own log file."""
        try:
            with open(os.path.join(self.home, "logs", "rocketmq_python", "rocketmq_client.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            try:
                self.call("shutdown", timeout=timeout, check=False)
            except (AssertionError, BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)


@pytest.fixture
def rmq5_client(rmq5_python, tmp_path):
    """A factory of driver children (each its own HOME under tmp_path), all closed at the end."""
    made: list[Rmq5Client] = []
    names = itertools.count(1)

    def make(endpoint: str, **kw) -> Rmq5Client:
        c = Rmq5Client(rmq5_python, endpoint, tmp_path / f"rmq5-home-{next(names)}", **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
