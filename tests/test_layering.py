"""Which parts of rmq_core import which (DESIGN.md: dependencies point one way), read from the
source with ast: every import counts, a lazy one inside a function too; one under
`if TYPE_CHECKING:` does not (it never runs: it only lets a reader follow a type)."""
from __future__ import annotations

import ast
import functools
import pathlib
import re

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


# --- the native layer reads no Python attribute by name -------------------------------------------
NATIVE = ROOT / "_native"


def _pyx_code(path: pathlib.Path) -> list[str]:
    """The lines of a .pyx with its comments and string literals blanked (Cython tokenizes as
    Python does, near enough: cdef, casts and pointers come out as names and operators)."""
    import io
    import tokenize

    text = path.read_text()
    rows = [list(line) for line in text.splitlines(True)]
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            (sr, sc), (er, ec) = tok.start, tok.end
            for r in range(sr, er + 1):
                row = rows[r - 1]
                for i in range(sc if r == sr else 0, ec if r == er else len(row)):
                    if row[i] != "\n":
                        row[i] = " "
    return ["".join(r) for r in rows]


_PARAM = re.compile(r"[(,]\s*(?!object\b)((?:\w+\s+)*\w+)(?:\[[^\]]*\])?[\s*]+(\w+)\s*(?=[,)=])")
_CAST_BOUND = re.compile(r"\b(\w+)\s*=\s*<(?!object\b)\w+\??>")
_READ = re.compile(r"(?<![\w.)\]])([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b(?!\s*\()")

# the value classes native code is handed (frozen or plain data of the public API): their fields
# may be read by these conventional names, and the names are checked against the classes here -
# a renamed field fails this test instead of a send
def _value_fields() -> dict[str, set[str]]:
    import attrs

    from rmq_core.message import Message, MessageQueue, SendResult

    message = {f.name for f in attrs.fields(Message)}
    return {"message": message, "msg": message, "mq": {f.name for f in attrs.fields(MessageQueue)},
            "result": {f.name for f in attrs.fields(SendResult)}}


def _native_reads(path: pathlib.Path) -> set[str]:
    """`base.attr` reads (and writes) of a Python object by name in a .pyx: an attribute not
    followed by a call, on a name not typed in the module (`cdef T x`, a `T x` parameter, `x =
    <T>y`, self) that is not a module, not a dunder and not a value class's field; and any
    getattr/setattr/hasattr.  Method calls are the objects' interface and are not counted."""
    code = _pyx_code(path)
    text = "\n".join(code)
    typed = {"self"}
    for line in code:  # `cdef [public] T[:] a, *b = x`: a C-level (typed) declaration of a and b
        decl = line.strip()
        decl = decl.split("=")[0]
        if not decl.startswith("cdef ") or "(" in decl or decl.startswith(("cdef class", "cdef extern")):
            continue
        decl = re.sub(r"\[[^\]]*\]", " ", decl[5:])
        words = decl.split(",")
        if words[0].split() and words[0].split()[0] != "object":
            typed.add(words[0].split()[-1].strip("*"))
            typed.update(w.split()[0].strip("*") for w in words[1:] if w.split())
    typed.update(m.group(2) for m in _PARAM.finditer(re.sub(r"\s+not\s+None\b", "", text)) if m.group(1).split()[-1] not in ("def", "cpdef", "cdef", "return"))
    typed.update(_CAST_BOUND.findall(text))
    modules = {alias or name for name, alias in re.findall(r"^\s*c?import\s+(\w+)(?:\s+as\s+(\w+))?", text, re.M)}
    values = _value_fields()
    reads = set()
    for line in code:
        stripped = line.strip()
        if stripped.startswith(("from ", "import ", "cimport ", "@")):
            continue
        for m in _READ.finditer(line):
            base, attr = m.groups()
            if base in typed or base in modules or attr.startswith("__") or attr in values.get(base, ()):
                continue
            reads.add(f"{base}.{attr}")
        reads.update(m.group(1) for m in re.finditer(r"\b(getattr|setattr|hasattr)\s*\(", line))
    return reads


