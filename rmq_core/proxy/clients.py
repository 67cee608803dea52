"""RocketMQ 5 clients in the broker's client tables.

A 5.x client has no remoting connection: it is one `GrpcClientChannel` per client id, registered
in the broker's ProducerManager (under each topic it publishes to: a 5.x producer has no group, a
half message's producer group is its topic, as RocketMQ 5's proxy does) and ConsumerManager (its
group, subscriptions), with the language and version from its request metadata, so
consumerConnection / producerConnection list it.  Its Heartbeat refreshes it; NotifyClientTermination
or no heartbeat for clientChannelMaxIdleTimeSeconds removes it (the tables' own expiry).

The broker's transaction check-back is decided once (broker/transaction.py picks a live producer
channel of the half's group and sends it CHECK_TRANSACTION_STATE); a GrpcClientChannel delivers that
request as a RecoverOrphanedTransactionCommand on the client's Telemetry stream."""
from __future__ import annotations

import asyncio
import logging
import time

from rmq_core.broker.client_manager import ClientChannelInfo
from rmq_core.remoting.codes import MQVersion, RequestCode

log = logging.getLogger("rmq.proxy")

# x-mq-language values -> RocketMQ's LanguageCode names (what consumerConnection shows)
_LANGUAGES = {"DOTNET": "DOTNET", "DOT_NET": "DOTNET", "GOLANG": "GO", "NODE_JS": "NODEJS", "NODEJS": "NODEJS"}


class GrpcClientChannel:
    """One 5.x client, as a channel of the broker's client tables (see the module)."""

    def __init__(self, client_id: str, remote_address: str, language: str, version: str):
        self.client_id = client_id
        self.channel_id = "grpc:" + client_id  # (the tables key channels by channel_id)
        self.remote_address = remote_address
        self.language = _LANGUAGES.get(language.upper(), language.upper()) if language else "OTHER"
        self.version = version
        self.attributes: dict = {}
        self.closed = False
        self.settings = None  # the client's Settings (its Telemetry's first command), answered
        self.groups: set[str] = set()  # consumer group / producer topics it is registered under
        self.last_seen = time.time()
        # commands for the client's Telemetry stream (None: no stream open now)
        self.outbox: asyncio.Queue | None = None

    def info(self) -> ClientChannelInfo:
        return ClientChannelInfo(self, self.client_id, self.language, MQVersion.ordinal(self.version))

    async def invoke_oneway(self, request) -> None:
        """The broker's one-way requests to a client.  CHECK_TRANSACTION_STATE goes to the
        Telemetry stream; the rest (consumer ids changed: a pop consumer has no rebalance) need
        nothing from a 5.x client."""
        if request.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        if self.outbox is None:
            raise ConnectionError(f"5.x client {self.client_id} has no Telemetry stream open")
        from rmq_core.proxy.convert import recover_command

        self.outbox.put_nowait(recover_command(request))

    async def invoke(self, request, timeout: float):
        raise ConnectionError(f"{request.code}: not served to 5.x client {self.client_id} (a gRPC client)")

    def __repr__(self) -> str:
        return f"GrpcClientChannel({self.client_id!r}, {self.remote_address}, {self.language} {self.version})"
