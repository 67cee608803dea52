"""A plugin that fails to import is an error naming it and the cause, never silently skipped."""
import sys

import pytest

from rmq_core import plugins
from rmq_core.errors import ConfigError, PluginLoadError


@pytest.fixture
def fresh_manager():
    plugins.reset_plugin_manager()
    yield
    plugins.reset_plugin_manager()


def test_a_builtin_entry_point_that_fails_to_import_is_named(fresh_manager, monkeypatch):
    monkeypatch.setitem(sys.modules, "rmq_plugins.metrics", None)  # makes importing it raise ImportError
    with pytest.raises(PluginLoadError) as e:
        plugins.get_allocate_strategy("averagely")
    msg = str(e.value)
    assert "rmq_plugins.metrics" in msg and "halted" in msg
    assert isinstance(e.value, ConfigError) and isinstance(e.value.cause, ImportError)


def test_a_builtin_module_missing_a_dependency_is_named_with_the_dependency(fresh_manager, monkeypatch, tmp_path):
    # a built-in registered directly (a source tree without entry points) whose own import fails
    (tmp_path / "rmq_broken_builtin.py").write_text("import rmq_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "BUILTIN_PLUGIN_MODULES", plugins.BUILTIN_PLUGIN_MODULES + ("rmq_broken_builtin",))
    with pytest.raises(PluginLoadError) as e:
        plugins.available("transport")
    msg = str(e.value)
    assert "'rmq_broken_builtin' (built-in)" in msg and "rmq_no_such_dependency" in msg


def test_all_builtins_load(fresh_manager):
    for kind in ("allocate strategy", "filter expression type", "offset store", "transport", "metrics exporter"):
        assert plugins.available(kind), kind
