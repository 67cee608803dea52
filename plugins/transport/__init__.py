"""Built-in transports: `tcp` (RocketMQ remoting frames over TCP) and `inproc` (same process).

A transport is an object with

    scheme: str
    async connect(address, *, max_frame_length: int, timeout: float) -> Channel
    async serve(address, on_channel, *, max_frame_length: int, backlog: int) -> Listener

where `address` is the part after "scheme://" ("127.0.0.1:9876", or a name for inproc), and
`Channel` / `Listener` are the base classes in `rmq_core.remoting.transport` (read that module's
docstring for their contract: `start(on_command, on_close)`, `async send(cmd)`, `close()`).  A
byte-stream transport uses `rmq_core.remoting.stream` (StreamChannel / StreamListener) and only
connects and serves, as `tcp` does.
A third-party transport registers the same way: a plugin module with

    @hookimpl
    def rmq_transports():
        return {"myscheme": MyTransport()}

and `RemotingServer("myscheme://...")` / `RemotingClient.invoke("myscheme://...", ...)` use it.
An unknown scheme raises PluginNotFoundError listing the available ones.
"""
from rmq_core.plugins import hookimpl

from .inproc import InprocTransport
from .tcp import TcpTransport

_TRANSPORTS = {"tcp": TcpTransport(), "inproc": InprocTransport()}


@hookimpl
def rmq_transports():
    return dict(_TRANSPORTS)
