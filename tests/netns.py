"""A Linux network namespace joined to the root namespace by a veth pair, for partition tests.

The pair gets a private /30 (10.213.x.y) used only between the root namespace and this namespace:
`root_ip` on the root side, `ns_ip` inside.  `exec_prefix` runs a process inside
(`ip netns exec NAME ...`); `cut()` makes a silent partition — a `blackhole` qdisc on both ends
drops every packet either way, as a lost network does, while each side keeps its own address
(taking the link down would make connects fail at once with "network unreachable", not hang);
`heal()` removes it.  `close()` deletes the namespace and the veth pair, also after a failed test
(use it as a context manager or in a fixture's `finally`).  Names and subnet are unique per
instance, so parallel runs and leftovers of a killed run do not clash.  Needs root and `ip`/`tc`."""
from __future__ import annotations

import ipaddress
import os
import random
import re
import shutil
import subprocess
import uuid

SUBNET = ipaddress.ip_network("10.213.0.0/16")


def _tool(name: str) -> str:
    for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name!r} is not installed (iproute2): network namespace tests need it")
    return path


def _run(*args: str) -> str:
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r.stdout


class NetNs:
    def __init__(self):
        if os.geteuid() != 0:
            raise RuntimeError("network namespaces need root (ip netns add)")
        self.ip, self.tc = _tool("ip"), _tool("tc")
        tag = uuid.uuid4().hex[:8]
        self.name = f"rmq-{tag}"
        self.root_dev, self.ns_dev = f"rmqr{tag}", f"rmqn{tag}"  # (interface names: 15 chars at most)
        self._made_ns = self._made_link = False
        self.is_cut = False
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A /30 of SUBNET that no interface of the root namespace uses."""
        used = [ipaddress.ip_interface(a).network
                for a in re.findall(r"inet (\S+)", _run(self.ip, "-o", "-4", "addr", "show"))]
        nets = list(SUBNET.subnets(new_prefix=30))
        for _ in range(100):
            net = random.choice(nets)
            if not any(net.overlaps(u) for u in used):
                return net
        raise RuntimeError(f"no free /30 left in {SUBNET}")

    def _create(self):
        _run(self.ip, "netns", "add", self.name)
        self._made_ns = True
        _run(self.ip, "link", "add", self.root_dev, "type", "veth", "peer", "name", self.ns_dev, "netns", self.name)
        self._made_link = True
        net = self._free_subnet()
        self.root_ip, self.ns_ip = (str(h) for h in net.hosts())
        _run(self.ip, "addr", "add", f"{self.root_ip}/30", "dev", self.root_dev)
        _run(self.ip, "link", "set", self.root_dev, "up")
        _run(self.ip, "-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_dev)
        _run(self.ip, "-n", self.name, "link", "set", self.ns_dev, "up")
        _run(self.ip, "-n", self.name, "link", "set", "lo", "up")

    @property
    def exec_prefix(self) -> list[str]:
        return [self.ip, "netns", "exec", self.name]

    def cut(self) -> None:
        _run(self.tc, "qdisc", "replace", "dev", self.root_dev, "root", "blackhole")
        _run(self.tc, "-n", self.name, "qdisc", "replace", "dev", self.ns_dev, "root", "blackhole")
        self.is_cut = True

    def heal(self) -> None:
        _run(self.tc, "qdisc", "del", "dev", self.root_dev, "root")
        _run(self.tc, "-n", self.name, "qdisc", "del", "dev", self.ns_dev, "root")
        self.is_cut = False

    def close(self) -> None:
        """Delete the veth pair and the namespace (each only if this instance made it)."""
        if self._made_link:
            subprocess.run([self.ip, "link", "del", self.root_dev], capture_output=True)
            self._made_link = False
        if self._made_ns:
            subprocess.run([self.ip, "netns", "del", self.name], capture_output=True)
            self._made_ns = False

    def __enter__(self) -> "NetNs":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
