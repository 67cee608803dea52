"""The console's HTTP side: static pages shipped in the package and a small JSON API over a
Backend (backend.py), served by the standard library's threading HTTP server.

API (every answer JSON; a failure is {"error": "one line"}: 400 when the admin call failed - a
bad or unknown name, a broker that did not answer - naming what was wrong):

    GET  /api/cluster                      brokers (role, address, version, TPS, disk) + topics
    GET  /api/topics                       topic names with their kind (normal, retry, dlq, system)
    GET  /api/topic?topic=T                queues: broker, qid, min / max offset, last updated
    POST /api/topic        {topic, queues} create (or update) on every master of the cluster
    POST /api/topic/delete {topic}         delete from the brokers and the name server
    GET  /api/groups                       consumer groups with members, TPS and total lag
    GET  /api/group?group=G                members and per-queue progress (lag per queue)
    POST /api/group/reset  {group, topic, timestamp}   resetOffsetByTime (ms since the epoch)
    GET  /api/messages?id=I | ?topic=T&key=K | ?topic=T&begin=MS&end=MS
                                           messages with body preview and per-group delivery state
    POST /api/message/resend {topic, id}   send a stored message to its topic again
    GET  /api/dlq/groups                   groups with a dead-letter queue and its size
    GET  /api/dlq?group=G                  the group's dead letters
    GET  /api/charts                       SVG charts: brokers' in / out TPS, the busiest topics' TPS
    GET  /api/chart/topic?topic=T          SVG chart of a topic's in TPS over time
    GET  /api/chart/group?group=G          SVG chart of a group's lag over time
    GET  /api/history                      the sampled series themselves (history.py), for scripts
    POST /api/dlq/resend {group, ids}      send dead letters back to be consumed again

With a users file (`rmq dashboard --users FILE`, auth.py) the console asks for a login:

    POST /api/login  {user, password}      a session cookie (HttpOnly, SameSite=Strict), or 401;
                                           429 (Retry-After) after 5 failed logins in a minute
                                           from the client's address
    POST /api/logout                       ends the session
    GET  /api/session                      {"user": name, "login": true|false}

and every other API call without a live session is answered 401 {"error": ...}; pages redirect to
/login.html.  Without one, only a loopback address may be served (DashboardServer refuses others).
"""
from __future__ import annotations

import json
import logging
import math
import mimetypes
import os
import threading
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from rmq_core.config import DEFAULT_SERVER_SOCKET_BACKLOG
from rmq_core.dashboard.auth import COOKIE, SESSION_IDLE_SECONDS, Sessions, TooManyLogins
from rmq_core.errors import ConfigError, IllegalArgumentError, RMQError, one_line
from rmq_core.message import is_loopback
from rmq_core.remoting.transport import with_backlog

log = logging.getLogger("rmq.dashboard")

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
MAX_BODY = 1 << 20
# what a browser without a session may load: the login page and what it needs
PUBLIC_PAGES = frozenset(("login.html", "login.js", "style.css"))


class BadRequest(Exception):
    """A request the console refuses (missing or malformed parameter): 400 with its message."""


def _str(params: dict, name: str, required: bool = True) -> str | None:
    v = params.get(name)
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None or (isinstance(v, str) and not v.strip()):
        if required:
            raise BadRequest(f"missing parameter {name!r}")
        return None
    return str(v).strip()


def _int(params: dict, name: str, required: bool = True, default: int | None = None) -> int | None:
    v = _str(params, name, required and default is None)
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        raise BadRequest(f"parameter {name!r} must be an integer, got {v!r}") from None


