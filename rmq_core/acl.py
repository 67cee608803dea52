"""ACL request signing, as RocketMQ 4.x's AclClientRPCHook / AclUtils / AclSigner.

A signed request carries `AccessKey`, optionally `SecurityToken`, and `Signature` =
Base64(HmacSHA1(secretKey, content)), where content is the values of every ext field except
`Signature` (and the query flag `_UNIQUE_KEY_QUERY`, which RocketMQ's validator leaves out), in
the order of their keys, as UTF-8, followed by the body.  Fields a client adds of its own (the C++
client's `OnsChannel`) are signed like any other.  The client side (`AclSigner`, a request step
built from `access_key` / `secret_key`) and the broker's validator (plugins/acl) both call
`SigningKey.sign`: one definition of what is signed.

HMAC-SHA1 (RFC 2104) runs on OpenSSL's SHA-1 natively (_native/hmac_sha1): a secret's inner and
outer pads are hashed once (SigningKey), so a request costs two struct copies of those SHA-1 states
and the updates - no HMAC object set up per request, no Python call from a native writer.
"""
from __future__ import annotations

import os
from typing import Mapping

from rmq_core._native.hmac_sha1 import HmacSha1
from rmq_core.errors import ConfigError
from rmq_core.remoting.steps import RequestStep

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG: not part of the content

_UNSIGNED = frozenset((SIGNATURE, UNIQUE_MSG_QUERY_FLAG))
# the signed order of a request's ext field names (by their order in the request): a client sends
# the same fields in the same order request after request, so the sort happens once per shape
_ORDERS: dict[tuple, tuple] = {}
_MAX_ORDERS = 1024


def signed_order(keys: tuple) -> tuple:
    """The names among `keys` whose values are signed, in the signed order (the one rule: by name,
    Signature and the unique-key query flag left out).  A native request writer (frame.pyx's
    SendHeader) takes its fixed order from here once per header shape."""
    order = _ORDERS.get(keys)
    if order is None:
        order = tuple(k for k in sorted(keys) if k not in _UNSIGNED)
        if len(_ORDERS) < _MAX_ORDERS:
            _ORDERS[keys] = order
    return order


class SigningKey:
    """One secret key's HMAC-SHA1 signer (AclSigner.calSignature), pads hashed once."""

    __slots__ = ("native", "verify")

    def __init__(self, secret_key: str | bytes):
        key = secret_key.encode("utf-8") if isinstance(secret_key, str) else bytes(secret_key)
        self.native = HmacSha1(key)  # (frame.pyx's SendHeader calls it without a Python call)
        # verify(signature, content, body) -> bool: signature() compared natively in constant
        # time (the broker's check of a lane's send: one native call, no Python frame)
        self.verify = self.native.verify

    def sign(self, ext_fields: Mapping[str, str] | None, body: bytes | None) -> str:
        """The Signature of a request with these ext fields and body: Base64(HmacSHA1(secret,
        the values of the ext fields but Signature, ordered by name, as UTF-8, then the body))."""
        if not ext_fields:
            return self.native.signature(b"", body).decode("ascii")
        keys = tuple(ext_fields)
        order = _ORDERS.get(keys) or signed_order(keys)
        return self.native.signature("".join([ext_fields[k] for k in order]).encode("utf-8"), body).decode("ascii")

    def signature(self, content: bytes, body) -> bytes:
        """The Signature (ASCII bytes) of `content` - the signed field values already joined in
        the signed order, UTF-8 - followed by `body` (any bytes-like, or None): the keyed hash a
        native writer or reader calls with the bytes it assembled."""
        return self.native.signature(content, body)


class AclSigner(RequestStep):
    """The client-side request step that signs every request with one account (AclClientRPCHook).

    Given to a client as `access_key=` / `secret_key=` (Producer, PushConsumer, PullConsumer, the
    rmq_core.aio clients, AdminClient); runs once per request on every route.
    """

    __slots__ = ("access_key", "_key", "security_token")

    def __init__(self, access_key: str, secret_key: str, security_token: str | None = None):
        if not access_key or not secret_key:
            raise ConfigError("ACL credentials need both access_key and secret_key "
                              f"(got access_key={access_key!r}, secret_key={'***' if secret_key else secret_key!r})")
        self.access_key = str(access_key)
        self._key = SigningKey(str(secret_key))
        self.security_token = security_token or None

    def before(self, remote_addr, request, connection=None) -> None:
        sign_with = getattr(request, "sign_with", None)
        if sign_with is not None:  # a send not yet written: its SendHeader signs it as it writes it
            sign_with(self)
            return
        ext = request.ext_fields
        ext[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            ext[SECURITY_TOKEN] = self.security_token
        ext.pop(SIGNATURE, None)
        ext[SIGNATURE] = self._key.sign(ext, request.body)

    def prepare_header(self, header) -> None:
        """Prepare a native send header (frame.pyx SendHeader) to write the frames its requests
        ask signed (SendRequest.sign_with) for this account: once per header."""
        header.sign_with(self.access_key, self.security_token, self._key, signed_order)

    def __repr__(self) -> str:
        return f"AclSigner(access_key={self.access_key!r})"


def signer_from(access_key: str | None, secret_key: str | None, security_token: str | None = None,
                *, owner: str = "client", names: tuple[str, str] = ("access_key", "secret_key")) -> AclSigner | None:
    """The signer for a client's `access_key` / `secret_key` (None when neither is given); one
    given without the other is a ConfigError naming the missing one (by `names`, as the owner's
    settings spell them)."""
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        missing = names[0] if not access_key else names[1]
        raise ConfigError(f"{owner}: {missing} is missing: ACL credentials need both {names[0]} and {names[1]}")
    return AclSigner(access_key, secret_key, security_token)


def tools_credentials(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """The admin tool's account when no flag names one: RMQ_ACCESS_KEY / RMQ_SECRET_KEY, else
    mqadmin's own $ROCKETMQ_HOME/conf/tools.yml (`accessKey:` / `secretKey:`)."""
    env = os.environ if env is None else env
    ak, sk = env.get("RMQ_ACCESS_KEY"), env.get("RMQ_SECRET_KEY")
    if ak or sk:
        return ak, sk
    home = env.get("ROCKETMQ_HOME")
    if not home:
        return None, None
    path = os.path.join(home, "conf", "tools.yml")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    import yaml  # only when a tools.yml is there

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected accessKey: and secretKey: entries")
    ak, sk = data.get("accessKey"), data.get("secretKey")
    return (str(ak) if ak is not None else None), (str(sk) if sk is not None else None)


__all__ = ["ACCESS_KEY", "SECRET_KEY", "SIGNATURE", "SECURITY_TOKEN", "AclSigner", "SigningKey", "signed_order", "signer_from",
           "tools_credentials"]
