"""SQL92 selector: truth tables against RocketMQ's evaluator semantics, and malformed expressions.

Expected values are what RocketMQ 4.9.7 / 5.x computes (SelectorParser.jj, ComparisonExpression,
LogicExpression, UnaryExpression): True, False, or None for UNKNOWN (null) — which includes the
cases where RocketMQ's evaluator throws (the broker then does not deliver the message).
"""
import pytest

from rmq_core.errors import FilterExpressionError
from rmq_core.plugins import get_filter_factory
from rmq_plugins.filter.sql92 import Sql92MessageFilter, compile_sql92

T, F, U = True, False, None

TABLE = [
    # --- numbers: a property is converted to the literal's Java type --------------------------
    ("a > 5", {"a": "6"}, T),
    ("a > 5", {"a": "5"}, F),
    ("a > 5", {}, U),  # missing property: UNKNOWN, not delivered
    ("a > 5", {"a": "abc"}, U),  # Integer.valueOf throws
    ("a > 5", {"a": "5.5"}, U),  # an Integer literal parses the property as an Integer
    ("a > 5", {"a": "1_000"}, U),  # Java has no digit separators
    ("a > 5", {"a": " 6"}, U),  # Integer.valueOf does not trim
    ("a > 5.0", {"a": "5.5"}, T),
    ("a > 5.0", {"a": " 6 "}, T),  # Double.valueOf trims
    ("a > 5.0", {"a": "1e1"}, T),
    ("a > 5.0", {"a": "6d"}, T),  # Java float suffixes
    ("a > 5.0", {"a": "0x1p3"}, T),  # hex float 8.0
    ("a > 5.0", {"a": "NaN"}, T),  # Double.compareTo puts NaN above everything
    ("a > 5.0", {"a": "Infinity"}, T),
    ("a > 5.0", {"a": "inf"}, U),  # Python spellings are not Java's
    ("a < .5", {"a": "0.25"}, T),
    ("a > 1e2", {"a": "101"}, T),
    ("a > 1.5E+1", {"a": "16"}, T),
    ("a = 5", {"a": "5"}, T),
    ("a = 5", {"a": "05"}, T),
    ("a = 5", {"a": "+5"}, T),
    ("a = 5", {"a": "5.0"}, U),
    ("a = 5", {"a": "\u0665"}, T),  # Character.digit accepts any Unicode decimal digit
    ("a = 5L", {"a": "5"}, T),
    ("a = 3000000000", {"a": "3000000000"}, T),  # a Long literal: Long.valueOf
    ("a = 5", {"a": "3000000000"}, U),  # out of Integer range
    ("a = 10.0", {"a": "1e1"}, T),
    ("a >= -5", {"a": "-5"}, T),
    ("a < -1.5", {"a": "-2"}, T),
    ("a <= - -3", {"a": "3"}, T),
    ("-a > 5", {"a": "10"}, U),  # negating a String gives null
    ("a = -b", {"a": "1", "b": "1"}, F),  # value = null is FALSE
    ("a > b", {"a": "10", "b": "9"}, T),  # two Strings compare as doubles, not as text
    ("a > b", {"a": "x", "b": "9"}, U),
    ("5 > 3", {}, T),
    ("3 < 2.5", {}, F),
    # --- BETWEEN -------------------------------------------------------------------------------
    ("a BETWEEN 3 AND 5", {"a": "3"}, T),
    ("a BETWEEN 3 AND 5", {"a": "5"}, T),
    ("a BETWEEN 3 AND 5", {"a": "6"}, F),
    ("a BETWEEN 3 AND 5", {"a": "2"}, F),
    ("a BETWEEN 3 AND 5", {}, U),
    ("a BETWEEN 3 AND 5", {"a": "4.5"}, U),
    ("a BETWEEN 3 AND 5.5", {"a": "4"}, T),
    ("a BETWEEN 3 AND 5.5", {"a": "5.5"}, U),  # the `>= 3` half parses it as an Integer
    ("a BETWEEN 1 AND 3000000000", {"a": "2000000000"}, T),
    ("a BETWEEN 1 AND 3000000000", {"a": "2500000000"}, U),
    ("a BETWEEN -5 AND -10", {"a": "-7"}, F),  # negated bounds are not constants: no order check
    ("a NOT BETWEEN 3 AND 5", {"a": "6"}, T),
    ("a NOT BETWEEN 3 AND 5", {"a": "4"}, F),
    ("a NOT BETWEEN 3 AND 5", {}, U),
    ("a BETWEEN 3 AND 3", {"a": "3"}, T),
    # --- equality, null semantics ------------------------------------------------------------
    ("a = 'x'", {"a": "x"}, T),
    ("a = 'x'", {"a": "X"}, F),
    ("a = 'x'", {}, U),
    ("'x' = a", {}, F),  # RocketMQ: value = null is FALSE, null = value is UNKNOWN
    ("'x' <> a", {}, T),
    ("a <> 'x'", {}, U),
    ("a <> 'x'", {"a": "y"}, T),
    ("a <> 'x'", {"a": "x"}, F),
    ("a = b", {}, T),  # null = null is TRUE in RocketMQ's evaluator
    ("a = b", {"a": "x"}, F),
    ("a = b", {"b": "x"}, U),
    ("a = b", {"a": "x", "b": "x"}, T),
    ("a = 'it''s'", {"a": "it's"}, T),
    ("a = ''''", {"a": "'"}, T),
    ("a = ''", {"a": ""}, T),
    ("a = '\u6d88\u606f'", {"a": "\u6d88\u606f"}, T),
    ("a IS NULL", {}, T),
    ("a IS NULL", {"a": ""}, F),
    ("a IS NOT NULL", {"a": ""}, T),
    ("a IS NOT NULL", {}, F),
    # --- booleans ------------------------------------------------------------------------------
    ("TRUE", {}, T),
    ("FALSE", {}, F),
    ("NULL", {}, U),
    ("a = TRUE", {"a": "TRUE"}, T),  # Boolean.valueOf, case-insensitive
    ("a = TRUE", {"a": "yes"}, F),
    ("a <> TRUE", {"a": "false"}, T),
    ("TRUE = a", {"a": "true"}, U),  # RocketMQ casts the Boolean to String and throws
    ("'x' = TRUE", {}, F),
    ("5 = (a = 'x')", {"a": "x"}, F),  # unrelated types compare as "less"
    ("5 <> (a = 'x')", {"a": "x"}, T),
    ("a", {"a": "true"}, F),  # a bare property is cast to Boolean: a String is never one
    ("a", {}, U),
    ("NOT a", {"a": "x"}, T),
    # --- IN ------------------------------------------------------------------------------------
    ("a IN ('x', 'y')", {"a": "x"}, T),
    ("a IN ('x', 'y')", {"a": "z"}, F),
    ("a IN ('x', 'y')", {}, U),
    ("a IN ('a', 'b', 'c', 'd', 'e', 'f')", {"a": "f"}, T),
    ("a NOT IN ('x')", {"a": "y"}, T),
    ("a NOT IN ('x')", {"a": "x"}, F),
    ("a NOT IN ('x')", {}, U),
    ("TAGS IN ('TagA', 'TagB') AND a BETWEEN 0 AND 3", {"TAGS": "TagB", "a": "0"}, T),
    # --- CONTAINS / STARTSWITH / ENDSWITH (5.x) -----------------------------------------------
    ("a CONTAINS 'bc'", {"a": "abcd"}, T),
    ("a CONTAINS 'bc'", {"a": "xyz"}, F),
    ("a CONTAINS 'bc'", {}, F),  # FALSE, not UNKNOWN
    ("a NOT CONTAINS 'bc'", {}, F),
    ("a NOT CONTAINS 'bc'", {"a": "xyz"}, T),
    ("NOT (a CONTAINS 'x')", {}, T),
    ("a CONTAINS ''", {"a": "x"}, F),  # an empty search string never matches ...
    ("a NOT CONTAINS ''", {"a": "x"}, F),  # ... not even negated
    ("a STARTSWITH 'ab'", {"a": "abc"}, T),
    ("a STARTSWITH 'ab'", {"a": "cab"}, F),
    ("a NOT STARTSWITH 'ab'", {"a": "xab"}, T),
    ("a ENDSWITH 'bc'", {"a": "abc"}, T),
    ("a NOT ENDSWITH 'c'", {"a": "abc"}, F),
    ("a ENDSWITH 'c'", {}, F),
    ("5 CONTAINS '5'", {}, F),  # a number is not a String
    ("'abc' CONTAINS 'b'", {}, T),
    ("a contains 'b' and a startswith 'a' and a endswith 'c'", {"a": "abc"}, T),
    # --- three-valued logic and precedence -------------------------------------------------------
    ("a = 1 AND b = 2", {"a": "1"}, U),
    ("a = 1 AND b = 2", {"a": "2"}, F),
    ("a = 1 OR b = 2", {"a": "1"}, T),
    ("a = 1 OR b = 2", {"a": "2"}, U),
    ("a = 1 OR b = 2", {"a": "2", "b": "3"}, F),
    ("TRUE OR a = 1", {}, T),
    ("FALSE AND a = 1", {}, F),
    ("NULL OR TRUE", {}, T),
    ("NULL AND FALSE", {}, F),
    ("NOT NULL", {}, U),
    ("a = '1' OR b = '1' AND c = '1'", {"a": "1", "b": "0", "c": "0"}, T),  # AND binds tighter
    ("(a = '1' OR b = '1') AND c = '1'", {"a": "1", "b": "0", "c": "0"}, F),
    ("NOT (a = 'x')", {"a": "y"}, T),
    ("NOT (a = 'x')", {}, U),
    ("NOT a = 'x'", {"a": "x"}, U),  # NOT binds tighter than '=': (NOT a) = 'x' throws
    ("NOT a = 'x'", {}, U),
    ("NOT NOT (a = 'x')", {"a": "x"}, T),
    # NOT binds tighter than IS: (NOT b) IS NULL, i.e. "b is absent", not "b is present"
    ("a = 'x' AND NOT b IS NULL", {"a": "x", "b": "1"}, F),
    ("a = 'x' AND NOT b IS NULL", {"a": "x"}, T),
    # an evaluation error anywhere fails the whole expression (RocketMQ catches it at the top) ...
    ("a > 5 OR b = 'x'", {"a": "abc", "b": "x"}, U),
    ("a > 5 OR b = 'x'", {"b": "x"}, T),
    # ... unless a short circuit never reaches it
    ("b = 'x' OR a > 5", {"a": "abc", "b": "x"}, T),
    ("b = 'y' AND a > 5", {"a": "abc", "b": "x"}, F),
    # --- lexical details -------------------------------------------------------------------------
    ("a between 3 and 5 AnD b Is NoT nUlL", {"a": "4", "b": "x"}, T),
    ("a = 1 /* comment */ AND b = 2", {"a": "1", "b": "2"}, T),
    ("a = 1 -- comment\n AND b = 2", {"a": "1", "b": "2"}, T),
    ("$x_1 = 'v'", {"$x_1": "v"}, T),
    ("notes = 'n'", {"notes": "n"}, T),  # longest match: an identifier, not NOT
    ("\ta\r\n=\f'x'", {"a": "x"}, T),
    ("+a > +5", {"a": "6"}, T),
]