class DashboardApp:
    """Routes API calls to `backend` (see backend.Backend) and serves the static pages."""

    def __init__(self, backend, sessions: Sessions | None = None):
        self.backend = backend
        self.sessions = sessions  # None: no login (a loopback-only console)
        b = backend
        self.get_routes = {
            "/api/cluster": lambda q: b.cluster(),
            "/api/topics": lambda q: b.topics(),
            "/api/topic": lambda q: b.topic_status(_str(q, "topic")),
            "/api/groups": lambda q: b.groups(),
            "/api/group": lambda q: b.group(_str(q, "group")),
            "/api/messages": self._messages,
            "/api/dlq": lambda q: b.dlq(_str(q, "group"), _int(q, "max", default=64)),
            "/api/dlq/groups": lambda q: b.dlq_groups(),
            "/api/charts": lambda q: b.charts(),
            "/api/chart/topic": lambda q: b.topic_chart(_str(q, "topic")),
            "/api/chart/group": lambda q: b.group_chart(_str(q, "group")),
            "/api/history": lambda q: b.history_data(),
            "/api/message/trace": lambda q: b.message_trace(_str(q, "id"), _str(q, "traceTopic", required=False)),
        }
        self.post_routes = {
            "/api/topic": lambda d: b.create_topic(_str(d, "topic"), _int(d, "queues", default=8),
                                                   _str(d, "cluster", required=False)),
            "/api/topic/delete": lambda d: b.delete_topic(_str(d, "topic")),
            "/api/group/reset": lambda d: b.reset_offset(_str(d, "group"), _str(d, "topic"), _int(d, "timestamp")),
            "/api/message/resend": lambda d: b.resend_message(_str(d, "topic"), _str(d, "id")),
            "/api/dlq/resend": self._dlq_resend,
        }

    def _messages(self, q):
        msg_id, topic, key = _str(q, "id", False), _str(q, "topic", False), _str(q, "key", False)
        if msg_id:
            return self.backend.message_by_id(msg_id, topic)
        if topic and key:
            return self.backend.messages_by_key(topic, key)
        if topic and (q.get("begin") or q.get("end")):
            return self.backend.messages_by_time(topic, _int(q, "begin", default=0),
                                                 _int(q, "end", required=False), _int(q, "max", default=64))
        raise BadRequest("search by id=, by topic= and key=, or by topic= with begin= / end= (ms)")

    def _dlq_resend(self, d):
        ids = d.get("ids")
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            raise BadRequest(f"'ids' must be a list of message ids, got {ids!r}")
        return self.backend.dlq_resend(_str(d, "group"), ids or None)

    def handle(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, object]:
        routes = self.get_routes if method == "GET" else self.post_routes
        fn = routes.get(path)
        if fn is None:
            return HTTPStatus.NOT_FOUND, {"error": f"no such API: {method} {path}"}
        try:
            return HTTPStatus.OK, fn(query if method == "GET" else (body or {}))
        except BadRequest as e:
            return HTTPStatus.BAD_REQUEST, {"error": str(e)}
        except (IllegalArgumentError, LookupError, RMQError) as e:  # a bad or unknown topic / group / id
            return HTTPStatus.BAD_REQUEST, {"error": one_line(e)}
        except (OSError, TimeoutError) as e:
            return HTTPStatus.BAD_GATEWAY, {"error": one_line(e)}
        except Exception as e:  # a bug: logged, answered in one line, the console keeps serving
            log.exception("%s %s failed", method, path)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"}


