"""The console's login: users in a file with salted scrypt password hashes, and sessions held by
a random token in an HttpOnly, SameSite=Strict cookie.

The users file has one user a line, `name:scrypt$N$r$p$salt$hash` (salt and hash in base64);
`rmq dashboard adduser FILE NAME` writes it (0600).  Lines starting with # are comments.  The file
is read when the console starts."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import threading
import time

from rmq_core.common.files import atomic_write
from rmq_core.errors import ConfigError

COOKIE = "rmq_session"
SESSION_IDLE_SECONDS = 8 * 3600  # a session unused this long ends
# scrypt's cost (N=2**14, r=8, p=1: 16 MiB and tens of ms a check): what hashlib documents as a
# reasonable interactive-login setting
_N, _R, _P = 1 << 14, 8, 1
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def hash_password(password: str, *, salt: bytes | None = None, n: int = _N, r: int = _R, p: int = _P) -> str:
    salt = os.urandom(16) if salt is None else salt
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=64 * 1024 * 1024, dklen=32)
    return f"scrypt${n}${r}${p}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        again = hash_password(password, salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p))
    except ValueError:
        return False
    return hmac.compare_digest(again.rsplit("$", 1)[1], digest)


def read_users(path: str) -> dict[str, str]:
    """name -> stored hash; a malformed line is a ConfigError naming the file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read the users file {path}: {e.strerror}") from None
    users = {}
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, stored = line.partition(":")
        if not sep or not _NAME.match(name) or not stored.startswith("scrypt$") or stored.count("$") != 5:
            raise ConfigError(f"{path}:{i}: expected 'name:scrypt$...' (written by `rmq dashboard adduser`), "
                              f"got {line[:40]!r}")
        users[name] = stored
    return users


def add_user(path: str, name: str, password: str) -> bool:
    """Add `name` to the users file (or change its password); True when it was new."""
    if not _NAME.match(name or ""):
        raise ConfigError(f"bad user name {name!r}: 1-64 of letters, digits and _ . @ -")
    if not password:
        raise ConfigError("empty password")
    users = read_users(path) if os.path.exists(path) else {}
    new = name not in users
    users[name] = hash_password(password)
    atomic_write(path, "".join(f"{u}:{h}\n" for u, h in users.items()).encode("utf-8"), mode=0o600)
    return new


class Sessions:
    """Who may use the console: the users and their live sessions (token -> user, last use)."""

    def __init__(self, users: dict[str, str]):
        self.users = users
        self._sessions: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._dummy = hash_password("-")  # checked for an unknown name, so both take as long

    def login(self, name: str, password: str) -> str | None:
        """A new session's token, or None for a wrong name or password."""
        stored = self.users.get(name)
        ok = check_password(password, stored or self._dummy) and stored is not None
        if not ok:
            return None
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[token] = (name, time.monotonic())
        return token

    def user(self, token: str | None) -> str | None:
        """The user of a live session (its idle clock restarted), else None."""
        if not token:
            return None
        now = time.monotonic()
        with self._lock:
            s = self._sessions.get(token)
            if s is None:
                return None
            if now - s[1] > SESSION_IDLE_SECONDS:
                del self._sessions[token]
                return None
            self._sessions[token] = (s[0], now)
            return s[0]

    def logout(self, token: str | None) -> None:
        with self._lock:
            self._sessions.pop(token or "", None)
