"""The native modules are the bottom layer: bytes and plain values in and out.  None of them imports
a Python module of rmq (a cimport of a sibling .pxd is C-level and fine); the Python layer above
wraps their values and hands its error types down (rmq_core.message -> record.use_python_layer)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[1] / "rmq_core" / "_native"
SOURCES = sorted(NATIVE.glob("*.pyx")) + sorted(NATIVE.glob("*.pxd"))

# A Python-level import of an rmq module: `import rmq_core...`, `from rmq_core... import`, or a
# dynamic import naming it.  `from rmq_core._native.x cimport y` is a C-level cimport: not matched.
_RMQ_IMPORT = re.compile(
    r"^\s*(?:import\s+rmq_core\b|from\s+rmq_core[\w.]*\s+import\b)"
    r"|(?:__import__|import_module)\(\s*['\"]rmq_core", re.M)


def test_native_sources_found():
    names = {p.name for p in SOURCES}
    assert {"record.pyx", "frame.pyx", "send_lane.pyx", "commit_log.pyx"} <= names


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_native_module_imports_no_rmq_module(source):
    text = source.read_text(encoding="utf-8")
    found = [m.group(0).strip() for m in _RMQ_IMPORT.finditer(text)]
    assert not found, f"{source.name} imports rmq Python modules: {found}"


def test_record_raises_the_python_layers_types_once_rmq_core_is_loaded():
    from rmq_core._native import record
    from rmq_core.errors import BatchFormatError, IllegalArgumentError, MessageDecodeError

    with pytest.raises(MessageDecodeError, match="at offset 0: truncated record"):
        record.decode_message(b"\x00\x00\x00")
    with pytest.raises(IllegalArgumentError, match="property name '' is empty"):
        record.properties_to_bytes({"": "v"})
    assert record.BatchFormatError is BatchFormatError


def test_record_alone_raises_plain_value_errors_with_the_same_text():
    # Loaded without rmq_core's Python layer (the package's __init__ bypassed): plain ValueErrors.
    code = (
        "import importlib.util, sys, types\n"
        f"pkg = types.ModuleType('rmq_core'); pkg.__path__ = [{str(NATIVE.parent)!r}]\n"
        "sys.modules['rmq_core'] = pkg\n"
        f"nat = types.ModuleType('rmq_core._native'); nat.__path__ = [{str(NATIVE)!r}]\n"
        "sys.modules['rmq_core._native'] = nat\n"
        "from rmq_core._native import record\n"
        "try:\n    record.decode_message(b'\\x00\\x00\\x00')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
        "print(sorted(m for m in sys.modules if m.startswith('rmq_core') and '_native' not in m))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "ValueError bad message data at offset 0: truncated record: 3 bytes left, a record header needs 8",
        "['rmq_core']",
    ]
