"""Client settings (RocketMQ's ClientConfig + the producer/consumer knobs), in seconds.

Every timer RocketMQ hard-codes is a field here so tests can run with short intervals.  Values are
validated when the object is built: a bad value fails with a ConfigError naming the field and the
value, never later from inside a background thread.
"""
from __future__ import annotations

import itertools
import os
import socket
from typing import Callable, Iterable

import attrs

from rmq_core.config import did_you_mean
from rmq_core.errors import ConfigError

_instance_counter = itertools.count(1)


def default_instance_name() -> str:
    """Unique per process AND per client object.

    Java's default ("DEFAULT", replaced by the pid) makes two consumers of one group in the same
    process share a client id; the broker can then not tell them apart.  A per-object suffix keeps
    every Producer / PushConsumer / PullConsumer its own identity unless the user asks to share.
    """
    return f"{os.getpid()}#{next(_instance_counter)}"


def local_ip() -> str:
    """The address other hosts would see (no packet is sent: UDP connect only picks a route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _positive(inst, attribute, value):
    if value is None or value <= 0:
        raise ConfigError(f"{type(inst).__name__}: {attribute.name} must be > 0, got {value!r}")


def _non_negative(inst, attribute, value):
    if value is None or value < 0:
        raise ConfigError(f"{type(inst).__name__}: {attribute.name} must be >= 0, got {value!r}")


def _namesrv_list(value) -> list[str]:
    if value is None:
        value = os.environ.get("NAMESRV_ADDR", "")
    if isinstance(value, str):
        items = [a.strip() for a in value.split(";") if a.strip()]
    else:
        items = [str(a).strip() for a in value if str(a).strip()]
    return items


def _check_namesrv(inst, attribute, value):
    if not value:
        raise ConfigError(
            f"{type(inst).__name__}: no name server address: pass namesrv='host:9876' "
            "(or an inproc:// address) or set NAMESRV_ADDR"
        )
    for addr in value:
        if addr.startswith("inproc://"):
            continue
        host, sep, port = addr.removeprefix("tcp://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{type(inst).__name__}: bad name server address {addr!r} (expected host:port)")


@attrs.define(kw_only=True)
class ClientConfig:
    """Settings one MQClientInstance needs (shared by every producer/consumer using it)."""

    namesrv: list = attrs.field(converter=_namesrv_list, validator=_check_namesrv)
    instance_name: str = attrs.field(factory=default_instance_name)
    client_ip: str = attrs.field(factory=local_ip)
    unit_name: str | None = None
    # timers (RocketMQ: pollNameServerInterval 30 s, heartbeatBrokerInterval 30 s,
    # persistConsumerOffsetInterval 5 s)
    poll_name_server_interval: float = attrs.field(default=30.0, validator=_positive)
    heartbeat_broker_interval: float = attrs.field(default=30.0, validator=_positive)
    persist_consumer_offset_interval: float = attrs.field(default=5.0, validator=_positive)
    # RPC timeouts
    mq_client_api_timeout: float = attrs.field(default=3.0, validator=_positive)
    connect_timeout: float = attrs.field(default=3.0, validator=_positive)
    # every send is written from the caller's thread on a broker's pipelined connection, many
    # requests in flight on each (the send pipeline); this many per broker
    pipelined_send_connections: int = attrs.field(default=1, validator=_positive)
    # this client's own request steps (rmq_core.remoting.RequestStep: an ACL signer...), run on
    # every request it sends after the rmq_client_* hooks
    request_steps: tuple = attrs.field(default=(), converter=lambda v: tuple(v or ()))
    # ACL (RocketMQ's SessionCredentials + AclClientRPCHook): with both keys, an AclSigner joins
    # request_steps (last: the signature covers what the other steps added)
    access_key: str | None = None
    secret_key: str | None = attrs.field(default=None, repr=False)
    security_token: str | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self):
        from rmq_core.acl import signer_from

        signer = signer_from(self.access_key, self.secret_key, self.security_token, owner="ClientConfig")
        if signer is not None:
            self.request_steps = (*self.request_steps, signer)

    @property
    def client_id(self) -> str:
        cid = f"{self.client_ip}@{self.instance_name}"
        if self.unit_name:
            cid += f"@{self.unit_name}"
        return cid


def make_client_config(owner: str, namesrv, options: dict, own: Callable | None = None,
                       also: Iterable[str] = ()) -> ClientConfig:
    """ClientConfig from a Producer / consumer's extra keyword arguments; an unknown keyword is a
    ConfigError naming it, the nearest accepted name (among the parameters of `own`, the owner's
    __init__, and the names in `also`, too) and the accepted ones (not a TypeError from deep inside)."""
    known = {f.name for f in attrs.fields(ClientConfig)} - {"namesrv"}
    unknown = sorted(set(options) - known)
    if unknown:
        import inspect  # only on this error path

        params = set(inspect.signature(own).parameters) if own is not None else set()
        hint = did_you_mean(unknown[0], known | set(also) | params - {"self", "client_options"})
        raise ConfigError(f"{owner}: unknown setting {unknown[0]!r}{hint}; accepted here besides the "
                          f"{owner} settings: {', '.join(sorted(known))}")
    from rmq_core.acl import signer_from

    signer_from(options.get("access_key"), options.get("secret_key"), owner=owner)  # (naming the owner)
    return ClientConfig(namesrv=namesrv, **options)


__all__ = ["ClientConfig", "default_instance_name", "local_ip", "make_client_config"]
