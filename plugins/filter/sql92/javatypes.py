"""Java value semantics RocketMQ's SQL92 evaluator relies on, shared by parser and compilers.

Kinds mirror the Java classes in RocketMQ's expression tree: a literal is an Integer, Long,
Double, String or Boolean (or null); a property is a String; a condition is a Boolean.  The kinds
matter: a property is converted with Integer.valueOf or Long.valueOf depending on the literal it
meets, and a failed conversion throws (EvaluationError here).
"""
from __future__ import annotations

import math
import re

INT, LONG, DOUBLE, STR, BOOL, NULL = "int", "long", "double", "str", "bool", "null"
NUMBER_KINDS = (INT, LONG, DOUBLE)
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


class EvaluationError(Exception):
    """RocketMQ's evaluator would throw here (a failed number conversion, a Boolean cast)."""


# --- Java conversions -------------------------------------------------------------------------------
_JAVA_INTEGER = re.compile(r"[+-]?\d+")  # Character.digit accepts any Unicode decimal digit
# Double.valueOf after String.trim(): decimal (ASCII digits), NaN, Infinity or hex, with an
# optional f/F/d/D suffix.
_JAVA_DOUBLE = re.compile(
    r"(?P<sign>[+-]?)(?:"
    r"(?P<special>NaN|Infinity)"
    r"|(?P<dec>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?"
    r")",
    re.ASCII,
)
_SIMPLE_DOUBLE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def parse_java_int(s: str, lo: int = INT_MIN, hi: int = INT_MAX) -> int:
    """Integer.valueOf (or Long.valueOf with the long bounds); EvaluationError on failure."""
    if s.isdecimal():
        n = int(s)
    elif _JAVA_INTEGER.fullmatch(s):
        n = int(s)
    else:
        raise EvaluationError(f"for input string {s!r}: not an integer")
    if n < lo or n > hi:
        raise EvaluationError(f"for input string {s!r}: out of range")
    return n


def parse_java_long(s: str) -> int:
    return parse_java_int(s, LONG_MIN, LONG_MAX)


def parse_java_double(s: str) -> float:
    """Double.valueOf: trims characters <= ' ', accepts NaN, Infinity, hex and f/d suffixes."""
    if _SIMPLE_DOUBLE.fullmatch(s):
        return float(s)
    t = s.strip("".join(chr(c) for c in range(33)))
    m = _JAVA_DOUBLE.fullmatch(t)
    if m is None:
        raise EvaluationError(f"for input string {s!r}: not a number")
    sign = -1.0 if m.group("sign") == "-" else 1.0
    if m.group("special"):
        return math.nan if m.group("special") == "NaN" else sign * math.inf
    if m.group("dec") is not None:
        return sign * float(m.group("dec"))
    return sign * float.fromhex(m.group("hex"))


def java_double_compare(a: float, b: float) -> int:
    """Double.compareTo: a total order where -0.0 < 0.0 and NaN is above everything and equals itself."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:
            sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
            return (sa > sb) - (sa < sb)
        return 0
    a_nan, b_nan = a != a, b != b
    return (a_nan > b_nan) - (a_nan < b_nan)


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def _utf16_compare(a: str, b: str) -> int:
    """String.compareTo orders by UTF-16 code units, which differs from code points above U+FFFF."""
    if a.isascii() and b.isascii():
        return _cmp(a, b)
    return _cmp(a.encode("utf-16-be"), b.encode("utf-16-be"))


def java_compare(lk: str, lv, rk: str, rv) -> int:
    """ComparisonExpression.__compare with convertStringExpressions on (as SelectorParser sets it).

    lk/rk are the static kinds of non-null values lv/rv."""
    if lk == rk:
        if lk == DOUBLE:
            return java_double_compare(lv, rv)
        if lk == STR:
            return _utf16_compare(lv, rv)
        return _cmp(lv, rv)  # int, long, bool (False < True)
    if lk == BOOL:
        if rk == STR:
            # RocketMQ casts the Boolean itself to String here (ClassCastException).
            raise EvaluationError("a Boolean cannot be compared with a String")
        return -1
    if lk in (INT, LONG):
        if rk in (INT, LONG):
            return _cmp(lv, rv)
        if rk == DOUBLE:
            return java_double_compare(float(lv), rv)
        if rk == STR:
            return _cmp(lv, parse_java_int(rv) if lk == INT else parse_java_long(rv))
        return -1
    if lk == DOUBLE:
        if rk in (INT, LONG):
            return java_double_compare(lv, float(rv))
        if rk == STR:
            return java_double_compare(lv, parse_java_double(rv))
        return -1
    if lk == STR:
        if rk == BOOL:
            return _cmp(lv.lower() == "true", rv)
        if rk == INT:
            return _cmp(parse_java_int(lv), rv)
        if rk == LONG:
            return _cmp(parse_java_long(lv), rv)
        if rk == DOUBLE:
            return java_double_compare(parse_java_double(lv), rv)
    return -1
