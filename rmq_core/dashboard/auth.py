"""The console's login: users in a file with salted scrypt password hashes, and sessions held by
a random token in an HttpOnly, SameSite=Strict cookie.

The users file has one user a line, `name:scrypt$N$r$p$salt$hash` (salt and hash in base64);
`rmq dashboard adduser FILE NAME` writes it (0600).  Lines starting with # are comments.  The file
is read when the console starts and again when it changes (a user added, removed or given a new
password takes effect at once; a removed user's sessions end; a file that does not read keeps the
last good users and logs why).  Failed logins are limited per client address: after
LOGIN_FAILURES_ALLOWED within LOGIN_FAILURE_WINDOW seconds, its logins are refused (429) until the
oldest of them is that old - no password is checked meanwhile."""
from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import threading
import time

from rmq_core.common.files import atomic_write
from rmq_core.errors import ConfigError

log = logging.getLogger("rmq.dashboard")

COOKIE = "rmq_session"
SESSION_IDLE_SECONDS = 8 * 3600  # a session unused this long ends
LOGIN_FAILURES_ALLOWED = 5  # failed logins from one address within LOGIN_FAILURE_WINDOW, then 429
LOGIN_FAILURE_WINDOW = 60.0  # seconds
_MAX_TRACKED_ADDRESSES = 10_000  # addresses with recent failures kept (beyond: the stale ones dropped)
# scrypt's cost (N=2**14, r=8, p=1: 16 MiB and tens of ms a check): what hashlib documents as a
# reasonable interactive-login setting
_N, _R, _P = 1 << 14, 8, 1
MIN_PASSWORD_LENGTH = 8  # NIST SP 800-63B's least for a password a user picks
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
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ConfigError(f"a console password needs at least {MIN_PASSWORD_LENGTH} characters; "
                          f"the one given for {name} has {len(password)}")
    users = read_users(path) if os.path.exists(path) else {}
    new = name not in users
    users[name] = hash_password(password)
    atomic_write(path, "".join(f"{u}:{h}\n" for u, h in users.items()).encode("utf-8"), mode=0o600)
    return new


class TooManyLogins(Exception):
    """Logins from this address are refused for `retry_after` seconds (too many failed ones)."""

    def __init__(self, address: str, retry_after: float):
        self.address, self.retry_after = address, retry_after
        super().__init__(f"too many failed logins from {address}: try again in {math.ceil(retry_after)} s")


def _file_stamp(path: str):
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino


class Sessions:
    """Who may use the console: the users (re-read when their file changes), their live sessions
    (token -> user, last use) and the recent failed logins of each client address."""

    def __init__(self, users: dict[str, str], *, users_file: str | None = None, clock=time.monotonic):
        self.users = users
        self.users_file = users_file
        self._stamp = _file_stamp(users_file) if users_file else None
        self._clock = clock
        self._sessions: dict[str, tuple[str, float]] = {}
        self._failures: dict[str, collections.deque] = {}  # address -> times of its recent failed logins
        self._lock = threading.Lock()
        self._dummy = hash_password("-")  # checked for an unknown name, so both take as long

    def _current_users(self) -> dict[str, str]:
        """The users, re-read first when the file changed (one stat a call)."""
        path = self.users_file
        if path is None:
            return self.users
        try:
            stamp = _file_stamp(path)
        except OSError as e:
            stamp = e.strerror
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                users = read_users(path)
            except ConfigError as e:
                log.error("console users: %s; keeping the last good users", e)
            else:
                if not users:
                    log.error("console users: %s names no user; keeping the last good users", path)
                else:
                    self.users = users
                    log.info("console users: re-read %s (%d users)", path, len(users))
        return self.users

    def _retry_after(self, address: str, now: float) -> float:
        """Seconds until `address` may try again (0: now); its failures older than the window dropped."""
        times = self._failures.get(address)
        if not times:
            return 0.0
        while times and now - times[0] >= LOGIN_FAILURE_WINDOW:
            times.popleft()
        if not times:
            del self._failures[address]
            return 0.0
        return LOGIN_FAILURE_WINDOW - (now - times[0]) if len(times) >= LOGIN_FAILURES_ALLOWED else 0.0

    def _failed(self, address: str, now: float) -> None:
        if len(self._failures) >= _MAX_TRACKED_ADDRESSES and address not in self._failures:
            for a in [a for a, t in self._failures.items() if now - t[-1] >= LOGIN_FAILURE_WINDOW]:
                del self._failures[a]
            if len(self._failures) >= _MAX_TRACKED_ADDRESSES:
                self._failures.pop(next(iter(self._failures)))  # (the oldest tracked)
        self._failures.setdefault(address, collections.deque(maxlen=LOGIN_FAILURES_ALLOWED)).append(now)

    def login(self, name: str, password: str, address: str = "") -> str | None:
        """A new session's token, or None for a wrong name or password; TooManyLogins while
        `address` (the client's) has had LOGIN_FAILURES_ALLOWED failed logins within the window."""
        with self._lock:
            wait = self._retry_after(address, self._clock())
        if wait > 0:
            raise TooManyLogins(address, wait)
        stored = self._current_users().get(name)
        ok = check_password(password, stored or self._dummy) and stored is not None
        with self._lock:
            now = self._clock()
            if not ok:
                self._failed(address, now)
                return None
            self._failures.pop(address, None)
            token = secrets.token_urlsafe(32)
            self._sessions[token] = (name, now)
        return token

    def user(self, token: str | None) -> str | None:
        """The user of a live session (its idle clock restarted), else None (also once the user
        is no longer in the users file)."""
        if not token:
            return None
        users = self._current_users()
        now = self._clock()
        with self._lock:
            s = self._sessions.get(token)
            if s is None:
                return None
            if now - s[1] > SESSION_IDLE_SECONDS or s[0] not in users:
                del self._sessions[token]
                return None
            self._sessions[token] = (s[0], now)
            return s[0]

    def logout(self, token: str | None) -> None:
        with self._lock:
            self._sessions.pop(token or "", None)
