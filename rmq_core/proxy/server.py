"""The broker's gRPC server: grpc.aio on the broker's own event loop (the RPCs call the broker's
coroutines directly, no thread hand-off)."""
from __future__ import annotations

import logging

import grpc

from rmq_core.errors import ConfigError
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2_grpc
from rmq_core.proxy.service import MessagingService

log = logging.getLogger("rmq.proxy")

# RocketMQ 5's clients send bodies up to the max body size the settings answer gives (4 MiB by
# default) plus the message's other fields
_MAX_MESSAGE_BYTES = 130 * 1024 * 1024


class GrpcServer:
    def __init__(self, ctrl, host: str, port: int):
        self.ctrl, self.host, self.port = ctrl, host, port
        self.service: MessagingService | None = None
        self._server = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        max_bytes = max(_MAX_MESSAGE_BYTES, self.ctrl.store_config.max_message_size + 1024 * 1024)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_bytes),
                                          ("grpc.max_send_message_length", max_bytes),
                                          ("grpc.so_reuseport", 0)])
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            port = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as e:
            raise ConfigError(f"cannot serve gRPC on {self.host}:{self.port} (grpcServerPort): {e}") from None
        if not port:
            raise ConfigError(f"cannot serve gRPC on {self.host}:{self.port} (grpcServerPort): address in use?")
        self.port = port
        self.service = MessagingService(self.ctrl, port)
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, server)
        await server.start()
        self._server = server
        log.info("The broker[%s] serves RocketMQ 5's gRPC protocol on %s", self.ctrl.broker_config.broker_name,
                 self.address)

    async def stop(self, grace: float = 1.0) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
