"""The web console (`rmq dashboard -n NS --listen 127.0.0.1:8080`): plain HTML/CSS/JS shipped in
the package (static/) over a small JSON API (app.py) that calls the admin client (backend.py).
Nothing is built on the user's machine and nothing is fetched from the internet at run time."""
from __future__ import annotations

from rmq_core.dashboard.app import DashboardServer


def serve(namesrv: str, host: str = "127.0.0.1", port: int = 8080) -> DashboardServer:
    """A started console for the cluster behind `namesrv` (stop() it when done)."""
    from rmq_core.dashboard.backend import Backend

    return DashboardServer(Backend.connect(namesrv), host, port).start()


__all__ = ["DashboardServer", "serve"]
