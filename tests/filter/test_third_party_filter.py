"""A third-party filter type (REGEX) installed with pip from examples/ and found via its entry point."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_core import plugins
from rmq_core.broker.consumer_filter_manager import BloomMessageFilter, ConsumerFilterManager
from rmq_core.config import BrokerConfig
from rmq_core.errors import FilterExpressionError, PluginNotFoundError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rmq-filter-regex"


def test_unknown_expression_type_lists_available_names():
    with pytest.raises(PluginNotFoundError) as ei:
        plugins.get_filter_factory("NO_SUCH_TYPE")
    msg = str(ei.value)
    assert "'NO_SUCH_TYPE'" in msg and "SQL92" in msg and "TAG" in msg


def test_regex_plugin_installed_with_pip_is_found_by_name(tmp_path):
    src = tmp_path / "src"  # build from a copy: an in-tree build leaves build/ and *.egg-info
    shutil.copytree(EXAMPLE, src)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                    "--disable-pip-version-check", "--target", str(target), str(src)], check=True, timeout=300)
    with pytest.raises(PluginNotFoundError):
        plugins.get_filter_factory("REGEX")
    sys.path.insert(0, str(target))
    try:
        plugins.reset_plugin_manager()
        factory = plugins.get_filter_factory("regex")
        assert {"REGEX", "SQL92", "TAG"} <= set(plugins.available("filter expression type"))
        f = factory("Order(Created|Paid)")
        assert f.expression_type == "REGEX" and f.needs_commit_log_check and f.tag_codes is None
        assert f.is_matched_by_tag("OrderPaid") and not f.is_matched_by_tag("OrderPaidLate")
        assert not f.is_matched_by_tag(None)
        assert f.is_matched_by_commit_log({"TAGS": "OrderCreated"})
        assert not f.is_matched_by_commit_log({"KEYS": "OrderCreated"})
        with pytest.raises(FilterExpressionError) as ei:
            factory("Order(Created")
        assert ei.value.expression_type == "REGEX" and ei.value.position == 5

        # the broker treats it like any expression type: registered, bit maps, bloom on pull
        m = ConsumerFilterManager(BrokerConfig(enable_calc_filter_bit_map=True))
        assert m.register("T", "G", "Order.*", "REGEX", 1)
        pull = m.build_message_filter("G", "T", "REGEX", "Order.*", 1)
        assert isinstance(pull, BloomMessageFilter)
        t = m.get("T", "G").born_time + 1
        assert pull.is_matched_by_consume_queue(0, m.calc_bit_map("T", {"TAGS": "OrderX"}, t), t)
        assert not pull.is_matched_by_consume_queue(0, m.calc_bit_map("T", {"TAGS": "Pay"}, t), t)
    finally:
        sys.path.remove(str(target))
        sys.modules.pop("rmq_filter_regex", None)
        plugins.reset_plugin_manager()
    with pytest.raises(PluginNotFoundError):
        plugins.get_filter_factory("REGEX")