# reads by name that native modules outside the send decision still make (to go, not to grow):
# a new one fails the test; the send decision's modules have none
_NATIVE_READS_LEFT = {
    "frame.pyx": {"cmd.code", "cmd.ext_fields", "cmd.flag", "cmd.language", "cmd.opaque", "cmd.remark",
                  "cmd.version"},
    "index.pyx": {"q.popleft"},
    "record.pyx": {"buf.c_contiguous", "hasattr"},
    # the batch encoder reads Message fields by name (moved here from record.pyx, where the rule
    # did not see them); a typed message would end this
    "record_batch.pyx": {"m.body", "m.delay_time_level", "m.flag", "m.keys", "m.properties", "m.tags", "m.topic",
                         "m.wait_store_msg_ok"},
    "send_lane.pyx": {"ar.logics_offset", "ar.msg_id", "ar.wrote_bytes", "ctx.remote_address", "getattr",
                      "result.append_result"},
}


def test_the_native_attribute_rule_sees_what_it_should():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        sample = pathlib.Path(d, "sample.pyx")
        sample.write_text(
            "cdef class A:\n    cdef TopicPublishInfo route\n    cdef double[:] v\n"
            "def f(info, SendWait wait, mq, channel, message):\n"
            "    x = info.index + route.index + v.shape[0]  # info: by name\n    '''info.doc: not code'''\n"
            "    wait.channel = channel\n    channel.send(1)\n    y = mq.broker_name + message.topic\n"
            "    z = getattr(channel, 'writes', None)\n    return channel.closed\n")
        assert _native_reads(sample) == {"info.index", "getattr", "channel.closed"}


def test_no_native_module_reads_a_python_attribute_by_name():
    """The house rule for rmq_core/_native: native code takes bytes, plain values and typed
    (cdef class) objects; a read by name of a Python object's attribute breaks only at run time
    when the attribute is renamed."""
    found = {p.name: _native_reads(p) for p in sorted(NATIVE.glob("*.pyx"))}
    new = {name: sorted(reads - _NATIVE_READS_LEFT.get(name, set())) for name, reads in found.items()}
    assert not any(new.values()), {k: v for k, v in new.items() if v}
    gone = {name: sorted(left - found.get(name, set())) for name, left in _NATIVE_READS_LEFT.items()}
    assert not any(gone.values()), f"no longer read, take them off _NATIVE_READS_LEFT: {gone}"
    assert not found["send_pipeline.pyx"] and not found["send_route.pyx"]


def test_no_native_module_touches_concurrent_futures_internals():
    """A concurrent Future is finished through its public API (set_result / set_exception), never
    through its __dict__ or concurrent.futures._base's private names."""
    for path in NATIVE.glob("*.pyx"):
        text = "\n".join(_pyx_code(path))
        for banned in ("_base", "__dict__", "PyObject_GenericGetDict", "_condition", "_state"):
            assert not re.search(rf"\b{re.escape(banned)}\b", text), f"{path.name} uses {banned}"


# the Python modules that still read concurrent.futures' private states (LeanFuture's lazy
# Condition and lean finish, aio's transfer of a finished Future): to go, not to grow
_FUTURES_BASE_LEFT = {"rmq_core.client.futures", "rmq_core.aio"}


def test_no_module_imports_concurrent_futures_base():
    users = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "concurrent.futures._base" or (
                    isinstance(node, ast.Import) and any(a.name == "concurrent.futures._base" for a in node.names)):
                users.add(name)
    assert users == _FUTURES_BASE_LEFT, f"new: {sorted(users - _FUTURES_BASE_LEFT)}; gone (take them off the list): " \
                                        f"{sorted(_FUTURES_BASE_LEFT - users)}"


def test_no_runtime_code_imports_the_test_oracles():
    """The pure-Python twins of the native record code (tests/codec_oracle.py) are test oracles:
    nothing that ships imports anything of tests/ (a lazy import inside a function counts too)."""
    import re

    repo = ROOT.parent
    pattern = re.compile(r"^\s*(from\s+tests[.\s]|import\s+tests\b)", re.M)
    offenders = [str(path.relative_to(repo)) for top in ("rmq_core", "plugins", "spark_plugin")
                 for path in (repo / top).rglob("*.py") if pattern.search(path.read_text())]
    assert offenders == []
