"""The web console (`rmq dashboard -n NS --listen 127.0.0.1:8080`): plain HTML/CSS/JS shipped in
the package (static/) over a small JSON API (app.py) that calls the admin client (backend.py).
Nothing is built on the user's machine and nothing is fetched from the internet at run time."""
from __future__ import annotations

from rmq_core.dashboard.app import DashboardServer
from rmq_core.dashboard.history import DEFAULT_INTERVAL


def serve(namesrv: str, host: str = "127.0.0.1", port: int = 8080, *, users_file: str | None = None,
          access_key: str | None = None, secret_key: str | None = None,
          stats_interval: float = DEFAULT_INTERVAL) -> DashboardServer:
    """A started console for the cluster behind `namesrv` (stop() it when done): with
    `users_file`, behind a login (auth.py: the file re-read when it changes); with `access_key` / `secret_key`, its admin calls are
    signed with that ACL account; its charts sample the brokers' stats every `stats_interval`
    seconds (0: no charts)."""
    from rmq_core.dashboard.auth import read_users
    from rmq_core.dashboard.backend import Backend

    users = read_users(users_file) if users_file else None
    backend = Backend.connect(namesrv, access_key=access_key, secret_key=secret_key, stats_interval=stats_interval)
    try:
        server = DashboardServer(backend, host, port, users=users, users_file=users_file)
    except BaseException:
        backend.close()
        raise
    if backend.history is not None:
        backend.history.start()
    return server.start()


__all__ = ["DashboardServer", "serve"]
