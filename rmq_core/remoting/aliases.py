"""In-process aliases: a broker embedded in this process registers "host:port" -> "inproc://name",
so a client that reached the name server in-proc also reaches the broker in-proc, although routes
carry the broker's TCP address (which other processes need)."""
from __future__ import annotations

import threading

_lock = threading.Lock()
_aliases: dict[str, str] = {}


def register_inproc_alias(tcp_addr: str, inproc_addr: str) -> None:
    with _lock:
        _aliases[tcp_addr] = inproc_addr


def unregister_inproc_alias(tcp_addr: str | None) -> None:
    with _lock:
        _aliases.pop(tcp_addr or "", None)


def uses_local_aliases(namesrv_addrs) -> bool:
    """True for a client whose name servers are all reached in-proc: it reaches the brokers
    embedded in this process in-proc too (RemotingClient(local_aliases=True))."""
    return bool(namesrv_addrs) and all(a.startswith("inproc://") for a in namesrv_addrs)


def resolve_inproc_alias(addr: str) -> str:
    """The in-proc address for `addr` if an embedded server registered one, else `addr`."""
    return _aliases.get(addr, addr)
