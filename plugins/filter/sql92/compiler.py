"""Compile a parsed SQL92 selector into a tree of closures that evaluates RocketMQ's way.

Values follow the Java objects RocketMQ's evaluator sees: properties are Strings (or null when
absent), literals are Integer / Long / Double / String / Boolean, conditions are Boolean or null.
The rules, from ComparisonExpression, LogicExpression and UnaryExpression (4.9.7, 5.x):

- `=`: null on the left and a value on the right is UNKNOWN (null); a value on the left and null on
  the right is FALSE; null = null is TRUE.  Otherwise the two values are compared after RocketMQ's
  type conversion: a String meeting an Integer literal is parsed with Integer.valueOf, a Long
  literal with Long.valueOf, a Double literal with Double.valueOf, a Boolean with
  Boolean.valueOf; numbers widen (int -> long -> double).  Unrelated types compare as "less".
- `>`, `>=`, `<`, `<=`: UNKNOWN if either side is null; two Strings are both parsed as doubles.
- A conversion that fails (`a > 5` with a = 'abc', or a = '4.5' against the Integer 5) throws in
  RocketMQ; the broker catches it around the *whole* expression and does not deliver the message.
  Here it raises EvaluationError, caught in the same place, with the same result.
- AND / OR / NOT use three-valued logic with left-to-right short circuits; a message is delivered
  only when the whole expression is TRUE.
- IN / NOT IN: UNKNOWN when the property is absent.  CONTAINS / STARTSWITH / ENDSWITH and their
  NOT forms are FALSE (not UNKNOWN) when the property is absent or the search string is empty.

Everything is resolved once at compile time (literal kinds, operator, the specialised closure for
the operand types), so evaluating a message is a handful of Python calls, never a re-parse.
`codegen.py` turns the same tree into one generated function (one call per message) and is what
filters use; this closure tree is the fallback for expressions too deeply nested for Python's
parser, and the tests hold the two against each other.
"""
from __future__ import annotations

import operator
from typing import Callable, Mapping

from .javatypes import (
    BOOL, INT, LONG, NULL, NUMBER_KINDS, STR, EvaluationError, java_compare, java_double_compare,
    parse_java_double, parse_java_int, parse_java_long,
)
from .parser import BooleanCast, Between, Compare, Const, In, IsNull, Logic, Negate, Node, Not, Prop, StringMatch

__all__ = ["EvaluationError", "compile_node", "property_names", "java_compare", "java_double_compare",
           "parse_java_double", "parse_java_int", "parse_java_long"]

Evaluator = Callable[[Mapping[str, str]], "bool | None"]


_RELATIONAL_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "=": operator.eq}


# --- operands ---------------------------------------------------------------------------------------
class _Operand:
    """A value position: its static kind and how to get its (possibly null) value."""

    __slots__ = ("kind", "const", "name", "fn")

    def __init__(self, kind: str, const=None, name: str | None = None, fn: Evaluator | None = None):
        self.kind = kind  # INT/LONG/DOUBLE/STR/BOOL, or NULL for "always null"
        self.const = const  # the value when constant (fn and name are None)
        self.name = name  # the property name for a property (kind STR)
        self.fn = fn  # the evaluator for a condition (kind BOOL)

    @property
    def is_constant(self) -> bool:
        return self.name is None and self.fn is None

    def getter(self) -> Callable:
        if self.name is not None:
            name = self.name
            return lambda p: p.get(name)
        if self.fn is not None:
            return self.fn
        c = self.const
        return lambda p: c


def _operand(node: Node) -> _Operand:
    if isinstance(node, Const):
        return _Operand(node.kind, node.value)
    if isinstance(node, Prop):
        return _Operand(STR, name=node.name)
    if isinstance(node, Negate):
        inner = _operand(node.operand)
        # UnaryExpression.createNegate: numbers are negated, anything else becomes null.
        if inner.is_constant and inner.kind in NUMBER_KINDS:
            return _Operand(inner.kind, -inner.const)
        return _Operand(NULL, None)
    return _Operand(BOOL, fn=_compile(node))


# --- comparisons ------------------------------------------------------------------------------------
def _compile_equal(left: _Operand, right: _Operand) -> Evaluator:
    lk, rk = left.kind, right.kind
    if left.name is not None and right.is_constant and rk == STR:
        name, c = left.name, right.const

        def prop_eq_str(p):
            v = p.get(name)
            return None if v is None else v == c

        return prop_eq_str
    if left.name is not None and right.is_constant and rk in NUMBER_KINDS:
        name, c = left.name, right.const

        def prop_eq_number(p):
            v = p.get(name)
            return None if v is None else java_compare(STR, v, rk, c) == 0

        return prop_eq_number
    lget, rget = left.getter(), right.getter()

    def equal(p):
        lv = lget(p)
        rv = rget(p)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        return java_compare(lk, lv, rk, rv) == 0

    return equal


def _compile_relational(op: str, left: _Operand, right: _Operand) -> Evaluator:
    test = _RELATIONAL_OPS[op]
    lk, rk = left.kind, right.kind
    if left.name is not None and right.is_constant and rk in (INT, LONG):
        name, c = left.name, right.const
        parse = parse_java_int if rk == INT else parse_java_long

        def prop_vs_integer(p):
            v = p.get(name)
            return None if v is None else test(parse(v), c)

        return prop_vs_integer
    lget, rget = left.getter(), right.getter()

    def relational(p):
        lv, rv = lget(p), rget(p)  # (reads without side effects: both, then the null check)
        if lv is None or rv is None:
            return None
        if lk == STR and rk == STR:  # two Strings: RocketMQ compares them as doubles
            return test(java_double_compare(parse_java_double(lv), parse_java_double(rv)), 0)
        return test(java_compare(lk, lv, rk, rv), 0)

    return relational


