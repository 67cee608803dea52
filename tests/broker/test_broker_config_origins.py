"""updateBrokerConfig persists a value that is read over broker.conf at every start: that
precedence is shown, never silent.  getBrokerConfig names each value's origin (the -c file,
updateBrokerConfig's file over the file's value, a flag or argument, the default), the start names
each persisted override with the value it hides and the command that drops it, and
`updateBrokerConfig --reset` drops it (at once for a key a running broker applies).  A broker on a
free TCP port with its broker.conf on disk, restarted on the same store; `rmq admin` as a user runs
it where its output matters."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

from rmq_core.admin import AdminClient
from rmq_core.embedded import Cluster
from tests.broker.conftest import SMALL
from tests.servers import free_port, write_conf


def admin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmq_core.cli", "admin", *args], capture_output=True, text=True,
                          timeout=60)


def test_a_persisted_update_is_shown_named_at_start_and_dropped_by_reset(tmp_path, caplog):
    conf = write_conf(tmp_path / "broker-a.conf", {**SMALL, "maxMessageSize": 4194304, "fileReservedTime": 72})
    store, listen = str(tmp_path / "store"), f"127.0.0.1:{free_port()}"
    persisted = tmp_path / "store" / "config" / "broker.properties"
    cluster = Cluster(store, conf, broker_listen=listen).start()
    client = AdminClient(cluster.tcp_namesrv)
    ns, addr = cluster.tcp_namesrv, cluster.broker_addr

    def shown(key):
        props, origins = client.broker_config_origins(addr)
        return props[key], origins.get(key, "default")

    try:
        assert shown("maxMessageSize") == ("4194304", f"file {conf}")
        assert shown("listenPort")[1] == "command line / argument"  # (--broker-listen)
        assert shown("brokerPermission")[1] == "default"

        # the README's example: two keys the broker applies at once
        assert client.update_broker_config(addr, {"maxMessageSize": "1048576"}) is None  # (in effect now)
        client.update_broker_config(addr, {"fileReservedTime": "48"})
        r = admin("getBrokerConfig", "-n", ns, "-b", addr, "--json")
        rows = {row["key"]: (row["value"], row["origin"]) for row in json.loads(r.stdout)}
        assert rows["maxMessageSize"] == ("1048576", f"updateBrokerConfig ({persisted}), over file {conf}'s 4194304")
        assert rows["fileReservedTime"] == ("48", f"updateBrokerConfig ({persisted}), over file {conf}'s 72")

        # at the next start: one line per persisted value, naming what it hides and the way back
        client.close()
        cluster.stop()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rmq.broker"):
            cluster = Cluster(store, conf, broker_listen=listen).start()
        client = AdminClient(ns := cluster.tcp_namesrv)
        lines = [r.getMessage() for r in caplog.records if "persisted by updateBrokerConfig" in r.getMessage()]
        assert len(lines) == 2, lines
        for key, value, file_value in (("maxMessageSize", 1048576, 4194304), ("fileReservedTime", 48, 72)):
            (line,) = [l for l in lines if l.startswith(f"{key}={value} (persisted by updateBrokerConfig")]
            assert f"in {persisted}) overrides file {conf}: {file_value}" in line, line
            assert line.endswith(f"to go back to it: rmq admin updateBrokerConfig -b {addr} -k {key} --reset"), line
        assert shown("maxMessageSize") == ("1048576", f"updateBrokerConfig ({persisted}), over file {conf}'s 4194304")
        assert cluster.store_config.max_message_size == 1048576

        # the way back: dropped from the persisted file, broker.conf's value in force at once
        r = admin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "maxMessageSize", "--reset")
        assert r.returncode == 0, r.stderr
        assert f"maxMessageSize: dropped from {persisted}; 4194304 from file {conf} in effect now" in r.stdout
        assert shown("maxMessageSize") == ("4194304", f"file {conf}")
        assert cluster.store_config.max_message_size == 4194304
        assert "maxMessageSize" not in persisted.read_text() and "fileReservedTime=48" in persisted.read_text()
        assert "72 from file" in client.reset_broker_config(addr, ["fileReservedTime"])
        assert not persisted.exists()  # nothing persisted is left, nothing overrides the file at the next start
        assert shown("fileReservedTime") == ("72", f"file {conf}")
        assert client.reset_broker_config(addr, ["fileReservedTime"]).startswith(
            f"fileReservedTime: nothing persisted in {persisted}")

        # a key that waits for a restart: shown as such, and dropped before it ever held
        assert "takes effect after a restart" in client.update_broker_config(addr, {"flushDiskType": "SYNC_FLUSH"})
        assert shown("flushDiskType") == (
            "ASYNC_FLUSH", f"the default; updateBrokerConfig ({persisted}) makes it SYNC_FLUSH at the next start")
        assert client.reset_broker_config(addr, ["flushDiskType"]) == \
            f"flushDiskType: dropped from {persisted}; ASYNC_FLUSH stays"
        assert shown("flushDiskType") == ("ASYNC_FLUSH", "default")

        # refusals name the bad key, or the flags
        r = admin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "maxMessageSiz", "--reset")
        assert r.returncode == 1 and "unknown config key 'maxMessageSiz' (did you mean 'maxMessageSize'?)" in r.stderr
        r = admin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "maxMessageSize")
        assert r.returncode == 1 and "give -v VALUE (a new value) or --reset" in r.stderr, r.stderr
    finally:
        client.close()
        cluster.stop()
