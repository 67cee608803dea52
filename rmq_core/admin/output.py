"""How `rmq admin` prints: rich tables on stdout (or, with --json, the same rows as a JSON array of
objects keyed by the column headers in snake_case), progress bars and the one-line errors on
stderr.  rich is imported here, inside the calls, so building the `rmq` parser stays light."""
from __future__ import annotations

import contextlib
import datetime
import json
import re
import sys
from typing import Any, Iterable, Sequence

from rmq_core.errors import RMQError


def snake(header: str) -> str:
    """'Broker Name' -> 'broker_name', 'QID' -> 'qid', 'ClientId' -> 'client_id', 'InTPS' -> 'in_tps',
    'PCWait(ms)' -> 'pc_wait_ms'."""
    s = re.sub(r"[^0-9A-Za-z]+", " ", header).strip()
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", s)  # humps: ClientId, InTPS, PCWait
    return "_".join(w.lower() for w in s.split())


def fmt_time(ms: int | None) -> str:
    """mqadmin's UtilAll.formatDate(yyyy-MM-dd HH:mm:ss) in local time; N/A for no time."""
    if not ms or ms <= 0:
        return "N/A"
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def body_preview(body: bytes | None, charset: str = "utf-8", limit: int | None = 120) -> str:
    text = (body or b"").decode(charset, "replace")
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


class Output:
    """One command's output: `table()` and `message()` print or collect; `finish()` writes the JSON."""

    def __init__(self, as_json: bool = False, stdout=None, stderr=None):
        self.as_json = as_json
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self._rows: list[dict] = []
        self._console = None

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console
            console = Console(file=self.stdout, highlight=False)
            if not console.is_terminal:  # a pipe or file: never fold a row (scripts grep them)
                console = Console(file=self.stdout, highlight=False, width=100_000)
            self._console = console
        return self._console

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None,
              footer: Sequence[str] = ()) -> None:
        """Aligned columns (numbers right-aligned); with --json the rows join the output array."""
        rows = [list(r) for r in rows]
        if self.as_json:
            keys = [snake(c) for c in columns]
            self._rows.extend(dict(zip(keys, r)) for r in rows)
            return
        from rich import box
        from rich.table import Table
        t = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left",
                  header_style="bold")
        for i, c in enumerate(columns):
            numeric = bool(rows) and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows)
            t.add_column(c, justify="right" if numeric else "left", overflow="fold")
        for r in rows:
            t.add_row(*[_cell(v) for v in r])
        self._emit(t)
        for line in footer:
            self._emit(line, markup=False)

    def record(self, fields: Sequence[tuple[str, Any]], *, title: str | None = None) -> None:
        """One object shown vertically (label: value), as mqadmin prints a message; with --json it
        is one object of the output array, keyed by the labels in snake_case."""
        if self.as_json:
            self._rows.append({snake(k): v for k, v in fields})
            return
        from rich.table import Table
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold", no_wrap=True)
        t.add_column(overflow="fold")
        for k, v in fields:
            t.add_row(f"{k}:", _cell(v))
        if title:
            self._emit(title, markup=False)
        self._emit(t)
        self._emit("")

    def message(self, text: str) -> None:
        """A line for people (e.g. "create topic to X success."); not part of the JSON."""
        if not self.as_json:
            self._emit(text, markup=False)

    def _emit(self, renderable, **kw) -> None:
        console = self.console
        if console.is_terminal:
            console.print(renderable, **kw)
            return
        with console.capture() as cap:  # a pipe or file: no padding spaces at line ends
            console.print(renderable, **kw)
        self.stdout.write("\n".join(line.rstrip() for line in cap.get().split("\n")))

    def finish(self) -> None:
        if self.as_json:
            json.dump(self._rows, self.stdout, ensure_ascii=False, indent=2, default=str)
            self.stdout.write("\n")
            self.stdout.flush()

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None):
        """A progress bar on stderr while a long operation runs; yields advance(n=1)."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        console = Console(file=self.stderr)
        # (only on a terminal: a log file gets no bar redraws; FORCE_COLOR=1 forces it)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as p:
            task = p.add_task(description, total=total)

            def advance(n: int = 1, *, completed: int | None = None, total: int | None = None) -> None:
                if total is not None:
                    p.update(task, total=total)
                if completed is not None:
                    p.update(task, completed=completed)
                else:
                    p.advance(task, n)

            yield advance

    def each(self, description: str, items: Sequence, fetch):
        """(item, fetch(item)) for each of `items` under a progress bar that advances as the caller
        takes the next; an item whose fetch fails (RMQError: gone, unreachable) is passed over."""
        with self.progress(description, len(items)) as advance:
            for item in items:
                try:
                    value = fetch(item)
                except RMQError:
                    advance()
                    continue
                yield item, value
                advance()


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    from rich.markup import escape
    return escape(str(v))
