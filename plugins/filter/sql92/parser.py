"""Recursive-descent parser for RocketMQ's SQL92 selector grammar, with RocketMQ's parse-time checks.

Grammar (SelectorParser.jj; lowest precedence first):

    selector    := or_expr EOF
    or_expr     := and_expr (OR and_expr)*
    and_expr    := equality (AND equality)*
    equality    := comparison ('=' comparison | '<>' comparison | IS NULL | IS NOT NULL)*
    comparison  := unary ( ('>' | '>=' | '<' | '<=') unary
                         | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string
                         | [NOT] BETWEEN unary AND unary
                         | [NOT] IN '(' string (',' string)* ')' )*
    unary       := '+' unary | '-' unary | NOT unary | primary
    primary     := literal | identifier | '(' or_expr ')'

Note that NOT is a *unary* operator binding tighter than comparisons, exactly as in RocketMQ (and
ActiveMQ, where the grammar comes from): `NOT a = 'x'` means `(NOT a) = 'x'`.  Write
`NOT (a = 'x')` or `a <> 'x'`.  RocketMQ's grammar has no EOF rule, so a Java broker silently
ignores trailing tokens (`a = 1 b` filters by `a = 1`); we reject them instead, because a silently
shortened subscription delivers the wrong messages.

The checks RocketMQ makes while building its expression tree (ComparisonExpression.create*,
SelectorParser.asBooleanExpression, ConstantExpression.createFromDecimal/createFloat) are made here
too, so an expression a Java broker refuses is refused here, with the position of the culprit.
"""
from __future__ import annotations

import math
from typing import Any

import attrs

from rmq_core.errors import FilterExpressionError

from .javatypes import (
    BOOL, DOUBLE, INT, INT_MAX, LONG, LONG_MAX, NULL, NUMBER_KINDS, STR, EvaluationError, java_compare,
)
from .lexer import DECIMAL, EOF, FLOAT, ID, OP, STRING, Token, tokenize

_DOUBLE_MIN_VALUE = 5e-324  # Java's Double.MIN_VALUE, the smallest positive double


# --- AST --------------------------------------------------------------------------------------------
# Constants carry the kind of the Java object RocketMQ's tree holds (see javatypes).


@attrs.frozen
class Node:
    pos: int

    is_constant = False  # a ConstantExpression (literal; unary '+' keeps it one, '-' does not)
    is_boolean = False  # a BooleanExpression (can stand as an operand of AND / OR / NOT)
    is_property = False


@attrs.frozen
class Const(Node):
    kind: str
    value: Any

    is_constant = True

    @property
    def is_boolean(self) -> bool:  # TRUE, FALSE and NULL are BooleanConstantExpressions
        return self.kind in (BOOL, NULL)

    def describe(self) -> str:
        if self.kind == NULL:
            return "NULL"
        if self.kind == BOOL:
            return "TRUE" if self.value else "FALSE"
        if self.kind == STR:
            return "'" + self.value.replace("'", "''") + "'"
        return repr(self.value)


@attrs.frozen
class Prop(Node):
    name: str

    is_property = True

    def describe(self) -> str:
        return f"property {self.name}"


@attrs.frozen
class Negate(Node):
    operand: Node

    def describe(self) -> str:
        return "a negated value"


@attrs.frozen
class Compare(Node):
    op: str  # '=', '>', '>=', '<', '<='
    left: Node
    right: Node

    is_boolean = True


@attrs.frozen
class IsNull(Node):
    operand: Node

    is_boolean = True


@attrs.frozen
class Between(Node):
    operand: Node
    low: Node
    high: Node
    negated: bool

    is_boolean = True


@attrs.frozen
class In(Node):
    operand: Prop
    values: tuple
    negated: bool

    is_boolean = True


@attrs.frozen
class StringMatch(Node):
    op: str  # 'CONTAINS', 'STARTSWITH', 'ENDSWITH'
    operand: Node
    search: str
    negated: bool

    is_boolean = True


@attrs.frozen
class Not(Node):
    operand: Node

    is_boolean = True


@attrs.frozen
class Logic(Node):
    op: str  # 'AND' or 'OR'
    left: Node
    right: Node

    is_boolean = True


@attrs.frozen
class BooleanCast(Node):
    """A bare property used as a boolean: FALSE when present (values are strings), NULL if absent."""

    operand: Prop

    is_boolean = True


def describe(node: Node) -> str:
    d = getattr(node, "describe", None)
    return d() if d else "a boolean expression"