class _Handler(BaseHTTPRequestHandler):
    server_version = "rmq-dashboard"
    app: DashboardApp  # set on the subclass made per server

    def log_message(self, fmt, *args):  # through logging, not stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, payload: bytes, ctype: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(payload)

    def _json(self, status: int, obj, **headers: str) -> None:
        self._send(status, json.dumps(obj, default=str).encode(), "application/json; charset=utf-8", **headers)

    # --- the login (only with a users file) ---------------------------------------------------------
    def _token(self) -> str | None:
        try:
            morsel = SimpleCookie(self.headers.get("Cookie") or "").get(COOKIE)
        except CookieError:
            return None
        return morsel.value if morsel is not None else None

    def _user(self) -> str | None:
        return self.app.sessions.user(self._token())

    def _auth_api(self, method: str, path: str, body) -> bool:
        """Answer the login calls and refuse an API call without a session; True when answered."""
        sessions = self.app.sessions
        if path == "/api/session" and method == "GET":
            self._json(HTTPStatus.OK, {"user": sessions and self._user(), "login": sessions is not None})
            return True
        if sessions is None:
            if path in ("/api/login", "/api/logout"):
                self._json(HTTPStatus.NOT_FOUND, {"error": "this console has no login (started without --users)"})
                return True
            return False
        if path == "/api/login" and method == "POST":
            try:
                token = sessions.login(str(body.get("user") or ""), str(body.get("password") or ""),
                                       self.client_address[0])
            except TooManyLogins as e:
                log.warning("console login from %s refused: %s", self.address_string(), e)
                self._json(HTTPStatus.TOO_MANY_REQUESTS, {"error": str(e)}, Retry_After=str(math.ceil(e.retry_after)))
                return True
            if token is None:
                log.warning("console login refused for user %r from %s", body.get("user"), self.address_string())
                self._json(HTTPStatus.UNAUTHORIZED, {"error": "wrong user name or password"})
            else:
                self._json(HTTPStatus.OK, {"user": body.get("user")}, Set_Cookie=(
                    f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_IDLE_SECONDS}"))
            return True
        if path == "/api/logout" and method == "POST":
            sessions.logout(self._token())
            self._json(HTTPStatus.OK, {"user": None}, Set_Cookie=f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
            return True
        if self._user() is None:
            self._json(HTTPStatus.UNAUTHORIZED, {"error": "not logged in: POST /api/login first"})
            return True
        return False

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path.startswith("/api/"):
            if self._auth_api("GET", url.path, None):
                return
            status, obj = self.app.handle("GET", url.path, parse_qs(url.query), None)
            self._json(status, obj)
            return
        name = "index.html" if url.path in ("/", "/index.html") else url.path.lstrip("/")
        if self.app.sessions is not None and name not in PUBLIC_PAGES and self._user() is None:
            self._send(HTTPStatus.FOUND, b"", "text/plain", Location="/login.html")
            return
        path = os.path.normpath(os.path.join(STATIC_DIR, name))
        if not path.startswith(STATIC_DIR + os.sep) or not os.path.isfile(path):
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {url.path}"})
            return
        with open(path, "rb") as f:
            data = f.read()
        ctype = mimetypes.guess_type(path)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        self._send(HTTPStatus.OK, data, ctype)

    def do_POST(self):
        url = urlsplit(self.path)
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY:
            self._json(HTTPStatus.BAD_REQUEST, {"error": f"bad Content-Length {self.headers.get('Content-Length')!r}"})
            return
        raw = self.rfile.read(n) if n else b"{}"
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object")
        except ValueError as e:
            self._json(HTTPStatus.BAD_REQUEST, {"error": f"bad JSON body: {e}"})
            return
        if self._auth_api("POST", url.path, body):
            return
        status, obj = self.app.handle("POST", url.path, {}, body)
        self._json(status, obj)


class DashboardServer:
    """The console on `host:port` (port 0 picks a free one); `start()` serves in a thread.  With
    `users` (name -> stored hash, auth.read_users) it asks for a login; without, it serves only
    on a loopback address."""

    def __init__(self, backend, host: str = "127.0.0.1", port: int = 8080,
                 backlog: int = DEFAULT_SERVER_SOCKET_BACKLOG, users: dict[str, str] | None = None,
                 users_file: str | None = None):
        if users is None and not is_loopback(host):
            raise ConfigError(f"refusing to serve the console on {host} without a login: anyone reaching it could "
                              "change the cluster; give it a users file (rmq dashboard --users FILE, made by "
                              "rmq dashboard adduser FILE NAME) or listen on 127.0.0.1")
        if users is not None and not users:
            raise ConfigError("the users file names no user: add one with `rmq dashboard adduser FILE NAME`")
        sessions = Sessions(users, users_file=users_file) if users is not None else None
        handler = type("Handler", (_Handler,), {"app": DashboardApp(backend, sessions)})
        self.httpd = with_backlog(ThreadingHTTPServer, backlog)((host, port), handler)
        self.httpd.daemon_threads = True
        self.backend = backend
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/"

    def start(self) -> "DashboardServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rmq-dashboard", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
