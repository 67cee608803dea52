"""RocketMQ 4.x remoting: the command codec, codes, server, client and the transport interface."""
from rmq_core.remoting.codes import RequestCode, ResponseCode  # noqa: F401
from rmq_core.remoting.command import LanguageCode, RemotingCommand, SerializeType  # noqa: F401
from rmq_core.remoting.context import ChannelContext  # noqa: F401
from rmq_core.remoting.client import RemotingClient  # noqa: F401
from rmq_core.remoting.server import RemotingServer  # noqa: F401