# --- parser -----------------------------------------------------------------------------------------
_RELATIONAL = (">", ">=", "<", "<=")
_STRING_MATCH = ("CONTAINS", "STARTSWITH", "ENDSWITH")


class _Parser:
    def __init__(self, expression: str, expression_type: str):
        self.expression = expression
        self.expression_type = expression_type
        self.tokens = tokenize(expression, expression_type)
        self.i = 0

    # token helpers
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.tok
        return t.kind == kind and (text is None or t.text == text)

    def advance(self) -> Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def error(self, pos: int, reason: str) -> FilterExpressionError:
        return FilterExpressionError(self.expression, pos, reason, self.expression_type)

    def expect_op(self, text: str, context: str = "") -> Token:
        if not self.at(OP, text):
            raise self.error(self.tok.pos, f"expected '{text}'{context} but found {self.tok.describe()}")
        return self.advance()

    def expect_string(self, after: str) -> Token:
        if not self.at(STRING):
            raise self.error(
                self.tok.pos, f"expected a string literal after {after} but found {self.tok.describe()}"
            )
        return self.advance()

    # grammar
    def parse(self) -> Node:
        if self.at(EOF):
            raise self.error(0, "the expression is empty")
        node = self.or_expr()
        if not self.at(EOF):
            raise self.error(
                self.tok.pos,
                f"expected AND, OR, a comparison or the end of the expression but found {self.tok.describe()}",
            )
        return self.as_boolean(node)

    def or_expr(self) -> Node:
        return self.logic_chain("OR", self.and_expr)

    def and_expr(self) -> Node:
        return self.logic_chain("AND", self.equality)

    def logic_chain(self, op: str, operand) -> Node:
        """`operand (op operand)*`, left-associative (OR over AND chains, AND over equalities)."""
        left = operand()
        while self.at(op):
            pos = self.advance().pos
            left = Logic(pos, op, self.as_boolean(left), self.as_boolean(operand()))
        return left

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            t = self.tok
            if t.kind == OP and t.text in ("=", "<>"):
                self.advance()
                right = self.comparison()
                self.check_equal_operands(left, right, t)
                node = Compare(t.pos, "=", left, right)
                left = Not(t.pos, node) if t.text == "<>" else node
            elif t.kind == "IS":
                self.advance()
                if self.at("NULL"):
                    self.advance()
                    left = IsNull(t.pos, left)
                elif self.at("NOT") and self.peek().kind == "NULL":
                    self.advance()
                    self.advance()
                    left = Not(t.pos, IsNull(t.pos, left))
                else:
                    raise self.error(
                        self.tok.pos, f"expected NULL or NOT NULL after IS but found {self.tok.describe()}"
                    )
            else:
                return left

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            t = self.tok
            negated = False
            if t.kind == OP and t.text in _RELATIONAL:
                self.advance()
                right = self.unary()
                self.check_less_than_operand(left, t)
                self.check_less_than_operand(right, t)
                left = Compare(t.pos, t.text, left, right)
                continue
            if t.kind == "NOT" and self.peek().kind in (*_STRING_MATCH, "BETWEEN", "IN"):
                self.advance()
                negated = True
                t = self.tok
            if t.kind in _STRING_MATCH:
                self.advance()
                search = self.expect_string(t.kind)
                left = StringMatch(t.pos, t.kind, left, search.text, negated)
            elif t.kind == "BETWEEN":
                self.advance()
                low = self.unary()
                if not self.at("AND"):
                    raise self.error(
                        self.tok.pos, f"expected AND in BETWEEN ... AND ... but found {self.tok.describe()}"
                    )
                self.advance()
                high = self.unary()
                left = self.make_between(t, left, low, high, negated)
            elif t.kind == "IN":
                self.advance()
                self.expect_op("(", " after IN")
                values = [self.expect_string("IN (").text]
                while self.at(OP, ","):
                    self.advance()
                    values.append(self.expect_string("','").text)
                self.expect_op(")", " to close the IN list")
                if not left.is_property:
                    raise self.error(t.pos, f"IN needs a property on its left, got {describe(left)}")
                left = In(t.pos, left, tuple(values), negated)
            else:
                return left

    def unary(self) -> Node:
        t = self.tok
        if t.kind == OP and t.text == "+":
            self.advance()
            return self.unary()  # unary plus is the identity: '+5' stays a constant
        if t.kind == OP and t.text == "-":
            self.advance()
            return Negate(t.pos, self.unary())
        if t.kind == "NOT":
            self.advance()
            return Not(t.pos, self.as_boolean(self.unary()))
        return self.primary()

    def primary(self) -> Node:
        t = self.tok
        if t.kind == STRING:
            self.advance()
            return Const(t.pos, STR, t.text)
        if t.kind == DECIMAL:
            self.advance()
            return self.decimal(t)
        if t.kind == FLOAT:
            self.advance()
            return self.float_(t)
        if t.kind in ("TRUE", "FALSE"):
            self.advance()
            return Const(t.pos, BOOL, t.kind == "TRUE")
        if t.kind == "NULL":
            self.advance()
            return Const(t.pos, NULL, None)
        if t.kind == ID:
            self.advance()
            return Prop(t.pos, t.text)
        if t.kind == OP and t.text == "(":
            self.advance()
            node = self.or_expr()
            self.expect_op(")", f" to close the '(' at position {t.pos}")
            return node
        raise self.error(
            t.pos, f"expected a value (property, number, string, TRUE, FALSE, NULL or '(') but found {t.describe()}"
        )

    # literals (ConstantExpression.createFromDecimal / createFloat)
    def decimal(self, t: Token) -> Const:
        text = t.text[:-1] if t.text[-1] in "lL" else t.text
        value = int(text)
        if value > LONG_MAX:
            raise self.error(t.pos, f"number {t.text} is out of range for a long")
        return Const(t.pos, INT if value <= INT_MAX else LONG, value)

    def float_(self, t: Token) -> Const:
        value = float(t.text)
        if math.isinf(value):
            raise self.error(t.pos, f"number {t.text} is greater than the largest double")
        if value < _DOUBLE_MIN_VALUE:
            # RocketMQ's createFloat compares with Double.MIN_VALUE (the smallest *positive*
            # double), so it rejects 0.0; rejecting it here keeps expressions portable.
            raise self.error(
                t.pos, f"float literal {t.text} is below 4.9E-324, which RocketMQ rejects; write 0 for zero"
            )
        return Const(t.pos, DOUBLE, value)

    # RocketMQ's parse-time checks
    def as_boolean(self, node: Node) -> Node:
        if node.is_boolean:
            return node
        if node.is_property:
            return BooleanCast(node.pos, node)
        raise self.error(
            node.pos,
            f"expected a condition (comparison, TRUE, FALSE or a property) but {describe(node)} is not one",
        )

    def check_less_than_operand(self, node: Node, op: Token) -> None:
        if node.is_constant:
            if node.kind in NUMBER_KINDS:
                return
            raise self.error(node.pos, f"{describe(node)} cannot be compared with '{op.text}': only numbers can")
        if node.is_boolean:
            raise self.error(node.pos, f"a condition cannot be compared with '{op.text}'")

    def check_equal_operands(self, left: Node, right: Node, op: Token) -> None:
        for node in (left, right):
            if node.is_constant and node.kind == NULL:
                raise self.error(node.pos, f"NULL cannot be compared with '{op.text}'; use IS NULL or IS NOT NULL")
        if left.is_constant and right.is_constant and left.is_boolean and not right.is_boolean:
            raise self.error(left.pos, f"{describe(left)} cannot be compared with {describe(right)}")

    def make_between(self, t: Token, value: Node, low: Node, high: Node, negated: bool) -> Node:
        if not negated and low.is_constant and high.is_constant:
            if low.kind == NULL or high.kind == NULL:
                raise self.error(t.pos, "the bounds of BETWEEN cannot be NULL")
            try:  # the same comparison as at run time
                out_of_order = java_compare(high.kind, high.value, low.kind, low.value) < 0
            except EvaluationError as e:
                raise self.error(t.pos, f"the bounds of BETWEEN cannot be compared: {e}") from None
            if out_of_order:
                raise self.error(
                    t.pos,
                    f"the bounds of BETWEEN are out of order: {describe(low)} is greater than {describe(high)}",
                )
        # BETWEEN is built as (v >= low AND v <= high), NOT BETWEEN as (v < low OR v > high): the
        # same operand checks apply.
        op = Token(OP, "<" if negated else ">=", t.pos)
        for node in (value, low, high):
            self.check_less_than_operand(node, op)
        return Between(t.pos, value, low, high, negated)


def parse(expression: str, expression_type: str = "SQL92") -> Node:
    """Parse `expression` into a boolean AST, or raise FilterExpressionError with the position."""
    if not isinstance(expression, str):
        raise FilterExpressionError(repr(expression), 0, "the expression must be a string", expression_type)
    try:
        return _Parser(expression, expression_type).parse()
    except RecursionError:
        raise FilterExpressionError(
            expression, 0, "the expression is nested too deeply", expression_type
        ) from None
