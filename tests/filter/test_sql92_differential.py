"""Differential test: the compiled closures (fused BETWEEN, n-ary AND/OR, fast paths per operand
type) against a direct interpretation of the parse tree that mirrors RocketMQ's expression
classes one to one (binary AND/OR, BETWEEN as two comparisons), on random expressions and
random messages."""
from hypothesis import given, settings, strategies as st

from rmq_core.errors import FilterExpressionError
from rmq_plugins.filter.sql92 import compile_sql92
from rmq_plugins.filter.sql92.compiler import (
    EvaluationError, java_compare, java_double_compare, parse_java_double,
)
from rmq_plugins.filter.sql92.parser import (
    BOOL, NULL, NUMBER_KINDS, STR, BooleanCast, Between, Compare, Const, In, IsNull, Logic, Negate,
    Not, Prop, StringMatch, parse,
)


def value(node, p):
    """(kind, value) of a value position; value None is Java null."""
    if isinstance(node, Const):
        return node.kind, node.value
    if isinstance(node, Prop):
        return STR, p.get(node.name)
    if isinstance(node, Negate):
        kind, v = value(node.operand, p)
        if v is not None and kind in NUMBER_KINDS:
            return kind, -v
        return NULL, None
    return BOOL, cond(node, p)


def equal(left, right, p):  # ComparisonExpression.doCreateEqual
    (lk, lv), (rk, rv) = value(left, p), value(right, p)
    if (lv is None) != (rv is None):
        return None if lv is None else False
    if lv is None:
        return True
    return java_compare(lk, lv, rk, rv) == 0


def relational(op, left, right, p):  # ComparisonExpression.evaluate
    lk, lv = value(left, p)
    if lv is None:
        return None
    rk, rv = value(right, p)
    if rv is None:
        return None
    if lk == STR and rk == STR:
        c = java_double_compare(parse_java_double(lv), parse_java_double(rv))
    else:
        c = java_compare(lk, lv, rk, rv)
    return {">": c > 0, ">=": c >= 0, "<": c < 0, "<=": c <= 0}[op]


def logic_and(a, b):  # LogicExpression.createAND, lazily evaluated
    lv = a()
    if lv is False:
        return False
    rv = b()
    if rv is False:
        return False
    return None if lv is None or rv is None else True


def logic_or(a, b):
    lv = a()
    if lv is True:
        return True
    rv = b()
    if rv is True:
        return True
    return None if lv is None or rv is None else False


def cond(node, p):
    if isinstance(node, Logic):
        f = logic_and if node.op == "AND" else logic_or
        return f(lambda: cond(node.left, p), lambda: cond(node.right, p))
    if isinstance(node, Not):
        v = cond(node.operand, p)
        return None if v is None else not v
    if isinstance(node, Compare):
        if node.op == "=":
            return equal(node.left, node.right, p)
        return relational(node.op, node.left, node.right, p)
    if isinstance(node, IsNull):
        return value(node.operand, p)[1] is None
    if isinstance(node, Between):
        if node.negated:
            return logic_or(lambda: relational("<", node.operand, node.low, p),
                            lambda: relational(">", node.operand, node.high, p))
        return logic_and(lambda: relational(">=", node.operand, node.low, p),
                         lambda: relational("<=", node.operand, node.high, p))
    if isinstance(node, In):
        kind, v = value(node.operand, p)
        if v is None or kind != STR:
            return None
        return (v in node.values) != node.negated
    if isinstance(node, StringMatch):
        if not node.search:
            return False
        kind, v = value(node.operand, p)
        if v is None or kind != STR:
            return False
        hit = {"CONTAINS": node.search in v, "STARTSWITH": v.startswith(node.search),
               "ENDSWITH": v.endswith(node.search)}[node.op]
        return hit != node.negated
    if isinstance(node, BooleanCast):
        return None if value(node.operand, p)[1] is None else False
    if isinstance(node, Const):
        return node.value
    raise AssertionError(node)


