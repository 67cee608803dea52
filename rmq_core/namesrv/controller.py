"""NamesrvController: the name server (remoting server + route tables + KV config + liveness scan)."""
from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from rmq_core.config import NamesrvConfig
from rmq_core.message import open_listen_addresses
from rmq_core.metrics import ExporterSettings, RpcLatency, check_exporter_type, start_exporter
from rmq_core.remoting.context import ChannelContext
from rmq_core.remoting.server import RemotingServer

from .kv_config import KVConfigManager
from .processor import DefaultRequestProcessor
from .route_info import RouteInfoManager

log = logging.getLogger("rmq.namesrv")

BOOT_SUCCESS_LINE = "The Name Server boot success. serializeType=JSON"


class NamesrvController:
    """`listen` is "host:port" (port 0 picks a free one), "tcp://..." or "inproc://name", or a list
    of these (embedded mode: TCP for others plus inproc for the same process); by default the
    config's listenHost:listenPort."""

    def __init__(self, config: NamesrvConfig | None = None, listen: str | Sequence[str] | None = None,
                 controller_config=None):
        self.config = config if config is not None else NamesrvConfig()
        self.listen = listen or f"{self.config.listen_host}:{self.config.listen_port}"
        self.route_info_manager = RouteInfoManager()
        self.kv_config_manager = KVConfigManager(self.config.kv_config_path)
        self.remoting_server = RemotingServer(self.listen, name="namesrv",
                                              max_frame_length=self.config.server_max_frame_length,
                                              backlog=self.config.server_socket_backlog)
        self.processor = DefaultRequestProcessor(self)
        for code in self.processor.codes:
            self.remoting_server.register_processor(code, self.processor)
        self.remoting_server.on_channel_close.append(self._on_channel_close)
        # enableControllerInNamesrv: RocketMQ 5's controller answers on the name server's port
        self.controller = None
        if self.config.enable_controller_in_namesrv:
            from rmq_core.config import ControllerConfig
            from rmq_core.controller.service import ControllerService
            cc = (controller_config if controller_config is not None else ControllerConfig()).check("namesrv config")
            self.controller = ControllerService(cc)
            for code in self.controller.codes:
                self.remoting_server.register_processor(code, self.controller)
        self._scan_task: asyncio.Task | None = None
        self.rpc_latency = RpcLatency()
        self.metrics_exporter = None
        check_exporter_type(self.config.metrics_exporter_type)  # an unknown name fails here

    @property
    def listen_address(self) -> str | None:
        """The (first) bound address ("127.0.0.1:40123" or "inproc://name") once started."""
        return self.remoting_server.listen_address

    @property
    def listen_addresses(self) -> list[str]:
        return list(self.remoting_server.listen_addresses)

    async def start(self) -> str:
        """Start serving; returns (and logs) RocketMQ's boot line."""
        self.kv_config_manager.load()
        await self.remoting_server.start()
        exposed = open_listen_addresses(self.listen_addresses)
        if exposed:
            log.warning("the name server listens on %s, reachable from other hosts: a name server checks no ACL, "
                        "so any host that reaches it can register brokers and change routes and KV configs; "
                        "listen on 127.0.0.1 (--listen) or keep the port behind a firewall", ", ".join(exposed))
        self._start_metrics()
        self._scan_task = asyncio.get_running_loop().create_task(self._scan_loop(), name="rmq-namesrv-scan")
        if self.controller is not None:
            self.controller.address = self.listen_address
            await self.controller.start()
        log.info(BOOT_SUCCESS_LINE)
        return BOOT_SUCCESS_LINE

    async def stop(self) -> None:
        if self.controller is not None:
            await self.controller.stop()
        task, self._scan_task = self._scan_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.metrics_exporter is not None:
            self.metrics_exporter.stop()
            self.metrics_exporter = None
        self.remoting_server.set_rpc_latency(None)
        await self.remoting_server.stop()
        log.info("the name server on %s shut down", self.listen_address)

    def _start_metrics(self) -> None:
        """metricsExporterType (DISABLE by default): the name server's rocketmq_rpc_latency."""
        cfg = self.config
        if (cfg.metrics_exporter_type or "DISABLE").upper() == "DISABLE":
            return
        self.remoting_server.set_rpc_latency(self.rpc_latency)
        addr = next((a for a in self.listen_addresses if "://" not in a), None)
        host = cfg.metrics_prom_exporter_host or (addr.rpartition(":")[0] if addr else cfg.listen_host)
        settings = ExporterSettings(self.collect_metrics, host=host, port=cfg.metrics_prom_exporter_port,
                                    interval_ms=cfg.metrics_logging_exporter_interval_in_mills, node="namesrv",
                                    backlog=cfg.server_socket_backlog)
        self.metrics_exporter = start_exporter(cfg.metrics_exporter_type, settings)

    def collect_metrics(self):
        addr = self.listen_address or ""
        return [self.rpc_latency.family({"node_type": "nameserver", "node_id": addr})]

    async def _scan_loop(self) -> None:
        while True:  # the interval is re-read each round: UPDATE_NAMESRV_CONFIG may change it
            await asyncio.sleep(max(self.config.scan_not_active_broker_interval, 1) / 1000.0)
            try:
                self.route_info_manager.scan_not_active_broker(self.config.broker_channel_expired_time)
            except Exception:
                log.exception("scanning for inactive brokers failed")

    def _on_channel_close(self, ctx: ChannelContext) -> None:
        self.route_info_manager.on_channel_destroy(ctx)

    async def __aenter__(self) -> "NamesrvController":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()


async def run_namesrv(config: NamesrvConfig | None = None, listen: str | Sequence[str] | None = None, *,
                      ready: asyncio.Future | None = None) -> None:
    """Run a name server until cancelled (the `rmq namesrv` command); prints the boot line."""
    controller = NamesrvController(config, listen)
    line = await controller.start()
    print(line, flush=True)
    if ready is not None and not ready.done():
        ready.set_result(controller)
    try:
        await asyncio.Event().wait()
    finally:
        await controller.stop()
