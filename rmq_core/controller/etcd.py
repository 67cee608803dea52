"""A small synchronous etcd v3 client for the controller, over etcd's JSON gateway (etcd3gw).

The controller calls it from threads.  Every call is bounded by `timeout` seconds in all: a
member without quorum makes linearizable requests and lease calls wait for etcd's own request
timeout (5 s + 2 election timeouts), so only the client's deadline keeps a call short.  A call
fails over across the endpoints (a refused connection costs nothing, a hung member its share of
the deadline) and starts at the last endpoint that answered; when none can serve it raises
EtcdUnavailable naming the endpoints and what each said.

Keys are str (UTF-8), values bytes; the gateway's base64 and its int64-as-string fields stay in
here.  Revisions are etcd's store revisions (a key's mod_revision is 0 when it does not exist)."""
from __future__ import annotations

import base64
import json
import re
import threading
import time

from rmq_core.errors import ConfigError, RMQError

__all__ = ["EtcdClient", "EtcdError", "EtcdUnavailable", "EtcdLeaseNotFound", "parse_endpoints"]


class EtcdError(RMQError):
    """etcd refused a request (bad argument, ...): the message names the endpoint and etcd's reason."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered in time, or none has quorum.  For a transaction that writes, raised
    as soon as one endpoint took the request and failed: it may have been applied (the message
    says so), and a retry elsewhere would answer "compare failed" for a write that won."""


class EtcdLeaseNotFound(EtcdError):
    """A put named a lease that has expired or was revoked."""


# gRPC codes the gateway reports (etcd's error body has "code", a stream's "error.grpc_code").
_GRPC_NOT_FOUND = 5
_GRPC_UNAVAILABLE_CODES = {4, 14}  # DEADLINE_EXCEEDED, UNAVAILABLE: no leader, request timed out
_COMPARE_OPS = {"=": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}
_COMPARE_TARGETS = {"mod": ("MOD", "mod_revision"), "version": ("VERSION", "version"),
                    "create": ("CREATE", "create_revision"), "value": ("VALUE", "value")}
_ENDPOINT = re.compile(r"^(?:http://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})/?$")


def parse_endpoints(endpoints: str | list[str]) -> list[tuple[str, int]]:
    """"127.0.0.1:2379,127.0.0.1:2479" (comma or ';' between, an http:// prefix allowed) or a
    list of such -> [(host, port)]; anything else is a ConfigError naming the value."""
    items = re.split(r"[,;]", endpoints) if isinstance(endpoints, str) else list(endpoints)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"etcd endpoint {item!r} is not a string host:port")
        item = item.strip()
        m = _ENDPOINT.match(item)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise ConfigError(f"etcd endpoint {item!r} in {endpoints!r} is not host:port (e.g. 127.0.0.1:2379)")
        out.append((m.group(1).strip("[]"), int(m.group(2))))
    if not out:
        raise ConfigError(f"etcd endpoints {endpoints!r}: none given")
    return out


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else bytes(data)).decode("ascii")


def _unb64(data: str) -> bytes:
    return base64.b64decode(data)


def _kv(kvs: list | None) -> tuple[bytes | None, int]:
    if not kvs:
        return None, 0
    # the gateway leaves out fields at their zero value: an empty value has no "value"
    return _unb64(kvs[0].get("value", "")), int(kvs[0].get("mod_revision", 0))


