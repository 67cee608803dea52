"""README.md's "Running a broker and a cluster": its two broker.conf blocks (broker-a, broker-b) run
as `rmq broker -c` beside `rmq namesrv` (name server and broker ports moved to free ones, `~` the
test's own home), and both brokers are listed by clusterList.  A second broker given broker-a's HA
port (listenPort + 1) as its listenPort stops with an error naming the clash."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from rmq_core.config import parse_properties
from tests.servers import RmqProcess, free_port, write_conf
from tests.test_readme import BLOCKS

README = Path(__file__).resolve().parents[1] / "README.md"


def section_confs() -> list[dict]:
    text = README.read_text().split("## Running a broker and a cluster", 1)[1].split("\n## ", 1)[0]
    return [parse_properties(b, "README.md") for b in re.findall(r"```properties\n(.*?)```", text, re.S)]


def free_port_pair() -> int:
    """A port whose next one is free too (a broker's listenPort and its default HA port)."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def test_the_readme_two_broker_cluster_runs_and_a_port_clash_with_an_ha_port_is_named(tmp_path):
    (block,) = [b for b in BLOCKS if b.kind == "cluster"]
    lines = [line.split("#")[0].strip() for line in block.text.strip().splitlines()]
    assert lines == ["rmq namesrv --listen 127.0.0.1:9876", "rmq broker -c broker-a.conf", "rmq broker -c broker-b.conf",
                     "rmq admin clusterList -n 127.0.0.1:9876"]
    a, b = section_confs()[:2]
    assert (a["brokerName"], b["brokerName"]) == ("broker-a", "broker-b")
    assert int(b["listenPort"]) >= int(a["listenPort"]) + 2  # broker-a's HA port, listenPort + 1, stays free
    assert a["storePathRootDir"].startswith("~/") and b["storePathRootDir"].startswith("~/")
    assert int(a["mappedFileSizeCommitLog"]) <= 64 << 20 and int(b["mappedFileSizeCommitLog"]) <= 64 << 20

    ns = f"127.0.0.1:{free_port()}"
    env = {"HOME": str(tmp_path)}  # the README's ~/rmq-store
    procs = [RmqProcess(["namesrv", "--listen", ns], ("The Name Server boot success",), env=env)]
    try:
        procs[0].wait_boot()
        addrs = {}
        for props in (a, b):
            port = free_port_pair()
            props = {**props, "namesrvAddr": ns, "listenPort": port}
            p = RmqProcess(["broker", "-c", write_conf(tmp_path / f"{props['brokerName']}.conf", props),
                            "--listen-host", "127.0.0.1"], env=env)
            procs.append(p)
            p.wait_boot(60)
            addrs[props["brokerName"]] = port
        assert (tmp_path / "rmq-store" / "broker-a" / "config" / "topics.json").is_file()
        assert (tmp_path / "rmq-store" / "broker-b" / "config" / "topics.json").is_file()
        out = subprocess.run([sys.executable, "-m", "rmq_core.cli", "admin", "clusterList", "-n", ns, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = {r["broker_name"]: r["addr"] for r in json.loads(out.stdout)}
        assert rows == {name: f"127.0.0.1:{port}" for name, port in addrs.items()}, rows

        # broker-b's config with listenPort = broker-a's listenPort + 1: broker-a's HA port
        ha = addrs["broker-a"] + 1
        clash = {**b, "namesrvAddr": ns, "listenPort": ha, "brokerName": "broker-c",
                 "storePathRootDir": str(tmp_path / "broker-c")}
        r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "broker", "-c", write_conf(tmp_path / "c.conf", clash),
                            "--listen-host", "127.0.0.1"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, **env})
        assert r.returncode == 2, r.stdout + r.stderr
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"rmq broker: error: cannot listen on 127.0.0.1:{ha}") and "in use" in line, line
        assert line.endswith(f": listenPort {ha} is the HA port of broker-a (127.0.0.1:{addrs['broker-a']}; a broker "
                             f"also listens on listenPort + 1 for its slaves, haListenPort): give this broker a "
                             f"listenPort whose next port is free too, e.g. {ha + 9}"), line
    finally:
        for p in reversed(procs):
            assert p.terminate() == 0, p.lines
