"""TAG expressions: hash codes for the consume-queue scan, exact tags for the client re-check."""
import pytest

from rmq_core.errors import FilterExpressionError
from rmq_core.message import java_string_hash
from rmq_core.plugins import get_filter_factory
from rmq_plugins.filter.tag import TagMessageFilter, compile_tag


@pytest.mark.parametrize("expression", ["*", "", "  ", " * ", None])
def test_all(expression):
    f = compile_tag(expression)
    assert f.matches_all and f.tag_codes is None and f.expression == "*"
    assert f.is_matched_by_consume_queue(12345)
    assert f.is_matched_by_tag("x") and f.is_matched_by_tag(None)


def test_tags_are_split_trimmed_and_hashed_like_java():
    f = compile_tag(" TagA ||TagB||  || ")
    assert f.tags == frozenset({"TagA", "TagB"})
    assert f.tag_codes == frozenset({2598919, 2598920})  # "TagA".hashCode(), "TagB".hashCode()
    assert f.is_matched_by_consume_queue(2598919)
    assert not f.is_matched_by_consume_queue(java_string_hash("TagC"))
    assert not f.needs_commit_log_check and f.bloom_bits is None
    assert f.is_matched_by_tag("TagB") and not f.is_matched_by_tag("TagC")
    assert not f.is_matched_by_tag(None)  # a message without a tag never matches a tag list


def test_hash_collision_is_caught_by_the_client_recheck():
    f = compile_tag("Aa")
    assert java_string_hash("BB") == java_string_hash("Aa") == 2112
    assert f.is_matched_by_consume_queue(java_string_hash("BB"))  # the broker cannot tell ...
    assert not f.is_matched_by_tag("BB")  # ... the client can
    assert f.is_matched_by_commit_log({"TAGS": "Aa"}) and not f.is_matched_by_commit_log({"TAGS": "BB"})


def test_non_bmp_tags_hash_over_utf16():
    f = compile_tag("\U0001F600 || \u6d88\u606f")
    assert java_string_hash("\u6d88\u606f") in f.tag_codes
    assert java_string_hash("\U0001F600") in f.tag_codes


@pytest.mark.parametrize("expression", ["||", " || || "])
def test_expression_without_a_tag_is_refused(expression):
    with pytest.raises(FilterExpressionError) as ei:
        compile_tag(expression)
    assert ei.value.expression_type == "TAG" and "no tag" in str(ei.value)


def test_non_string_is_refused():
    with pytest.raises(FilterExpressionError):
        TagMessageFilter(42)


def test_factory_via_plugin_manager():
    factory = get_filter_factory("TAG")
    assert factory("TagA") is factory("TagA")
    assert get_filter_factory(None)("TagA").tags == {"TagA"}  # no type means TAG
