"""The broker.conf blocks of README.md's "Running a replicated cluster" load as they are, and run:
`rmq broker -c` with each (ports, store and name server moved to the test's) forms a group whose
slave gets what its master stored."""
import json
import os
import re
import subprocess
import sys

import pytest

from rmq_core.broker.controller import check_broker_role
from rmq_core.config import BrokerRole, load_broker_conf, parse_properties
from rmq_core.remoting.codes import ResponseCode
from tests.broker.ha_cluster import TOPIC, create_topic
from tests.client.conftest import wait_until
from tests.rawclient import RawClient
from tests.servers import RmqProcess, free_port, write_conf

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def conf_blocks() -> list[dict]:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Running a replicated cluster", 1)[1].split("\n## ", 1)[0]
    return [parse_properties(b, "README.md") for b in re.findall(r"```properties\n(.*?)```", section, re.S)]


def start_commands() -> list[str]:
    """The lines of the section's `<!-- check: replicated -->` block (comments cut)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"<!-- check: replicated -->\n```\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_the_readme_shows_a_master_and_its_slave_that_load():
    master, slave = conf_blocks()
    # (the files alone: never what updateBrokerConfig persisted into a store of this machine they name)
    (mb, ms), (sb, ss) = load_broker_conf(master, updated=False), load_broker_conf(slave, updated=False)
    for b, s in ((mb, ms), (sb, ss)):
        check_broker_role(b, s)
    assert (mb.broker_id, ms.broker_role) == (0, BrokerRole.SYNC_MASTER)
    assert (sb.broker_id, ss.broker_role) == (1, BrokerRole.SLAVE)
    assert (mb.broker_name, mb.broker_cluster_name) == (sb.broker_name, sb.broker_cluster_name)


def test_the_readme_configs_run_as_a_replicated_group(tmp_path):
    """What the section's commands do, with its two broker.conf files, and what clusterList shows."""
    assert start_commands() == ["rmq namesrv --listen 127.0.0.1:9876", "rmq broker -c master.conf",
                                "rmq broker -c slave.conf", "rmq admin clusterList -n 127.0.0.1:9876"]
    namesrv = f"127.0.0.1:{free_port()}"
    ns = RmqProcess(["namesrv", "--listen", namesrv], ("The Name Server boot success",))
    procs, raw = [ns], RawClient()
    try:
        ns.wait_boot()
        addrs = []
        for props in conf_blocks():
            port = free_port()
            props.update(listenPort=port, haListenPort=free_port(), namesrvAddr=namesrv,
                         storePathRootDir=tmp_path / f"store-{props['brokerId']}",
                         mappedFileSizeCommitLog=1 << 20, mappedFileSizeConsumeQueue=6000 * 20)
            conf = write_conf(tmp_path / f"broker-{props['brokerId']}.conf", props)
            p = RmqProcess(["broker", "-c", conf, "--listen-host", "127.0.0.1"])
            procs.append(p)
            p.wait_boot()
            addrs.append(f"127.0.0.1:{port}")
        master, slave = addrs
        create_topic(raw, master)
        wait_until(lambda: raw.send(master, TOPIC, b"replicated").code == ResponseCode.SUCCESS, 30,
                   what="the SYNC_MASTER acknowledged by its slave")
        wait_until(lambda: raw.pull(slave, TOPIC, 0, 0).code == ResponseCode.SUCCESS, 30, what="the slave serving it")
        out = subprocess.run([sys.executable, "-m", "rmq_core.cli", "admin", "clusterList", "-n", namesrv, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = {(r["broker_name"], str(r["bid"])): r["addr"] for r in json.loads(out.stdout)}
        assert rows == {("broker-a", "0"): master, ("broker-a", "1"): slave}, rows
    finally:
        raw.close()
        for p in reversed(procs):
            p.terminate()


@pytest.mark.parametrize("bad", ["brokerRole=SLAVE\nbrokerId=0", "brokerRole=ASYNC_MASTER\nbrokerId=1"])
def test_a_role_that_does_not_match_the_id_is_refused_naming_both(bad):
    from rmq_core.errors import ConfigError

    b, s = load_broker_conf(parse_properties(bad), updated=False)
    with pytest.raises(ConfigError, match="brokerId"):
        check_broker_role(b, s)


def standalone_commands() -> list[str]:
    """The lines of the section's `<!-- check: replicated_standalone -->` block (comments cut)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"<!-- check: replicated_standalone -->\n```\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_a_standalone_master_and_a_standalone_slave_of_it_replicate(tmp_path):
    """The README's two `rmq standalone` commands as real processes (ports and stores this run's):
    the slave registers as brokerId 1 of the master's group and replicates what the master
    stores; `--help` names the flag."""
    ns, master, slave = (f"127.0.0.1:{free_port()}" for _ in range(3))
    lines = [line.replace("127.0.0.1:9876", ns).replace("127.0.0.1:10911", master).replace("127.0.0.1:10921", slave)
             .replace("/tmp/", f"{tmp_path}/") for line in standalone_commands()]
    assert [line.split()[:2] for line in lines] == [["rmq", "standalone"]] * 2
    args = [line.split()[1:] for line in lines]
    args[0] += ["--namesrv-listen", ns, "--broker-listen", master]  # the master's defaults, moved
    procs, raw = [], RawClient()
    try:
        for a in args:
            p = RmqProcess(a, env={"HOME": str(tmp_path)})
            procs.append(p)
            p.wait_boot(60)
        assert not any("Name Server" in line for line in procs[1].lines)  # no name server of its own
        create_topic(raw, master)
        for i in range(20):
            assert raw.send(master, TOPIC, f"m{i}".encode(), queue_id=0).code == ResponseCode.SUCCESS
        wait_until(lambda: raw.pull(slave, TOPIC, 0, 19).code == ResponseCode.SUCCESS, 60,
                   what="the slave serving the master's last message")
        pulled = raw.pull(slave, TOPIC, 0, 0)
        assert pulled.ext_fields["maxOffset"] == "20"
        out = subprocess.run([sys.executable, "-m", "rmq_core.cli", "admin", "clusterList", "-n", ns, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = {(r["broker_name"], str(r["bid"])): r["addr"] for r in json.loads(out.stdout)}
        assert rows == {("broker-a", "0"): master, ("broker-a", "1"): slave}, rows
        assert os.path.isdir(tmp_path / "slave" / "commitlog")
    finally:
        raw.close()
        for p in reversed(procs):
            assert p.terminate() == 0, p.lines
    help_text = subprocess.run([sys.executable, "-m", "rmq_core.cli", "standalone", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    assert "--slave-of NAMESRV" in help_text and "brokerRole=SLAVE" in help_text


def test_a_standalone_slave_without_a_name_server_is_refused_naming_the_flag(tmp_path):
    conf = write_conf(tmp_path / "slave.conf", {"brokerRole": "SLAVE", "brokerId": 1})
    out = subprocess.run([sys.executable, "-m", "rmq_core.cli", "standalone", "--store", str(tmp_path / "s"),
                          "-c", conf], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--slave-of" in out.stderr and "namesrvAddr" in out.stderr, out.stderr
