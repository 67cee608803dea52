"""README.md's "Automatic failover" runs: its etcd command line (ports and data dir moved to the
test's), its namesrv.conf and broker.conf (moved likewise) as `rmq namesrv -c` and three
`rmq broker -c`, then its admin commands, whose output must match the lines under them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from rmq_core.admin.client import AdminClient
from rmq_core.config import parse_properties
from tests.etcd_cluster import _get_json
from tests.servers import RmqProcess, free_port, write_conf
from tests.test_readme import BLOCKS, pattern

BIN = Path(sys.executable).parent


def _blocks(kind):
    return [b.text for b in BLOCKS if b.kind == kind]


def section() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return text.split("## Automatic failover", 1)[1].split("\n## ", 1)[0]


def test_the_readme_failover_cluster_runs_and_its_admin_commands_print_what_it_says(tmp_path):
    etcd_line, starts = _blocks("failover")
    assert starts.strip().splitlines()[2:] == ["rmq namesrv -c namesrv.conf --listen 127.0.0.1:9876",
                                              "rmq broker -c broker-a-1.conf", "rmq broker -c broker-a-2.conf",
                                              "rmq broker -c broker-a-3.conf"]
    (ns_text,) = _blocks("namesrv_properties")
    broker_text = re.findall(r"```properties\n(.*?)```", section(), re.S)[1]
    etcd_client, etcd_peer = free_port(), free_port()
    ns, ports = f"127.0.0.1:{free_port()}", [free_port() for _ in range(3)]
    etcd_args = (etcd_line.replace("23790", str(etcd_client)).replace("23800", str(etcd_peer))
                 .replace("~/rmq-store/etcd", str(tmp_path / "etcd")).split())
    assert etcd_args[0] == "etcd"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    with open(tmp_path / "etcd.log", "wb") as log:
        etcd = subprocess.Popen(etcd_args, stdout=log, stderr=subprocess.STDOUT, env=env)
    procs = []
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if _get_json(f"http://127.0.0.1:{etcd_client}/health").get("health") == "true":
                    break
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline and etcd.poll() is None, (tmp_path / "etcd.log").read_text()
            time.sleep(0.1)
        ns_props = parse_properties(ns_text.replace("127.0.0.1:23790", f"127.0.0.1:{etcd_client}"))
        ns_props["controllerEtcdRoot"] = f"/rmq-readme-{os.getpid()}"
        nsp = RmqProcess(["namesrv", "-c", write_conf(tmp_path / "namesrv.conf", ns_props), "--listen", ns],
                         ("The Name Server boot success", "The controller boot success"))
        procs.append(nsp)
        nsp.wait_boot()
        addrs = {}
        for i, port in enumerate(ports):
            props = parse_properties(broker_text.replace("127.0.0.1:9876", ns))
            props.update(listenPort=port, haListenPort=free_port(), storePathRootDir=tmp_path / f"broker-a-{i + 1}",
                         mappedFileSizeCommitLog=1 << 20, mappedFileSizeConsumeQueue=6000 * 20)
            p = RmqProcess(["broker", "-c", write_conf(tmp_path / f"broker-a-{i + 1}.conf", props),
                            "--listen-host", "127.0.0.1"])
            procs.append(p)
            p.wait_boot()
            addrs[f"127.0.0.1:{10911 + 10 * i}"] = f"127.0.0.1:{port}"
        with AdminClient(ns) as admin:
            deadline = time.monotonic() + 60
            while len((admin.sync_state_data(ns, ["broker-a"]).get("broker-a") or {}).get("syncStateSet", [])) < 3:
                assert time.monotonic() < deadline, admin.sync_state_data(ns, ["broker-a"])
                time.sleep(0.1)

        (console,) = _blocks("failover_console")
        for readme_addr, addr in addrs.items():
            console = console.replace(readme_addr, addr)
        console = console.replace("127.0.0.1:9876", ns).replace("127.0.0.1:23790", f"127.0.0.1:{etcd_client}")
        commands: list[tuple[str, list[str]]] = []
        for line in console.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif line.strip():
                commands[-1][1].append(line)
        run_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
        for cmd, expected in commands:
            r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, env=run_env,
                               timeout=120)
            assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
            for line in expected:
                assert pattern(line).search(r.stdout), f"{cmd}: {line!r} not in:\n{r.stdout}"
    finally:
        for p in reversed(procs):
            p.terminate()
        etcd.kill()
        etcd.wait()
