"""Property tests of the SQL92 compiler: numbers, three-valued logic, robustness on any input."""
import operator

from hypothesis import given, settings, strategies as st

from rmq_core.errors import FilterExpressionError
from rmq_plugins.filter.sql92 import compile_sql92
from rmq_plugins.filter.sql92.compiler import java_double_compare, parse_java_double, parse_java_int

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "=": operator.eq}


def literal(n: int) -> str:
    return str(n) if n >= 0 else f"-{-n}"  # the grammar has no negative literal: unary minus


@given(x=INT32, y=INT32, op=st.sampled_from(sorted(OPS)))
def test_integer_comparison_matches_python(x, y, op):
    f = compile_sql92(f"a {op} {literal(y)}")
    assert f.evaluate({"a": str(x)}) is OPS[op](x, y)
    assert f.evaluate({}) is None


@given(x=INT32, lo=INT32, hi=INT32)
def test_between_is_inclusive_range(x, lo, hi):
    lo, hi = min(lo, hi), max(lo, hi)
    f = compile_sql92(f"a BETWEEN {literal(lo)} AND {literal(hi)}")
    g = compile_sql92(f"a NOT BETWEEN {literal(lo)} AND {literal(hi)}")
    assert f.evaluate({"a": str(x)}) is (lo <= x <= hi)
    assert g.evaluate({"a": str(x)}) is not (lo <= x <= hi)


@given(x=st.floats(allow_nan=False, allow_infinity=False, width=64), y=st.floats(min_value=1e-300, max_value=1e300))
def test_double_comparison_matches_python(x, y):
    f = compile_sql92(f"a > {y!r}")
    assert f.evaluate({"a": repr(x)}) is (x > y)


@given(st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_java_double_round_trip(x):
    text = repr(x).replace("inf", "Infinity").replace("nan", "NaN")
    y = parse_java_double(text)
    assert java_double_compare(x, y) == 0


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_java_int_round_trip(n):
    assert parse_java_int(str(n)) == n


# --- three-valued logic against a reference (Kleene logic, as RocketMQ's LogicExpression) ------------
LEAVES = {"t": ("t = '1'", True), "f": ("f = '1'", False), "u": ("u = '1'", None)}
PROPS = {"t": "1", "f": "0"}  # u is absent


def k_and(a, b):
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def k_or(a, b):
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def k_not(a):
    return None if a is None else not a


trees = st.recursive(
    st.sampled_from(sorted(LEAVES)),
    lambda children: st.one_of(
        st.tuples(st.just("NOT"), children),
        st.tuples(st.sampled_from(["AND", "OR"]), children, children),
    ),
    max_leaves=12,
)


def render(tree) -> tuple[str, object]:
    """Text with explicit parentheses, and the reference value."""
    if isinstance(tree, str):
        return LEAVES[tree]
    if tree[0] == "NOT":
        text, value = render(tree[1])
        return f"NOT ({text})", k_not(value)
    lt, lv = render(tree[1])
    rt, rv = render(tree[2])
    value = k_and(lv, rv) if tree[0] == "AND" else k_or(lv, rv)
    return f"({lt}) {tree[0]} ({rt})", value


def render_minimal(tree, parent: int = 0) -> str:
    """Text with only the parentheses precedence needs (OR=1 < AND=2 < NOT=3)."""
    if isinstance(tree, str):
        return LEAVES[tree][0]
    if tree[0] == "NOT":
        return f"NOT ({render_minimal(tree[1])})"
    prec = 1 if tree[0] == "OR" else 2
    # left-associative: the right operand needs parentheses at equal precedence
    text = f"{render_minimal(tree[1], prec)} {tree[0]} {render_minimal(tree[2], prec + 1)}"
    return f"({text})" if prec < parent else text


@settings(max_examples=300)
@given(trees)
def test_logic_is_kleene_and_precedence_is_or_below_and(tree):
    text, expected = render(tree)
    assert compile_sql92(text).evaluate(PROPS) is expected
    assert compile_sql92(render_minimal(tree)).evaluate(PROPS) is expected


# --- robustness --------------------------------------------------------------------------------------
ALPHABET = st.sampled_from(
    list("ab_$019.'()<>=,+-*/ \n") + ["AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "TRUE",
                                      "CONTAINS", "STARTSWITH", "ENDSWITH", "--", "/*", "*/", "1e5", "''"]
)


@settings(max_examples=400)
@given(st.lists(ALPHABET, max_size=14).map(" ".join), st.dictionaries(st.sampled_from(["a", "b"]), st.text(max_size=6)))
def test_any_text_compiles_or_fails_cleanly_and_never_crashes_evaluation(expression, props):
    try:
        f = compile_sql92(expression)
    except FilterExpressionError as e:
        assert 0 <= e.position <= len(expression)
        return
    assert f.evaluate(props) in (True, False, None)
    assert f.is_matched_by_commit_log(props) in (True, False)


@given(st.text(max_size=40))
def test_arbitrary_unicode_never_raises_anything_but_filter_errors(expression):
    try:
        compile_sql92(expression)
    except FilterExpressionError as e:
        assert 0 <= e.position <= len(expression)


@given(st.text(max_size=20))
def test_string_literal_escaping_round_trips(value):
    quoted = "'" + value.replace("'", "''") + "'"
    assert compile_sql92(f"a = {quoted}").evaluate({"a": value}) is True