@pytest.mark.parametrize("expression,props,expected", TABLE)
def test_truth_table(expression, props, expected):
    f = compile_sql92(expression)
    assert f.evaluate(props) is expected
    assert f.is_matched_by_commit_log(props) is (expected is True)


ERRORS = [
    # expression, position, words the reason must contain
    ("", 0, "empty"),
    ("   ", 0, "empty"),
    ("a = ", 4, "expected a value"),
    ("(a = 1", 6, "expected ')'"),
    ("((a = 1) AND (b = 2)", 20, "expected ')'"),
    ("a = 1)", 5, "expected AND, OR"),
    ("a = 1 b", 6, "expected AND, OR"),
    ("a = 1 -- no line end", 6, "expected AND, OR"),  # without a line end '--' is two minus signs
    ("a > 'x'", 4, "cannot be compared"),
    ("'x' < a", 0, "cannot be compared"),
    ("a > TRUE", 4, "cannot be compared"),
    ("a > NULL", 4, "cannot be compared"),
    ("a > (b = 1)", 7, "condition cannot be compared"),
    ("a = NULL", 4, "IS NULL"),
    ("NULL = a", 0, "IS NULL"),
    ("TRUE = 'x'", 0, "cannot be compared"),
    ("a BETWEEN 5 AND 3", 2, "out of order"),
    ("a BETWEEN 'x' AND 'a'", 2, "out of order"),
    ("a BETWEEN 'a' AND 'x'", 10, "cannot be compared"),
    ("a BETWEEN NULL AND 3", 2, "cannot be NULL"),
    ("a BETWEEN 3 5", 12, "expected AND"),
    ("a IN ()", 6, "expected a string literal"),
    ("a IN ('x'", 9, "expected ')'"),
    ("a IN 'x'", 5, "expected '('"),
    ("a IN ('x', 1)", 11, "expected a string literal"),
    ("5 IN ('x')", 2, "IN needs a property"),
    ("a IS 5", 5, "expected NULL or NOT NULL"),
    ("'abc'", 0, "expected a condition"),
    ("5", 0, "expected a condition"),
    ("5 AND a = 1", 0, "expected a condition"),
    ("a = 1 OR 'x'", 9, "expected a condition"),
    ("NOT 5", 4, "expected a condition"),
    ("a = 'x", 4, "unterminated string"),
    ("a = 1 # x", 6, "unexpected character '#'"),
    ("a != 1", 2, "'<>'"),
    ('a = "x"', 4, "single quotes"),
    ("a.b = 1", 1, "unexpected character '.'"),
    ("a = 99999999999999999999", 4, "out of range"),
    ("a > 1e999", 4, "greater than"),
    ("a > 0.0", 4, "4.9E-324"),
    ("a = 1 /* x", 6, "unterminated comment"),
    ("a CONTAINS 5", 11, "expected a string literal"),
    ("a NOT LIKE 'x'", 2, "expected AND, OR"),
    ("0x1F = a", 1, "expected AND, OR"),  # hex literals were removed: 0 then the identifier x1F
    ("a = 007", 5, "expected AND, OR"),  # so were octal ones
    ("a = 5L5", 6, "expected AND, OR"),
    ("AND = 1", 0, "expected a value"),  # keywords are reserved
]


