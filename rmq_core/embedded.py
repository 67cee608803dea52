"""Name server + broker in one process: `rmq standalone` and `rmq_core.standalone(store=DIR)`.

From Python the servers run on their own event loop in a daemon thread, so the caller's code
(sync or asyncio) is free; clients in the same process reach them in-proc through
`cluster.namesrv` (an `inproc://` address) and other processes over TCP (`cluster.tcp_namesrv`).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from typing import Any, Mapping

from rmq_core import loops
from rmq_core.broker.controller import BrokerController
from rmq_core.common.delegate import delegate
from rmq_core.config import BrokerRole, NamesrvConfig, load_broker_conf
from rmq_core.errors import ConfigError
from rmq_core.message import parse_address
from rmq_core.namesrv import NamesrvController
from rmq_core.remoting.server import RemotingServer

log = logging.getLogger("rmq")
_ids = itertools.count(1)

# The embedded and standalone modes are sized for a laptop: RocketMQ's defaults (which `rmq broker`
# keeps) hold two 1 GiB commit-log segments and a 420 MB index file as real blocks from the start.
# broker.conf keys and keyword settings override these.
LAPTOP_SIZES = {
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,  # the active segment + the pre-created next: 128 MiB
    "mappedFileSizeConsumeQueue": 30_000 * 20,    # 600 KB per queue (RocketMQ: 300,000 entries, 6 MB)
    "maxHashSlotNum": 100_000,                    # one index file of about 8.4 MB (RocketMQ: 420 MB)
    "maxIndexNum": 400_000,
}


class Cluster:
    """A running embedded name server + broker; with `slave=True` also a slave of that broker
    (brokerId 1, brokerRole SLAVE, its store under `<store>/slave`, any free ports), replicating
    from it as a `rmq broker` slave does: `cluster.slave` is its BrokerController,
    `cluster.slave_addr` its address.  Settings given (a config file, keyword overrides such as
    broker_role="SYNC_MASTER" or slave_read_enable=True) apply to both, roles and ports aside;
    `request_steps` are the broker's own request steps (rmq_core.remoting.RequestStep).

    `slave_of="HOST:PORT"` (`rmq standalone --slave-of`), or a config with brokerRole=SLAVE and
    namesrvAddr: this process is only a slave (brokerId 1 unless the config gives another) of
    the broker group of its brokerName registered at that name server (another standalone's or
    a cluster's); it starts no name server of its own, registers with that one, learns its
    master from it and replicates as a `rmq broker` slave does."""

    def __init__(self, store: str | None = None, config: str | Mapping[str, Any] | None = None, *,
                 namesrv_listen: str = "127.0.0.1:0", broker_listen: str = "127.0.0.1:0",
                 name: str | None = None, slave: bool = False, slave_of: str | None = None, request_steps=(),
                 grpc_listen: str | None = None, grpc_optional: bool = False, **overrides):
        self.name = name or f"rmq-{os.getpid()}-{next(_ids)}"
        self.request_steps = list(request_steps or ())  # the broker's own (rmq_core.remoting.RequestStep)
        ns_host, ns_port = parse_address(namesrv_listen)
        b_host, b_port = parse_address(broker_listen)
        # grpc_listen="HOST:PORT": also serve RocketMQ 5's gRPC protocol there (grpcServerPort; port 0: off)
        self._grpc_host = None
        self._grpc_optional = grpc_optional  # (a default port: one in use is a warning, not a failure)
        if grpc_listen is not None:
            self._grpc_host, grpc_port = parse_address(grpc_listen)
            overrides["grpc_server_port"] = grpc_port
        if store is not None:
            overrides.setdefault("store_path_root_dir", os.path.abspath(os.path.expanduser(store)))
        overrides.setdefault("listen_port", b_port)
        overrides.setdefault("broker_ip1", "127.0.0.1" if b_host in ("0.0.0.0", "") else b_host)
        if slave_of is not None:
            parse_address(slave_of)  # a bad address is named here
            overrides.update(namesrv_addr=slave_of, broker_role="SLAVE")
        self.broker_config, self.store_config = load_broker_conf(config, defaults=LAPTOP_SIZES, **overrides)
        # only a slave: of the group registered at another name server (none of its own)
        self.slave_only = self.store_config.broker_role is BrokerRole.SLAVE
        if self.slave_only:
            if slave:
                raise ConfigError("slave=True adds a slave to this process's master, but this broker is a "
                                  "slave itself (brokerRole=SLAVE / slave_of)")
            if not self.broker_config.namesrv_addr_list:
                raise ConfigError("a slave (brokerRole=SLAVE) replicates the master registered at a name server: "
                                  "give --slave-of HOST:PORT (that name server) or namesrvAddr in broker.conf")
            if self.broker_config.broker_id == 0:
                self.broker_config.broker_id = 1
        self.slave_broker_config = self.slave_store_config = None
        if slave:
            self.slave_broker_config, self.slave_store_config = load_broker_conf(config, defaults=LAPTOP_SIZES, **{
                **overrides, "store_path_root_dir": os.path.join(self.store_config.store_path_root_dir, "slave"),
                "listen_port": 0, "ha_listen_port": 0, "broker_id": 1, "broker_role": "SLAVE", "grpc_server_port": 0})
        self.namesrv_config = NamesrvConfig(
            listen_port=ns_port, listen_host=ns_host,
            kv_config_path=os.path.join(self.store_config.store_path_root_dir, "namesrv", "kvConfig.json"))
        self._ns_listen = f"{ns_host}:{ns_port}"
        self._b_host = b_host
        self.namesrv_controller: NamesrvController | None = None
        self.broker: BrokerController | None = None
        self.slave: BrokerController | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.boot_lines: list[str] = []
        self.tcp_namesrv: str | None = None

    @property
    def namesrv(self) -> str:
        """In-proc name server address (clients in this process); a slave-only process's: the
        name server its group registers with."""
        if self.slave_only:
            return self.broker_config.namesrv_addr
        return f"inproc://{self.name}-namesrv"

    broker_addr = delegate("broker.broker_addr")
    slave_addr = delegate("slave.broker_addr")
    store_path = delegate("store_config.store_path_root_dir")

    # --- async core (also used by the CLI in the foreground) --------------------------------------------
    async def start_async(self) -> list[str]:
        self.loop = asyncio.get_running_loop()
        if self.slave_only:
            self.tcp_namesrv = self.broker_config.namesrv_addr
            self.broker = BrokerController(self.broker_config, self.store_config, listen_host=self._b_host,
                                           inproc_name=f"{self.name}-broker", request_steps=self.request_steps)
            self.broker.grpc_listen_host, self.broker.grpc_optional = self._grpc_host, self._grpc_optional
            self.boot_lines.append(await self.broker.start())
            self._grpc_boot_line()
            return self.boot_lines
        ns = self.namesrv_controller = NamesrvController(self.namesrv_config, self._ns_listen)
        ns_line = await ns.start()
        # The same name server, reachable in-proc by clients of this process.
        self._ns_inproc = RemotingServer(self.namesrv, name="namesrv-inproc")
        for code in ns.processor.codes:
            self._ns_inproc.register_processor(code, ns.processor)
        self._ns_inproc.on_channel_close.append(ns._on_channel_close)
        await self._ns_inproc.start()
        self.tcp_namesrv = self.namesrv_controller.listen_address
        self.boot_lines.append(ns_line)
        self.broker_config.namesrv_addr = self.tcp_namesrv
        self.broker = BrokerController(self.broker_config, self.store_config, listen_host=self._b_host,
                                       inproc_name=f"{self.name}-broker", request_steps=self.request_steps)
        self.broker.grpc_listen_host, self.broker.grpc_optional = self._grpc_host, self._grpc_optional
        try:
            self.boot_lines.append(await self.broker.start())
            self._grpc_boot_line()
            if self.slave_broker_config is not None:
                self.slave_broker_config.namesrv_addr = self.tcp_namesrv
                self.slave = BrokerController(self.slave_broker_config, self.slave_store_config,
                                              listen_host=self._b_host, inproc_name=f"{self.name}-slave")
                self.boot_lines.append(await self.slave.start())
        except BaseException:
            if self.slave is not None and self.slave.started:
                await self.slave.stop()
            if self.broker.started:
                await self.broker.stop()
            await self._ns_inproc.stop()
            await self.namesrv_controller.stop()
            raise
        return self.boot_lines

    def _grpc_boot_line(self) -> None:
        line = self.broker.grpc_line()
        if line:
            self.boot_lines.append(line)

    @property
    def grpc_endpoint(self) -> str | None:
        """'host:port' a RocketMQ 5 client is given (None when gRPC is off)."""
        server = self.broker.grpc_server if self.broker is not None else None
        return f"{self.broker_config.broker_ip1}:{server.port}" if server is not None else None

    async def stop_async(self) -> None:
        if self.slave is not None:
            await self.slave.stop()
        if self.broker is not None:
            await self.broker.stop()
        if self.namesrv_controller is not None:
            await self._ns_inproc.stop()
            await self.namesrv_controller.stop()

    # --- threaded (from Python) -----------------------------------------------------------------------------
    def start(self) -> "Cluster":
        ready = threading.Event()
        error: list[BaseException] = []
        self.loop = loops.new_event_loop()

        def run():
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self.start_async())
            except BaseException as e:  # surface start failures to the caller
                error.append(e)
                ready.set()
                return
            ready.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            self._thread.join(5)
            self.loop.close()
            raise error[0]
        return self

    def call(self, coro, timeout: float | None = 30):
        """Run a coroutine on the servers' loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            self.call(self.stop_async(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()
            self._thread = None

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def standalone(store: str | None = None, config: str | Mapping[str, Any] | None = None, **kwargs) -> Cluster:
    """`with rmq_core.standalone(store=DIR) as cluster:` — embedded name server + broker, with the
    laptop-sized segments of LAPTOP_SIZES unless `config` (broker.conf keys) or keyword settings
    (`mapped_file_size_commit_log=...`) say otherwise; `standalone(store=DIR, slave=True)` adds a
    replicating slave of the broker."""
    return Cluster(store, config, **kwargs)
