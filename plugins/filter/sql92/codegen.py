"""Compile a parsed SQL92 selector into the source of one Python function.

Same semantics as the closure tree in `compiler.py` (which stays as the fallback for expressions
too deep for Python's parser and as a second implementation the tests compare against), but a
message costs one Python call instead of one per node: property reads, integer conversions and
the three-valued AND/OR become straight-line code with nested `if`s.  Only conversions off the
fast path (signs, Unicode digits, doubles, Booleans) call helpers.

Generated shape for `a BETWEEN 3 AND 5 AND b = 'x'`:

    def matches(p):
        try:
            v1 = p.get('a')
            if v1 is None:
                r1 = None
            else:
                n2 = int(v1) if v1.isdecimal() and len(v1) <= 9 else pint(v1)
                r1 = 3 <= n2 <= 5
            if r1 is False:
                r0 = False
            else:
                v3 = p.get('b')
                ...
        except EvaluationError:
            return False
        return r0 is True
"""
from __future__ import annotations

from typing import Callable

from .javatypes import (
    BOOL, INT, LONG, NULL, NUMBER_KINDS, STR, EvaluationError, java_compare, java_double_compare,
    parse_java_double, parse_java_int, parse_java_long,
)
from .parser import BooleanCast, Between, Compare, Const, In, IsNull, Logic, Negate, Node, Not, Prop, StringMatch

_OPS = {">": ">", ">=": ">=", "<": "<", "<=": "<=", "=": "=="}
# Decimal strings this short always fit the type, so int() alone is Integer/Long.valueOf.
_SAFE_DIGITS = {INT: 9, LONG: 18}
_PARSERS = {INT: "pint", LONG: "plong"}