def reference(expression, p):
    try:
        return cond(parse(expression), p)
    except EvaluationError:
        return None


PROPS = ["a", "b", "c"]
VALUES = st.sampled_from(["1", "3", "5", "7", "-2", "2.5", "x", "xy", "abc", "TRUE", "3000000000", " 4", ""])
LITERALS = st.sampled_from(["1", "3", "5", "-2", "2.5", "3000000000", "'x'", "'xy'", "''", "TRUE", "FALSE", "-a"])
OPERANDS = st.one_of(st.sampled_from(PROPS), LITERALS)

leaf = st.one_of(
    st.builds(lambda l, op, r: f"{l} {op} {r}", OPERANDS, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), OPERANDS),
    st.builds(lambda v, lo, hi, n: f"{v} {n}BETWEEN {lo} AND {hi}", st.sampled_from(PROPS), LITERALS, LITERALS,
              st.sampled_from(["", "NOT "])),
    st.builds(lambda v, n, xs: f"{v} {n}IN ({', '.join(xs)})", st.sampled_from(PROPS), st.sampled_from(["", "NOT "]),
              st.lists(st.sampled_from(["'x'", "'1'", "'abc'", "''"]), min_size=1, max_size=6)),
    st.builds(lambda v, n, op, s: f"{v} {n}{op} {s}", OPERANDS, st.sampled_from(["", "NOT "]),
              st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]), st.sampled_from(["'x'", "'b'", "''", "'3'"])),
    st.builds(lambda v, n: f"{v} IS {n}NULL", OPERANDS, st.sampled_from(["", "NOT "])),
    st.sampled_from(PROPS + ["TRUE", "FALSE", "NULL"]),
)
expressions = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(lambda x: f"NOT ({x})", inner),
        st.builds(lambda x, y, op: f"({x}) {op} ({y})", inner, inner, st.sampled_from(["AND", "OR"])),
        st.builds(lambda x, y, z: f"{x} AND {y} OR {z}", inner, inner, inner),
    ),
    max_leaves=6,
)
messages = st.dictionaries(st.sampled_from(PROPS), VALUES)


@settings(max_examples=600, deadline=None)
@given(expressions, st.lists(messages, min_size=1, max_size=4))
def test_compiled_equals_direct_interpretation(expression, props_list):
    try:
        f = compile_sql92(expression)
    except FilterExpressionError:
        return  # refused at parse time, as RocketMQ refuses it
    for p in props_list:
        assert f.evaluate(p) is reference(expression, p), (expression, p)


@settings(max_examples=300, deadline=None)
@given(expressions, messages)
def test_closure_tree_equals_generated_source(expression, props):
    """The fallback for very deep expressions (closures) and the generated function agree."""
    from rmq_plugins.filter.sql92.compiler import compile_node

    try:
        f = compile_sql92(expression)
    except FilterExpressionError:
        return
    assert f.compiled_to == "python source"
    closure = compile_node(parse(expression))
    try:
        expected = closure(props)
    except EvaluationError:
        expected = None
    assert f.evaluate(props) is expected


def test_deep_expression_falls_back_to_closures_and_still_evaluates():
    expression = " AND ".join(f"a{i} = '{i}'" for i in range(150))
    f = compile_sql92(expression)
    assert f.compiled_to == "closures"  # 150 nested ifs exceed Python's indentation limit
    props = {f"a{i}": str(i) for i in range(150)}
    assert f.evaluate(props) is True and f.is_matched_by_commit_log(props)
    props["a149"] = "x"
    assert f.evaluate(props) is False and not f.is_matched_by_commit_log(props)
    assert not f.is_matched_by_commit_log(None)


def test_absurd_nesting_is_a_clear_error():
    import pytest

    with pytest.raises(FilterExpressionError) as ei:
        compile_sql92("(" * 5000 + "a = 1" + ")" * 5000)
    assert "nested too deeply" in str(ei.value)