@pytest.mark.parametrize("expression,position,words", ERRORS)
def test_malformed_expression_names_position(expression, position, words):
    with pytest.raises(FilterExpressionError) as ei:
        compile_sql92(expression)
    err = ei.value
    assert err.position == position, str(err)
    assert words in err.reason, str(err)
    assert err.expression == expression
    assert err.expression_type == "SQL92"
    assert f"at position {position}" in str(err)


def test_error_message_is_readable():
    with pytest.raises(FilterExpressionError) as ei:
        compile_sql92("(a = 1")
    assert str(ei.value) == (
        "bad SQL92 expression '(a = 1' at position 6: expected ')' to close the '(' at position 0 "
        "but found end of expression"
    )


def test_non_string_expression_is_refused():
    with pytest.raises(FilterExpressionError):
        compile_sql92(None)


def test_factory_comes_from_the_plugin_manager_and_compiles_once():
    factory = get_filter_factory("sql92")  # names are case-insensitive
    f1 = factory("a BETWEEN 3 AND 5 AND b = 'x'")
    f2 = factory("a BETWEEN 3 AND 5 AND b = 'x'")
    assert isinstance(f1, Sql92MessageFilter)
    assert f1 is f2  # cached, like RocketMQ's parse cache
    assert f1.needs_commit_log_check and f1.tag_codes is None and f1.bloom_bits is None
    assert f1.expression_type == "SQL92"
    assert f1.property_names == frozenset({"a", "b"})
    assert f1.is_matched_by_tag("anything") and f1.is_matched_by_tag(None)


def test_none_properties_are_an_empty_map():
    assert compile_sql92("a IS NULL").is_matched_by_commit_log(None)


def test_base_consume_queue_test_passes_everything_for_sql92():
    f = compile_sql92("a = 1")
    assert f.is_matched_by_consume_queue(12345, None)
    assert f.is_matched_by_consume_queue(0, b"\x00" * 8)
