"""Which parts of rmq_core import which (DESIGN.md: dependencies point one way), read from the
source with ast: every import counts, a lazy one inside a function too; one under
`if TYPE_CHECKING:` does not (it never runs: it only lets a reader follow a type)."""
from __future__ import annotations

import ast
import functools
import pathlib

import rmq_core

ROOT = pathlib.Path(rmq_core.__file__).parent


@functools.lru_cache(maxsize=None)  # (each source parsed once per run, whichever rule reads it first)
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


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
    tree = _tree(path)
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking_block(block)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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


def _is_type_checking_block(node) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.lru_cache(maxsize=None)  # (read once per run: every rule below asks for it)
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
        for node in ast.walk(_tree(path)):
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


def test_the_pull_consumer_does_not_reach_the_push_consumer():
    """What both consumers share is consumer_base's; the lite pull consumer needs none of the push
    consumer's consume threads and listener machinery."""
    graph = _graph()
    assert "rmq_core.client.consumer_base" in graph["rmq_core.client.pull_consumer"]
    assert "rmq_core.client.push_consumer" not in _reachable(graph, "rmq_core.client.pull_consumer")


def _private_names_of(path: pathlib.Path, class_name: str) -> set[str]:
    """The private methods and `self._x` attributes a class defines."""
    tree = _tree(path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


# the names other modules hold the broker controller by (Processor.ctrl, ReplicasManager.broker, ...)
_CONTROLLER_HOLDERS = {"ctrl", "_ctrl", "controller", "_controller", "broker", "_broker"}


def test_no_module_outside_the_controller_touches_its_private_names():
    """A processor (or any other part) asks the controller through its public methods (spawn,
    start_service_task, ...): its private state can then change without breaking them at run time."""
    controller = ROOT / "broker" / "controller.py"
    private = _private_names_of(controller, "BrokerController")
    assert "_tasks" in private and "_register_job" in private  # the rule sees what it guards
    reaches = []
    for path in [*ROOT.rglob("*.py"), *(ROOT.parent / "plugins").rglob("*.py"), *(ROOT.parent / "spark_plugin").rglob("*.py")]:
        if path == controller:
            continue
        for node in ast.walk(_tree(path)):
            if not (isinstance(node, ast.Attribute) and node.attr in private):
                continue
            holder = node.value
            name = holder.attr if isinstance(holder, ast.Attribute) else getattr(holder, "id", None)
            if name in _CONTROLLER_HOLDERS:
                reaches.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {ast.unparse(node)}")
    assert not reaches, reaches


# A function-level import in admin is kept only where loading at the top would cost every `rmq`
# run (the CLI builds every command's parser): rich (printing), the commands registering
# themselves, and the admin client a command runs with.
_ADMIN_LATE_IMPORTS_KEPT = {
    ("rmq_core/admin/output.py", "rich"), ("rmq_core/admin/output.py", "rich.console"),
    ("rmq_core/admin/output.py", "rich.table"), ("rmq_core/admin/output.py", "rich.progress"),
    ("rmq_core/admin/output.py", "rich.markup"),
    ("rmq_core/admin/commands/__init__.py", "rmq_core.admin.commands"),
    ("rmq_core/admin/commands/__init__.py", "rmq_core.admin.client"),
    ("rmq_core/admin/commands/__init__.py", "rmq_core.admin.output"),
}


def test_no_late_imports_in_admin():
    """The admin client's calls (admin/calls/, one module per command family) and the commands
    import what they use at the top, where a reader sees a module's dependencies."""
    late = []
    for path in (ROOT / "admin").rglob("*.py"):
        rel = str(path.relative_to(ROOT.parent))
        for fn in ast.walk(_tree(path)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    module = node.module
                elif isinstance(node, ast.Import):
                    module = node.names[0].name
                else:
                    continue
                if (rel, module) not in _ADMIN_LATE_IMPORTS_KEPT:
                    late.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert not late, late