class _Gen:
    def __init__(self):
        self.lines: list[str] = []
        self.namespace = {
            "EvaluationError": EvaluationError,
            "jcmp": java_compare,
            "dcmp": java_double_compare,
            "pint": parse_java_int,
            "plong": parse_java_long,
            "pdbl": parse_java_double,
        }
        self.n = 0

    def var(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, value) -> str:
        # Literals go into the source (LOAD_CONST); repr() of these types is an exact literal.
        if value is None or isinstance(value, (bool, int, float, str)):
            return f"({value!r})"
        name = self.var("c")
        self.namespace[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    # value positions: (kind, expression text, is_constant)
    def value(self, node: Node, ind: int) -> tuple[str, str, bool]:
        if isinstance(node, Const):
            return node.kind, self.const(node.value), True
        if isinstance(node, Prop):
            v = self.var("v")
            self.emit(ind, f"{v} = p.get({node.name!r})")
            return STR, v, False
        if isinstance(node, Negate):
            kind, text, is_const = self._negated(node)
            return kind, text, is_const
        r = self.var("r")
        self.cond(node, r, ind)
        return BOOL, r, False

    def _negated(self, node: Negate):
        inner = node.operand
        sign = -1
        while isinstance(inner, Negate):
            inner, sign = inner.operand, -sign
        if isinstance(inner, Const) and inner.kind in NUMBER_KINDS:
            return inner.kind, self.const(sign * inner.value), True
        return NULL, "None", True  # negating anything but a number gives null

    @staticmethod
    def is_null(kind: str, text: str, is_const: bool) -> str:
        """A Python test for "this operand is null", folded for constants (no `literal is None`)."""
        if kind == NULL:
            return "True"
        return "False" if is_const else f"{text} is None"

    def int_of(self, kind: str, v: str, ind: int) -> str:
        """Emit `n = Integer/Long.valueOf(v)` with the common case inline; return n's name."""
        n = self.var("n")
        self.emit(ind, f"{n} = int({v}) if {v}.isdecimal() and len({v}) <= {_SAFE_DIGITS[kind]} else {_PARSERS[kind]}({v})")
        return n

    # conditions: emit code assigning True / False / None to `target`
    def cond(self, node: Node, target: str, ind: int) -> None:
        if isinstance(node, Logic):
            self.logic(node, target, ind)
        elif isinstance(node, Not):
            t = self.var("r")
            self.cond(node.operand, t, ind)
            self.emit(ind, f"{target} = None if {t} is None else not {t}")
        elif isinstance(node, Compare):
            if node.op == "=":
                self.equal(node, target, ind)
            else:
                self.relational(node.op, node.left, node.right, target, ind)
        elif isinstance(node, IsNull):
            kind, v, is_const = self.value(node.operand, ind)
            self.emit(ind, f"{target} = {self.is_null(kind, v, is_const)}")
        elif isinstance(node, Between):
            self.between(node, target, ind)
        elif isinstance(node, In):
            kind, v, _ = self.value(node.operand, ind)
            values = self.const(frozenset(node.values))
            test = "not in" if node.negated else "in"
            self.emit(ind, f"{target} = None if {v} is None else {v} {test} {values}")
        elif isinstance(node, StringMatch):
            self.string_match(node, target, ind)
        elif isinstance(node, BooleanCast):
            kind, v, _ = self.value(node.operand, ind)
            self.emit(ind, f"{target} = None if {v} is None else False")
        elif isinstance(node, Const):
            self.emit(ind, f"{target} = {node.value!r}")
        else:  # the parser produces nothing else
            raise TypeError(f"cannot compile {node!r}")

    def logic(self, node: Logic, target: str, ind: int) -> None:
        # Flatten the left-associative chain: same operands evaluated, same result (see compiler.py).
        parts: list[Node] = []
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, Logic) and n.op == node.op:
                stack.append(n.right)
                stack.append(n.left)
            else:
                parts.append(n)
        decisive = "False" if node.op == "AND" else "True"
        names = []
        for part in parts:
            t = self.var("r")
            names.append(t)
            self.cond(part, t, ind)
            self.emit(ind, f"if {t} is {decisive}:")
            self.emit(ind + 1, f"{target} = {decisive}")
            self.emit(ind, "else:")
            ind += 1
        unknown = " or ".join(f"{t} is None" for t in names)
        self.emit(ind, f"{target} = None if {unknown} else {'True' if decisive == 'False' else 'False'}")

    def equal(self, node: Compare, target: str, ind: int) -> None:
        lk, lv, lc = self.value(node.left, ind)
        rk, rv, rc = self.value(node.right, ind)
        ln, rn = self.is_null(lk, lv, lc), self.is_null(rk, rv, rc)
        # null rules of doCreateEqual: null = null TRUE, null = x UNKNOWN, x = null FALSE
        self.emit(ind, f"if {ln} or {rn}:")
        self.emit(ind + 1, f"{target} = True if ({ln}) and ({rn}) else (None if {ln} else False)")
        self.emit(ind, "else:")
        if lk == STR and rk == STR:
            self.emit(ind + 1, f"{target} = {lv} == {rv}")
        elif lk == STR and rk in (INT, LONG) and rc:
            n = self.int_of(rk, lv, ind + 1)
            self.emit(ind + 1, f"{target} = {n} == {rv}")
        else:
            self.emit(ind + 1, f"{target} = jcmp({lk!r}, {lv}, {rk!r}, {rv}) == 0")

    def relational(self, op: str, left: Node, right: Node, target: str, ind: int) -> None:
        lk, lv, lc = self.value(left, ind)
        # RocketMQ reads the right operand only when the left one is not null.
        self.emit(ind, f"if {self.is_null(lk, lv, lc)}:")
        self.emit(ind + 1, f"{target} = None")
        self.emit(ind, "else:")
        ind += 1
        rk, rv, rc = self.value(right, ind)
        self.emit(ind, f"if {self.is_null(rk, rv, rc)}:")
        self.emit(ind + 1, f"{target} = None")
        self.emit(ind, "else:")
        ind += 1
        pyop = _OPS[op]
        if lk == STR and rk == STR:
            self.emit(ind, f"{target} = dcmp(pdbl({lv}), pdbl({rv})) {pyop} 0")
        elif lk == STR and rk in (INT, LONG) and rc:
            n = self.int_of(rk, lv, ind)
            self.emit(ind, f"{target} = {n} {pyop} {rv}")
        elif lk in (INT, LONG) and rk == STR and not rc:
            n = self.int_of(lk, rv, ind)
            self.emit(ind, f"{target} = {lv} {pyop} {n}")
        else:
            self.emit(ind, f"{target} = jcmp({lk!r}, {lv}, {rk!r}, {rv}) {pyop} 0")

    def between(self, node: Between, target: str, ind: int) -> None:
        low, high = node.low, node.high
        if (
            isinstance(node.operand, Prop) and isinstance(low, Const) and isinstance(high, Const)
            and low.kind in (INT, LONG) and low.kind == high.kind
        ):
            # Fused `prop BETWEEN lo AND hi` (see compiler.py for why it equals the two halves).
            kind, v, _ = self.value(node.operand, ind)
            self.emit(ind, f"if {v} is None:")
            self.emit(ind + 1, f"{target} = None")
            self.emit(ind, "else:")
            n = self.int_of(low.kind, v, ind + 1)
            lo, hi = self.const(low.value), self.const(high.value)
            if node.negated:
                self.emit(ind + 1, f"{target} = {n} < {lo} or {n} > {hi}")
            else:
                self.emit(ind + 1, f"{target} = {lo} <= {n} <= {hi}")
            return
        first, second = (("<", low), (">", high)) if node.negated else ((">=", low), ("<=", high))
        decisive = "True" if node.negated else "False"
        t1, t2 = self.var("r"), self.var("r")
        self.relational(first[0], node.operand, first[1], t1, ind)
        self.emit(ind, f"if {t1} is {decisive}:")
        self.emit(ind + 1, f"{target} = {decisive}")
        self.emit(ind, "else:")
        self.relational(second[0], node.operand, second[1], t2, ind + 1)
        other = "False" if decisive == "True" else "True"
        self.emit(ind + 1, f"{target} = {decisive} if {t2} is {decisive} else (None if {t1} is None or {t2} is None else {other})")

    def string_match(self, node: StringMatch, target: str, ind: int) -> None:
        if not node.search:
            self.emit(ind, f"{target} = False")  # an empty search string never matches
            return
        kind, v, is_const = self.value(node.operand, ind)
        if kind != STR:
            self.emit(ind, f"{target} = False")  # not a String: FALSE
            return
        s = self.const(node.search)
        test = {"CONTAINS": f"{s} in {v}", "STARTSWITH": f"{v}.startswith({s})", "ENDSWITH": f"{v}.endswith({s})"}[node.op]
        if node.negated:
            test = f"not ({test})"
        self.emit(ind, f"{target} = False if {self.is_null(kind, v, is_const)} else {test}")


def generate(node: Node) -> tuple[str, dict]:
    """Source of `evaluate(p)` (True/False/None, may raise) and `matches(p)` (bool), and its globals."""
    g = _Gen()
    g.cond(node, "r0", 2)
    body = g.lines
    src = ["def evaluate(p):", "    if p is None:", "        p = {}", "    if True:", *body, "    return r0", "",
           "def matches(p):", "    if p is None:", "        p = {}", "    try:", *body, "    except EvaluationError:", "        return False",
           "    return r0 is True", ""]
    return "\n".join(src), g.namespace


def compile_functions(node: Node, name: str = "<sql92>") -> tuple[Callable, Callable]:
    """(evaluate, matches) for a parsed selector; raises SyntaxError/RecursionError if too deep."""
    source, namespace = generate(node)
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - our own generated source
    return namespace["evaluate"], namespace["matches"]
