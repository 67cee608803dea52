"""Request steps: what every request passes on its side of a connection (RocketMQ's RPCHook, split
by side).

A client's step (sign, trace, measure) runs once per request the client sends, on every route
(ChannelContext.invoke / request_nowait / invoke_oneway, the pipelined send connections, the
blocking channels of the admin client); a broker's step (check, trace, measure) once per request
the broker receives, on every route too (ProcessorTable.dispatch and the native send lane), before
the processor.  Steps come from two places:

- the global hooks `rmq_client_before_request` / `rmq_client_after_response` and
  `rmq_broker_before_request` / `rmq_broker_after_response` (rmq_core.hookspecs);
- per-instance `RequestStep` objects: `request_steps=[...]` of a client (they run after the global
  hooks) and of a broker's processor table (they run before the global hooks).

A broker step refuses a request by raising `RequestRefused(remark, code)`: the processor never
runs and the answer carries that code and remark; the connection keeps serving.  A client step
that raises fails that request only.

Both sides are resolved once (`RequestSteps.resolve`, when a client or server starts) into plain
call lists: no pluggy machinery per request, and None when nothing is registered.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import FrameCommand, PrefixedFrameCommand, RemotingCommand, new_command, set_frame
from rmq_core._native.frame import run_send_steps

log = logging.getLogger("rmq.remoting")

CLIENT = "client"
BROKER = "broker"

_NAMES = {  # side -> (before's argument names, after's)
    CLIENT: (("remote_addr", "request"), ("remote_addr", "request", "response")),
    BROKER: (("remote_addr", "request", "connection"), ("remote_addr", "request", "response", "connection")),
}


class RequestRefused(Exception):
    """Raised by a broker-side step to refuse a request: answered with `code` and `remark`."""

    def __init__(self, remark: str, code: int = ResponseCode.SYSTEM_ERROR):
        super().__init__(remark)
        self.remark = remark
        self.code = int(code)


class RequestStep:
    """A per-instance step (either method may stay a no-op).  On the client side `connection` is
    None; on the broker side it has `remote_address` and `attributes` (a per-connection dict)."""

    def before(self, remote_addr: str, request, connection=None) -> None:
        return None

    def after(self, remote_addr: str, request, response, connection=None) -> None:
        return None


def _hook_calls(hook_name: str, names: tuple[str, ...]) -> list:
    """The implementations of a global hook as plain callables taking `names` positionally, the
    last registered first (as pluggy calls them); one pluggy call when some implementation needs
    pluggy (a wrapper, keyword-only arguments, an argument it does not know, to be named)."""
    from rmq_core.plugins import get_plugin_manager  # late: the plugin manager imports hookspecs only

    caller = getattr(get_plugin_manager().hook, hook_name)
    calls = []
    for impl in reversed(caller.get_hookimpls()):
        if (impl.hookwrapper or getattr(impl, "wrapper", False) or getattr(impl, "kwargnames", ())
                or not set(impl.argnames) <= set(names)):
            return [lambda *values: caller(**dict(zip(names, values)))]
        picks = tuple(names.index(a) for a in impl.argnames)
        fn = impl.function
        if picks == tuple(range(len(names))):
            calls.append(fn)
        else:
            calls.append(lambda *values, fn=fn, picks=picks: fn(*[values[k] for k in picks]))
    return calls


def _overrides(step, name: str) -> bool:
    method = getattr(type(step), name, None)
    return method is not None and method is not getattr(RequestStep, name)


def encode_send(addr: str, request) -> bytes:
    """The frame of a send whose steps changed a field its SendHeader writes (or added fields to a
    signed one): written by the Python codec, signed here when a signer asked for it."""
    command = RemotingCommand(request.code, language=request.language, version=request.version,
                              opaque=request.opaque, flag=request.flag, ext_fields=request.fields(),
                              body=request.body)
    if request.signer is not None:
        request.signer.before(addr, command)
    return command.encode()


class RequestSteps:
    """One side's steps resolved into two call lists (`before`, `after`), each callable taking the
    side's arguments positionally (client: remote_addr, request[, response]; broker: remote_addr,
    request[, response], connection).  `header_signer`: on a client whose only step is a signer
    (one with `prepare_header`: rmq_core.acl.AclSigner), that signer - a send's SendHeader then
    applies it as it writes the frame (signed natively, no Python step call), and the frame goes
    to the connection as `request=True` (its steps applied)."""

    __slots__ = ("side", "before", "after", "header_signer")
    encode_send = staticmethod(encode_send)  # (for the native send pipeline, which imports no Python module)

    def __init__(self, side: str, before: list, after: list, header_signer=None):
        self.side, self.before, self.after, self.header_signer = side, before, after, header_signer

    @classmethod
    def resolve(cls, side: str, steps: Iterable[Any] = ()) -> "RequestSteps | None":
        """The global hooks of `side` and its per-instance `steps`, or None when there are none."""
        before_names, after_names = _NAMES[side]
        hooks_before = _hook_calls(f"rmq_{side}_before_request", before_names)
        hooks_after = _hook_calls(f"rmq_{side}_after_response", after_names)
        steps = list(steps or ())
        if side == CLIENT:  # a client's own steps run last (a signature covers what hooks added)
            before = hooks_before + [(lambda a, r, s=s: s.before(a, r)) for s in steps if _overrides(s, "before")]
            after = hooks_after + [(lambda a, r, x, s=s: s.after(a, r, x)) for s in steps if _overrides(s, "after")]
        else:  # a broker's own steps (its access check) run first
            before = [s.before for s in steps if _overrides(s, "before")] + hooks_before
            after = [s.after for s in steps if _overrides(s, "after")] + hooks_after
        if not before and not after:
            return None
        signer = None
        if side == CLIENT and not hooks_before and not after and len(steps) == 1 and hasattr(steps[0], "prepare_header"):
            signer = steps[0]
        return cls(side, before, after, signer)

    def run_before(self, *values) -> None:
        for fn in self.before:
            fn(*values)

    def run_after(self, *values) -> None:
        for fn in self.after:
            fn(*values)

    def frame_step(self, remote_addr: str) -> "FrameStep":
        """These (client) steps as the interception step of a pipelined connection to `remote_addr`."""
        return FrameStep(remote_addr, self)


class FrameStep:
    """A client's steps as the step of a pipelined send connection (remoting.pipelined's
    HookedRequests).  A producer's send is handed over before it is written, as its SendHeader has
    it (frame.pyx's SendRequest: before_request): the steps read and add fields on the header's
    values, and the header writes the frame once (signed, when a signing step asked).  Any other
    request comes as its encoded frame (before): a command over it, decoded only when a step reads
    or sets a field, encoded again only when one changed it.  The answer comes as a command over
    its frame, with its request.  The connection stays the one a send without steps takes; only
    the steps' own cost is added."""

    __slots__ = ("addr", "steps", "_before", "_after", "has_after")

    def __init__(self, addr: str, steps: RequestSteps):
        self.addr, self.steps = addr, steps
        self._before, self._after = steps.before, steps.after
        self.has_after = bool(steps.after)  # (none: the connection keeps no request for after())

    def before(self, frame) -> tuple[bytes, FrameCommand]:
        """The request `frame` (length prefix included) as the steps left it - the frame itself,
        or encoded anew when a step changed it - and the request command for after()."""
        request = new_command(PrefixedFrameCommand)
        set_frame(request, frame)
        addr = self.addr
        for fn in self._before:
            fn(addr, request)
        if request._src is None and request.changed:  # (read, and maybe changed)
            return request.encode(), request
        return frame, request

    def before_request(self, request) -> tuple[bytes, Any]:
        """A send request before it is written (a SendRequest) through the steps: its frame as they
        left it, and the request for after()."""
        frame = run_send_steps(self._before, self.addr, request)
        return (encode_send(self.addr, request) if frame is None else frame), request

    def after(self, request, response) -> None:
        addr = self.addr
        for fn in self._after:
            fn(addr, request, response)


class LaneStep:
    """A broker's steps around one connection's native send lane: what the lane runs before each
    plain send's put is a send_lane LaneCheck (the processor's, built from these steps: a Python
    step in a PyLaneCheck, one that offers a native check - `native_check` - as that), handed the
    send as the lane parsed it (send_lane.pyx's LaneRequest: the values it read, a str made of one
    only when a step reads it - no second decode of the header); after() gets the answer frame
    the lane wrote."""

    __slots__ = ("ctx", "_after")

    def __init__(self, ctx, after: list):
        self.ctx, self._after = ctx, list(after)

    @staticmethod
    def native_check(fn):
        """The native lane check a step's before() offers (its owner's `lane_check(connection,
        fallback)`), or None."""
        return getattr(getattr(fn, "__self__", None), "lane_check", None)

    @staticmethod
    def decode(frame: bytes) -> FrameCommand:
        """The command of a lane's frame (a LaneRequest's, when a step asks for more than it parsed)."""
        request = new_command(FrameCommand)
        set_frame(request, frame)
        return request

    def after(self, request, response_frame: bytes) -> None:
        """(The answer is written already: a step that raises here is logged, not answered.)"""
        response = new_command(FrameCommand)
        set_frame(response, response_frame)
        ctx = self.ctx
        try:
            for fn in self._after:
                fn(ctx.remote_address, request, response, ctx)
        except Exception:  # noqa: BLE001 - the connection and the other sends go on
            log.exception("broker step after the answer to opaque %s from %s failed", response.opaque,
                          ctx.remote_address)


__all__ = ["RequestRefused", "RequestStep", "RequestSteps", "FrameStep", "LaneStep", "CLIENT", "BROKER"]
