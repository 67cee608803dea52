"""How `rmq admin` prints: rich tables on stdout (or, with --json, the same rows as a JSON array of
objects keyed by the column headers in snake_case, typed: numbers as numbers, booleans as JSON
booleans, costs in integer ms), progress bars and the one-line errors on stderr.  rich is
imported here, inside the calls, so building the `rmq` parser stays light."""
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


class Shown:
    """A cell whose table text is not its --json value: a cost of 11 shown "11ms", no time "N/A"
    (None in JSON), a broker's "0.25" read back as the number it is."""
    __slots__ = ("value", "text")

    def __init__(self, value: Any, text: str):
        self.value, self.text = value, text

    def __repr__(self) -> str:
        return f"Shown({self.value!r}, {self.text!r})"


_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+")


def typed(text: Any) -> Any:
    """A value the servers hand over as text (a broker's runtime info or config, a name server's
    config) as a cell: shown as it came, its --json value a JSON boolean or number when it is one."""
    if not isinstance(text, str):
        return text
    if text in ("true", "false", "True", "False"):  # (Java's Boolean.toString, and Python's str(bool))
        return Shown(text in ("true", "True"), text)
    if _INT.fullmatch(text):
        return Shown(int(text), text)
    if _FLOAT.fullmatch(text):
        return Shown(float(text), text)
    return text


def _json_cell(v: Any) -> Any:
    return v.value if type(v) is Shown else v


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
              footer: Sequence[str] = (), json_rows: Sequence[dict] | None = None) -> None:
        """Aligned columns (numbers right-aligned); with --json the rows join the output array (a
        Shown cell as its value), or `json_rows` instead when the objects carry more than the columns."""
        rows = [list(r) for r in rows]
        if self.as_json:
            if json_rows is not None:
                self._rows.extend(json_rows)
                return
            keys = [snake(c) for c in columns]
            self._rows.extend({k: _json_cell(v) for k, v in zip(keys, r)} for r in rows)
            return
        from rich import box
        from rich.table import Table
        t = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left",
                  header_style="bold")
        for i, c in enumerate(columns):
            numeric = bool(rows) and all(isinstance(v := _json_cell(r[i]), (int, float)) and not isinstance(v, bool)
                                         for r in rows)
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
            self._rows.append({snake(k): _json_cell(v) for k, v in fields})
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
    if type(v) is Shown:
        from rich.markup import escape
        return escape(v.text)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    from rich.markup import escape
    return escape(str(v))
