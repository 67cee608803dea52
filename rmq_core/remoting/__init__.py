"""RocketMQ 4.x remoting: the command codec, codes, server, client and the transport interface."""
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import LanguageCode, RemotingCommand, SerializeType
from rmq_core.remoting.context import ChannelContext
from rmq_core.remoting.client import RemotingClient
from rmq_core.remoting.server import RemotingServer
from rmq_core.remoting.steps import RequestRefused, RequestStep

__all__ = ["RequestCode", "ResponseCode", "LanguageCode", "RemotingCommand", "SerializeType", "ChannelContext",
           "RemotingClient", "RemotingServer", "RequestRefused", "RequestStep"]
