"""Tokens of RocketMQ's SQL92 selector grammar (filter/parser/SelectorParser.jj, 4.9.7 + 5.x).

Lexical rules kept from the JavaCC grammar, because a subscription must mean the same thing on a
Java broker and on ours:
- whitespace is ' ', TAB, LF, CR, FF; `-- ...` comments need a line end (without one the `--` is
  two minus signs), `/* ... */` block comments;
- keywords (NOT AND OR BETWEEN IN TRUE FALSE NULL IS CONTAINS STARTSWITH ENDSWITH) are
  case-insensitive and reserved; the longest match wins, so `notes` is an identifier;
- identifiers are `[A-Za-z_$][A-Za-z0-9_$]*` (no '.');
- DECIMAL is `0 | [1-9][0-9]*[lL]?` (hex and octal were removed by RocketMQ: `0x1F` is the
  number 0 followed by an identifier); FLOAT is `1.`, `1.5`, `.5`, `1e5`, with an optional
  exponent; strings are single-quoted with '' for a quote.
Positions are 0-based character indexes into the expression.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from rmq_core.errors import FilterExpressionError

KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
     "STARTSWITH", "ENDSWITH"}
)

# Token kinds besides the keywords (whose kind is the upper-case keyword itself).
DECIMAL, FLOAT, STRING, ID, OP, EOF = "DECIMAL", "FLOAT", "STRING", "ID", "OP", "EOF"

_WHITESPACE = " \t\n\r\f"
_LINE_COMMENT = re.compile(r"--[^\n\r]*(?:\r\n|\n|\r)")
_BLOCK_COMMENT = re.compile(r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/")
_STRING = re.compile(r"'(?:''|[^'])*'")
_DECIMAL = re.compile(r"0|[1-9][0-9]*[lL]?")
_FLOAT = re.compile(
    r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
)
_ID = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_TWO_CHAR_OPS = frozenset({"<>", ">=", "<="})
_ONE_CHAR_OPS = frozenset("=><(),+-")


class Token(NamedTuple):
    kind: str  # a keyword, DECIMAL, FLOAT, STRING, ID, OP or EOF
    text: str  # the source text (for STRING: the decoded value)
    pos: int  # index of the first character in the expression

    def describe(self) -> str:
        if self.kind == EOF:
            return "end of expression"
        if self.kind == STRING:
            return "string '" + self.text.replace("'", "''") + "'"
        return repr(self.text)


def _must_match(pattern: re.Pattern, expression: str, i: int, expression_type: str, error: str) -> re.Match:
    """`pattern`'s match at `i`, else a FilterExpressionError saying `error` there."""
    m = pattern.match(expression, i)
    if m is None:
        raise FilterExpressionError(expression, i, error, expression_type)
    return m


def tokenize(expression: str, expression_type: str = "SQL92") -> list[Token]:
    """Split `expression` into tokens ending with an EOF token, or raise FilterExpressionError."""
    tokens: list[Token] = []
    n = len(expression)
    i = 0
    while i < n:
        c = expression[i]
        if c in _WHITESPACE:
            i += 1
            continue
        if c == "-" and expression.startswith("--", i):
            m = _LINE_COMMENT.match(expression, i)
            if m:
                i = m.end()
                continue
        if c == "/":
            i = _must_match(_BLOCK_COMMENT, expression, i, expression_type, "unterminated comment: expected '*/'"
                            if expression.startswith("/*", i) else "unexpected character '/'").end()
            continue
        if c == "'":
            m = _must_match(_STRING, expression, i, expression_type,
                            "unterminated string literal: expected a closing quote (')")
            tokens.append(Token(STRING, m.group()[1:-1].replace("''", "'"), i))
            i = m.end()
            continue
        if "0" <= c <= "9" or (c == "." and i + 1 < n and "0" <= expression[i + 1] <= "9"):
            # JavaCC takes the longest match; on a tie the earlier-declared DECIMAL wins.
            md = _DECIMAL.match(expression, i)
            mf = _FLOAT.match(expression, i)
            if mf and (md is None or mf.end() > md.end()):
                tokens.append(Token(FLOAT, mf.group(), i))
                i = mf.end()
            else:
                tokens.append(Token(DECIMAL, md.group(), i))
                i = md.end()
            continue
        m = _ID.match(expression, i)
        if m:
            word = m.group()
            upper = word.upper()
            tokens.append(Token(upper if upper in KEYWORDS else ID, word, i))
            i = m.end()
            continue
        two = expression[i:i + 2]
        if two in _TWO_CHAR_OPS:
            tokens.append(Token(OP, two, i))
            i += 2
            continue
        if c in _ONE_CHAR_OPS:
            tokens.append(Token(OP, c, i))
            i += 1
            continue
        hint = ""
        if two == "!=":
            hint = " (use '<>' for 'not equal')"
        elif c == '"':
            hint = " (string literals use single quotes)"
        raise FilterExpressionError(
            expression, i, f"unexpected character {c!r}{hint}", expression_type
        )
    tokens.append(Token(EOF, "", n))
    return tokens
