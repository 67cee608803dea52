"""A third-party allocate strategy installed with pip from examples/ and found via its entry point."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_core import plugins
from rmq_core.errors import PluginNotFoundError
from rmq_core.message import MessageQueue

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rmq-allocate-reverse"


def test_unknown_strategy_lists_available_names():
    with pytest.raises(PluginNotFoundError) as e:
        plugins.get_allocate_strategy("no_such_strategy")
    msg = str(e.value)
    assert "'no_such_strategy'" in msg
    for name in ("averagely", "by_circle", "consistent_hash", "sticky"):
        assert name in msg


def test_reverse_plugin_installed_with_pip_is_found_by_name(tmp_path):
    # Build from a copy: an in-tree build would leave build/ and *.egg-info inside examples/.
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                    "--disable-pip-version-check", "--target", str(target), str(src)], check=True, timeout=300)
    assert not list(EXAMPLE.glob("*.egg-info")) and not (EXAMPLE / "build").exists()
    with pytest.raises(PluginNotFoundError):
        plugins.get_allocate_strategy("reverse")  # not installed yet from this process's point of view
    sys.path.insert(0, str(target))
    try:
        plugins.reset_plugin_manager()
        strategy = plugins.get_allocate_strategy("reverse")
        assert strategy.name == "reverse"
        assert "reverse" in plugins.available("allocate strategy")
        assert "averagely" in plugins.available("allocate strategy")  # built-ins still there
        mqs = [MessageQueue("T", "b", i) for i in range(5)]
        got = {c: [mq.queue_id for mq in strategy.allocate("g", c, mqs, ["c1", "c0"])] for c in ("c0", "c1")}
        assert got == {"c0": [4, 3, 2], "c1": [1, 0]}
    finally:
        sys.path.remove(str(target))
        sys.modules.pop("rmq_allocate_reverse", None)
        plugins.reset_plugin_manager()
    with pytest.raises(PluginNotFoundError):
        plugins.get_allocate_strategy("reverse")