def _compile_between(node: Between) -> Evaluator:
    value, low, high = _operand(node.operand), _operand(node.low), _operand(node.high)
    if (
        value.name is not None and low.is_constant and high.is_constant
        and low.kind in (INT, LONG) and low.kind == high.kind
    ):
        # Fast path for the usual `prop BETWEEN 3 AND 5`: the property is read and converted once.
        # Same result as RocketMQ's (v >= low AND v <= high): both sides null together, and the
        # conversion that would throw is the first thing either side does.
        name, lo, hi = value.name, low.const, high.const
        parse = parse_java_int if low.kind == INT else parse_java_long
        if node.negated:

            def prop_not_between(p):
                v = p.get(name)
                if v is None:
                    return None
                n = parse(v)
                return n < lo or n > hi

            return prop_not_between

        def prop_between(p):
            v = p.get(name)
            if v is None:
                return None
            n = parse(v)
            return lo <= n <= hi

        return prop_between
    if node.negated:
        first, second = _compile_relational("<", value, low), _compile_relational(">", value, high)
        return _compile_logic([first, second], decisive=True)
    first, second = _compile_relational(">=", value, low), _compile_relational("<=", value, high)
    return _compile_logic([first, second], decisive=False)


# --- logic ------------------------------------------------------------------------------------------
def _flatten(node: Node, op: str, out: list) -> list:
    # AND/OR chains are left-associative in RocketMQ; evaluating them as one n-ary node in the same
    # order gives the same result and evaluates the same operands (each stops at the first
    # deciding value).
    if isinstance(node, Logic) and node.op == op:
        _flatten(node.left, op, out)
        _flatten(node.right, op, out)
    else:
        out.append(_compile(node))
    return out


def _compile_logic(fns: list, decisive: bool) -> Evaluator:
    """AND (decisive=False: one False decides) or OR (decisive=True: one True decides), with
    SQL's three-valued logic: otherwise an unknown (None) operand makes the result unknown."""
    other = not decisive
    if len(fns) == 2:
        a, b = fns

        def logic2(p):
            lv = a(p)
            if lv is decisive:
                return decisive
            rv = b(p)
            if rv is decisive:
                return decisive
            if lv is None or rv is None:
                return None
            return other

        return logic2

    def logic_n(p):
        unknown = False
        for f in fns:
            v = f(p)
            if v is decisive:
                return decisive
            if v is None:
                unknown = True
        return None if unknown else other

    return logic_n


# --- nodes ------------------------------------------------------------------------------------------
def _compile(node: Node) -> Evaluator:
    if isinstance(node, Logic):
        fns = _flatten(node, node.op, [])
        return _compile_logic(fns, decisive=node.op != "AND")
    if isinstance(node, Not):
        inner = _compile(node.operand)

        def not_(p):
            v = inner(p)
            return None if v is None else not v

        return not_
    if isinstance(node, Compare):
        left, right = _operand(node.left), _operand(node.right)
        if node.op == "=":
            return _compile_equal(left, right)
        return _compile_relational(node.op, left, right)
    if isinstance(node, IsNull):
        get = _operand(node.operand).getter()
        return lambda p: get(p) is None
    if isinstance(node, Between):
        return _compile_between(node)
    if isinstance(node, In):
        name, values, negated = node.operand.name, frozenset(node.values), node.negated

        def in_(p):
            v = p.get(name)
            return None if v is None else (v in values) != negated

        return in_
    if isinstance(node, StringMatch):
        return _compile_string_match(node)
    if isinstance(node, BooleanCast):
        name = node.operand.name
        # A property value is a String, never a Boolean: RocketMQ's cast gives FALSE (or null).
        return lambda p: None if p.get(name) is None else False
    if isinstance(node, Const):
        c = node.value  # TRUE, FALSE or NULL (the parser only lets boolean constants get here)
        return lambda p: c
    raise TypeError(f"cannot compile {node!r}")  # the parser never produces anything else


def _compile_string_match(node: StringMatch) -> Evaluator:
    search, negated = node.search, node.negated
    if not search:
        return lambda p: False  # RocketMQ: an empty search string never matches, NOT or not
    operand = _operand(node.operand)
    if operand.kind != STR:
        return lambda p: False  # numbers, conditions and nulls are not Strings: FALSE
    get = operand.getter()
    test = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}[node.op]

    def string_match(p):
        v = get(p)
        if v is None:
            return False
        return test(v, search) != negated

    return string_match


def compile_node(node: Node) -> Evaluator:
    """The evaluator of a parsed selector: props -> True / False / None (UNKNOWN).

    It may raise EvaluationError, which callers turn into "not matched" as RocketMQ does."""
    return _compile(node)


def property_names(node: Node) -> frozenset:
    """Every property an expression reads (for diagnostics and for callers that decode lazily)."""
    out = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Prop):
            out.add(n.name)
        for attr in ("left", "right", "operand", "low", "high"):
            child = getattr(n, attr, None)
            if isinstance(child, Node):
                stack.append(child)
    return frozenset(out)
