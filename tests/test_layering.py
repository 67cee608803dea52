"""Which parts of rmq_core import which (DESIGN.md: dependencies point one way), read from the
source with ast: every import counts, a lazy one inside a function too."""
from __future__ import annotations

import ast
import pathlib

import rmq_core

ROOT = pathlib.Path(rmq_core.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(path: pathlib.Path, known: dict) -> set[str]:
    """The rmq_core modules `path` imports (for `from package import name`, the submodule when
    `name` is one, else the package)."""
    out = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(path, known) for name, path in known.items()}


def _reachable(graph: dict, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _find_cycle(graph: dict, nodes: set[str]) -> list[str] | None:
    """A cycle among `nodes` (edges leaving `nodes` ignored), as a path, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n] & nodes):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_sees_the_imports_it_should():
    graph = _graph()
    # a known edge of each kind: `from package import module`, a lazy import in a function
    assert "rmq_core.client.futures" in graph["rmq_core.client.producer"]
    assert "rmq_core.store" in graph["rmq_core.broker.controller"]
    assert _find_cycle({"a": {"b"}, "b": {"a"}}, {"a", "b"}) == ["a", "b", "a"]


def test_no_import_circle_in_client():
    graph = _graph()
    client = {m for m in graph if m.startswith("rmq_core.client.")}
    assert _find_cycle(graph, client) is None, " -> ".join(_find_cycle(graph, client))


def test_the_store_imports_nothing_of_remoting():
    graph = _graph()
    for module in (m for m in graph if m == "rmq_core.store" or m.startswith("rmq_core.store.")):
        wire = {m for m in _reachable(graph, module) if m.startswith("rmq_core.remoting")}
        assert not wire, f"{module} reaches {sorted(wire)}"


def test_common_imports_neither_side():
    graph = _graph()
    sides = ("rmq_core.broker", "rmq_core.client", "rmq_core.store", "rmq_core.remoting", "rmq_core.namesrv")
    for module in (m for m in graph if m.startswith("rmq_core.common")):
        bad = {m for m in _reachable(graph, module) if m.startswith(sides)}
        assert not bad, f"{module} reaches {sorted(bad)}"


def test_no_class_or_module_defines_a_function_twice():
    """A second `def` of the same name silently replaces the first (a slave's dispatch-behind
    measure was lost that way); properties' setters and overloads are the exceptions."""
    twice = []
    for path in [*ROOT.rglob("*.py"), *(ROOT.parent / "plugins").rglob("*.py"), *(ROOT.parent / "spark_plugin").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Module, ast.ClassDef)):
                continue
            seen: dict[str, int] = {}
            for item in node.body:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if any(k in ast.unparse(d) for d in item.decorator_list for k in ("setter", "deleter", "overload")):
                    continue
                if item.name in seen:
                    twice.append(f"{path}:{item.lineno} {item.name} (first at line {seen[item.name]})")
                seen[item.name] = item.lineno
    assert not twice, twice


def test_no_runtime_code_imports_the_test_oracles():
    """The pure-Python twins of the native record code (tests/codec_oracle.py) are test oracles:
    nothing that ships imports anything of tests/ (a lazy import inside a function counts too)."""
    import re

    repo = ROOT.parent
    pattern = re.compile(r"^\s*(from\s+tests[.\s]|import\s+tests\b)", re.M)
    offenders = [str(path.relative_to(repo)) for top in ("rmq_core", "plugins", "spark_plugin")
                 for path in (repo / top).rglob("*.py") if pattern.search(path.read_text())]
    assert offenders == []
