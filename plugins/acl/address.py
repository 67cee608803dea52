"""Remote address patterns of plain_acl.yml (RocketMQ's RemoteAddressStrategyFactory).

    *  *.*.*.*              every address
    10.1.1.1  ::1           one address
    10.1.1.*  10.1.*.*      a trailing wildcard (the octets after a `*` are `*` too)
    10.1.1.1-100            a range in one octet (10.1.1-5.* also works)
    10.1.1.{1,2}            a set of last octets
    10.1.1.1,10.2.0.*       a list of any of the above
    (empty)                 no address

`parse_address_pattern(text)` raises ValueError naming the bad pattern; a pattern's
`match(ip)` takes the peer's address without its port.
"""
from __future__ import annotations

import ipaddress

__all__ = ["AddressPattern", "parse_address_pattern", "host_of"]


def host_of(remote_address: str | None) -> str:
    """'10.0.0.5:51234' -> '10.0.0.5', '[::1]:5' -> '::1'; an in-process peer counts as 127.0.0.1."""
    addr = remote_address or ""
    if not addr or "//" in addr:
        return "127.0.0.1"
    if addr.startswith("["):
        return addr[1:addr.find("]")]
    if addr.count(":") == 1:
        return addr.rpartition(":")[0]
    return addr


def _canonical(ip: str) -> str | None:
    """The address as the patterns compare it (IPv4-mapped IPv6 as IPv4, IPv6 expanded)."""
    try:
        a = ipaddress.ip_address(ip.strip())
    except ValueError:
        return None
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    return str(a) if a.version == 4 else a.exploded


class AddressPattern:
    """One compiled pattern; `match(ip)` is a set or tuple test, no parsing per call."""

    __slots__ = ("text", "_any", "_exact", "_octets")

    def __init__(self, text: str, any_address: bool, exact: frozenset, octet_ranges: tuple):
        self.text = text
        self._any = any_address
        self._exact = exact  # canonical addresses
        self._octets = octet_ranges  # ((lo, hi) x 4, ...) for IPv4 wildcard and range patterns

    def match(self, ip: str) -> bool:
        if self._any:
            return True
        c = _canonical(ip)
        if c is None:
            return False
        if c in self._exact:
            return True
        if self._octets and "." in c:
            parts = [int(p) for p in c.split(".")]
            for ranges in self._octets:
                if all(lo <= v <= hi for v, (lo, hi) in zip(parts, ranges)):
                    return True
        return False

    def __repr__(self) -> str:
        return f"AddressPattern({self.text!r})"


def _octet_ranges(text: str) -> tuple:
    parts = text.split(".")
    if len(parts) != 4:
        raise ValueError(f"bad address pattern {text!r}: expected four parts like 10.1.1.* or 10.1.1.1-100")
    ranges = []
    wild = False
    for part in parts:
        part = part.strip()
        if part == "*":
            wild = True
            ranges.append((0, 255))
            continue
        if wild:
            raise ValueError(f"bad address pattern {text!r}: only `*` may follow a `*` (like 10.1.*.*)")
        lo, sep, hi = part.partition("-")
        try:
            lo_n, hi_n = int(lo), int(hi if sep else lo)
        except ValueError:
            raise ValueError(f"bad address pattern {text!r}: {part!r} is not a number, a range like 1-100 or *") from None
        if not (0 <= lo_n <= hi_n <= 255):
            raise ValueError(f"bad address pattern {text!r}: {part!r} is not within 0-255 (low end first)")
        ranges.append((lo_n, hi_n))
    return tuple(ranges)


def parse_address_pattern(text) -> AddressPattern:
    """Compile one whiteRemoteAddress / globalWhiteRemoteAddresses entry."""
    if text is None:
        return AddressPattern("", False, frozenset(), ())
    text = str(text).strip()
    if not text:
        return AddressPattern("", False, frozenset(), ())
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return AddressPattern(text, True, frozenset(), ())
    exact: set[str] = set()
    octets: list[tuple] = []
    for item in _items(text):
        if item.endswith("}"):
            head, brace, tail = item.partition("{")
            if not brace or not tail[:-1].strip():
                raise ValueError(f"bad address pattern {text!r}: expected a set like 10.1.1.{{1,2}}")
            for last in tail[:-1].split(","):
                _add_one(text, head + last.strip(), exact)
        elif "*" in item or ("-" in item and ":" not in item):
            if ":" in item:
                raise ValueError(f"bad address pattern {text!r}: IPv6 wildcards and ranges are not supported; "
                                 "list the addresses")
            octets.append(_octet_ranges(item))
        else:
            _add_one(text, item, exact)
    return AddressPattern(text, False, frozenset(exact), tuple(octets))


def _items(text: str) -> list[str]:
    """Split a list on commas outside `{...}`."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur).strip())
    if any(not i for i in items):
        raise ValueError(f"bad address pattern {text!r}: an empty entry in the list")
    return items


def _add_one(text: str, item: str, exact: set) -> None:
    c = _canonical(item)
    if c is None:
        raise ValueError(f"bad address pattern {text!r}: {item!r} is not an IP address")
    exact.add(c)