class EtcdClient:
    """One client for a list of etcd endpoints; safe to share between threads (each thread gets
    its own HTTP sessions)."""

    def __init__(self, endpoints: str | list[str], timeout: float = 1.0):
        self.addresses = parse_endpoints(endpoints)
        self.endpoints = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.addresses]
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"etcd timeout {timeout!r}: must be a number of seconds > 0")
        self.timeout = float(timeout)
        # etcd3gw (and requests under it) load only when a controller starts
        import etcd3gw
        import requests
        import urllib3
        self._gw, self._requests, self._urllib3 = etcd3gw, requests, urllib3
        self._good = 0  # the endpoint that answered last: the next call starts there
        self._local = threading.local()
        self._sessions: list = []
        self._lock = threading.Lock()
        self._closed = False

    # --- transport --------------------------------------------------------------------------
    def _clients(self) -> list:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            with self._lock:
                if self._closed:
                    raise EtcdError(f"etcd client of {self.endpoints} is closed")
                clients = [self._gw.client(host=h, port=p, api_path="/v3/") for h, p in self.addresses]
                self._sessions.extend(c.session for c in clients)
            self._local.clients = clients
        return clients

    def _failure(self, e) -> tuple[str, bool, str]:
        """(kind, sent, reason) of an etcd3gw exception, kind "unavailable", "lease" (not found)
        or "error"; `sent` is false only when the request provably never reached the member."""
        cause = e.__context__  # etcd3gw raises its own types from requests' exceptions
        if isinstance(cause, self._requests.RequestException):
            reason_exc = getattr(cause.args[0], "reason", None) if cause.args else None
            not_sent = (isinstance(cause, self._requests.ConnectTimeout)
                        or isinstance(reason_exc, self._urllib3.exceptions.ConnectTimeoutError))
            if isinstance(reason_exc, self._urllib3.exceptions.NewConnectionError):
                return "unavailable", False, "connection refused"
            if isinstance(cause, self._requests.Timeout):
                return "unavailable", not not_sent, "timed out"
            return "unavailable", not not_sent, " ".join(str(cause).split())[:200]
        code, message = None, (e.detail_text or type(e).__name__)
        try:
            body = json.loads(e.detail_text or "")
            err = body.get("error")
            if isinstance(err, dict):  # a streaming call's error (lease keep-alive)
                code, message = err.get("grpc_code"), err.get("message", message)
            else:
                code, message = body.get("code"), body.get("message") or err or message
        except (ValueError, AttributeError):
            pass
        if code == _GRPC_NOT_FOUND and "lease not found" in str(message):
            return "lease", True, str(message)
        unavailable = (code in _GRPC_UNAVAILABLE_CODES or "deadline exceeded" in str(message)
                       or isinstance(e, (self._gw.exceptions.ConnectionFailedError,
                                         self._gw.exceptions.ConnectionTimeoutError)))
        return "unavailable" if unavailable else "error", True, str(message)

    def _call(self, path: str, body: dict, what: str, retry_after_send: bool = True,
              deadline: float | None = None, at: int | None = None) -> dict:
        """POST `body` to the gateway's /v3/`path` on the first endpoint that serves it (only
        endpoint `at` when given), by `deadline` (monotonic; default `timeout` from now).  The
        endpoint that answered is left in this thread's `_local.last`."""
        if self._closed:
            raise EtcdError(f"etcd client of {self.endpoints} is closed")
        clients = self._clients()
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        start, n = (self._good, len(clients)) if at is None else (at, 1)
        tried = []
        for k in range(n):
            i = (start + k) % len(clients)
            left = deadline - time.monotonic()
            if left <= 0:
                tried.append(f"{self.endpoints[i]}: not tried (deadline)")
                continue
            c = clients[i]
            # This thread's own client, so its timeout can be set per attempt: the first endpoint
            # (the last that answered) may use half the deadline, the others share the rest, so
            # a hung member does not leave a healthy one untried.
            c.timeout = left / 2 if k == 0 and n > 1 else left / (n - k)
            try:
                result = c.post(c.get_url(path), json=body)
            except self._gw.exceptions.Etcd3Exception as e:
                kind, sent, reason = self._failure(e)
            except (ValueError, self._requests.RequestException) as e:  # an answer cut short, not JSON
                kind, sent, reason = "unavailable", True, f"bad answer ({' '.join(str(e).split())[:200]})"
            else:
                self._good = self._local.last = i
                return result
            if kind == "lease":
                raise EtcdLeaseNotFound(f"etcd {self.endpoints[i]}: {what}: {reason}")
            if kind == "error":
                raise EtcdError(f"etcd {self.endpoints[i]}: {what}: {reason}")
            tried.append(f"{self.endpoints[i]}: {reason}")
            self._good = (i + 1) % len(clients)  # the next call starts past a member that failed
            if sent and not retry_after_send:
                raise EtcdUnavailable(f"etcd {what}: {'; '.join(tried)} (the request reached "
                                      f"{self.endpoints[i]}: it may have been applied)")
        of = ",".join(self.endpoints) if at is None else self.endpoints[at]
        raise EtcdUnavailable(f"etcd {what}: no endpoint of {of} served it within {self.timeout:g}s: "
                              f"{'; '.join(tried)}")

    # --- key-value --------------------------------------------------------------------------
    def get(self, key: str) -> tuple[bytes | None, int]:
        """(value, mod_revision), or (None, 0) when the key does not exist."""
        return _kv(self._call("kv/range", {"key": _b64(key)}, f"get {key!r}").get("kvs"))

    def get_prefix(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        """Every key starting with `prefix` -> (value, mod_revision)."""
        if not prefix:
            raise ValueError("etcd get_prefix: an empty prefix would read the whole store")
        raw = prefix.encode()
        end = raw[:-1] + bytes([raw[-1] + 1])  # UTF-8 has no 0xff byte: the last one can grow
        result = self._call("kv/range", {"key": _b64(raw), "range_end": _b64(end)}, f"get prefix {prefix!r}")
        return {_unb64(kv["key"]).decode(): (_unb64(kv.get("value", "")), int(kv.get("mod_revision", 0)))
                for kv in result.get("kvs", ())}

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Store `value` under `key` (attached to `lease` when non-zero); the new revision."""
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = int(lease)
        return int(self._call("kv/put", body, f"put {key!r}")["header"]["revision"])

    def delete(self, key: str) -> None:
        self._call("kv/deleterange", {"key": _b64(key)}, f"delete {key!r}")

    def txn(self, compare: list, success: list, failure: list = ()) -> tuple[bool, list]:
        """One transaction: when every `compare` holds, `success` runs, else `failure`.

        compare: ("mod", key, op, rev) | ("version", key, op, n) | ("create", key, op, rev) |
        ("value", key, op, b"..."), op one of "=", "!=", "<", ">" (("version", key, "=", 0): the
        key does not exist).  ops: ("put", key, value[, lease]) | ("delete", key) | ("get", key).
        Answers (succeeded, responses) with one response per op of the branch that ran: for a
        get (value|None, mod_revision), for a put the transaction's revision, for a delete the
        number of keys deleted.  A transaction that writes is not retried on another endpoint
        once one took it (EtcdUnavailable says it may have been applied)."""
        body = {"compare": [self._compare(c) for c in compare],
                "success": [self._op(o) for o in success], "failure": [self._op(o) for o in failure]}
        writes = any(o[0] != "get" for o in (*success, *failure))
        result = self._call("kv/txn", body, "txn on " + ", ".join(repr(c[1]) for c in compare),
                            retry_after_send=not writes)
        succeeded = bool(result.get("succeeded", False))
        revision = int(result["header"].get("revision", 0))
        out = []
        for r in result.get("responses", ()):
            if "response_range" in r:
                out.append(_kv(r["response_range"].get("kvs")))
            elif "response_put" in r:
                out.append(revision)
            elif "response_delete_range" in r:
                out.append(int(r["response_delete_range"].get("deleted", 0)))
            else:
                out.append(None)
        return succeeded, out

    @staticmethod
    def _compare(c) -> dict:
        try:
            target, key, op, arg = c
            name, field = _COMPARE_TARGETS[target]
            result = _COMPARE_OPS[op]
        except (KeyError, ValueError, TypeError):
            raise ValueError(f"etcd txn compare {c!r}: expected (target, key, op, value) with target in "
                             f"{sorted(_COMPARE_TARGETS)} and op in {sorted(_COMPARE_OPS)}") from None
        return {"key": _b64(key), "target": name, "result": result,
                field: _b64(arg) if target == "value" else int(arg)}

    @staticmethod
    def _op(o) -> dict:
        kind = o[0] if isinstance(o, (tuple, list)) and o else None
        if kind == "put" and len(o) in (3, 4):
            put = {"key": _b64(o[1]), "value": _b64(o[2])}
            if len(o) == 4 and o[3]:
                put["lease"] = int(o[3])
            return {"request_put": put}
        if kind == "delete" and len(o) == 2:
            return {"request_delete_range": {"key": _b64(o[1])}}
        if kind == "get" and len(o) == 2:
            return {"request_range": {"key": _b64(o[1])}}
        raise ValueError(f"etcd txn op {o!r}: expected ('put', key, value[, lease]), ('delete', key) or ('get', key)")

    # --- leases -----------------------------------------------------------------------------
    def grant(self, ttl_seconds: int) -> tuple[int, int]:
        """A new lease: (lease id, granted TTL); etcd raises a TTL under its floor to the floor."""
        if not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
            raise ValueError(f"etcd lease TTL {ttl_seconds!r}: must be a whole number of seconds > 0")
        result = self._call("lease/grant", {"TTL": ttl_seconds, "ID": 0}, f"grant lease of {ttl_seconds}s")
        if result.get("error"):
            raise EtcdError(f"etcd grant lease of {ttl_seconds}s: {result['error']}")
        return int(result["ID"]), int(result["TTL"])

    def keepalive(self, lease_id: int) -> int:
        """Renew the lease once: its TTL from now in seconds, 0 when it has expired or was revoked.

        etcd 3.4's leader renews a lease on its own word, without a quorum: a leader cut off from
        the others goes on renewing until it notices (up to two election timeouts), while they may
        already have elected a new leader, whose clock for the lease started at its election.  So
        a renewal counts only between two linearizable reads on the same member in the same raft
        term: the leader of that term still led, with a quorum, after the renewal, so no newer
        leader was elected before it.  An election in between renews again, within `timeout`."""
        lease_id = int(lease_id)
        what = f"keep-alive of lease {lease_id:x}"
        deadline = time.monotonic() + self.timeout
        probe = {"key": _b64("/"), "count_only": True}
        while True:
            before = self._call("kv/range", probe, what + " (quorum read)", deadline=deadline)
            at = self._local.last
            try:
                result = self._call("lease/keepalive", {"ID": lease_id}, what, deadline=deadline, at=at)
                ttl = max(0, int(result.get("result", {}).get("TTL", 0)))
                if ttl == 0:
                    return 0
                after = self._call("kv/range", probe, what + " (quorum read)", deadline=deadline, at=at)
            except EtcdLeaseNotFound:
                return 0
            except EtcdUnavailable:
                if time.monotonic() >= deadline:
                    raise
                continue  # the member failed in between: again, from another one
            if before["header"].get("raft_term") == after["header"].get("raft_term"):
                return ttl

    def revoke(self, lease_id: int) -> None:
        """End the lease now (its keys are deleted); a lease already gone is not an error."""
        try:
            self._call("lease/revoke", {"ID": int(lease_id)}, f"revoke lease {int(lease_id):x}")
        except EtcdLeaseNotFound:
            pass

    # --- cluster ----------------------------------------------------------------------------
    def members(self) -> list[dict]:
        """The cluster's members: [{"id", "name", "peerURLs", "clientURLs"}] (id as int)."""
        result = self._call("cluster/member/list", {}, "member list")
        return [{"id": int(m["ID"]), "name": m.get("name", ""), "peerURLs": m.get("peerURLs", []),
                 "clientURLs": m.get("clientURLs", [])} for m in result.get("members", ())]

    def health(self) -> dict[str, bool]:
        """Each endpoint -> whether it answers /health with a leader (each asked within `timeout`)."""
        out = {}
        for c, ep in zip(self._clients(), self.endpoints):
            try:
                r = c.session.get(c.base_url + "/health", timeout=self.timeout)
                out[ep] = r.status_code == 200 and r.json().get("health") == "true"
            except (self._requests.RequestException, ValueError):
                out[ep] = False
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"EtcdClient({','.join(self.endpoints)!r}, timeout={self.timeout:g})"
