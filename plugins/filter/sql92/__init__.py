"""The SQL92 expression type: RocketMQ's property filter (MessageSelector.bySql).

`compile_sql92(expression)` parses once (cached, like RocketMQ's parse cache) and returns a
`Sql92MessageFilter` whose `is_matched_by_commit_log(properties)` runs the compiled closure tree.
"""
from __future__ import annotations

import functools
import logging
from typing import Mapping

from rmq_core.filtering import MessageFilter

from . import codegen
from .compiler import EvaluationError, compile_node, property_names
from .parser import parse

__all__ = ["Sql92MessageFilter", "compile_sql92", "EvaluationError"]

log = logging.getLogger("rmq.filter.sql92")

EXPRESSION_TYPE = "SQL92"


class Sql92MessageFilter(MessageFilter):
    """A compiled SQL92 selector.  Immutable: one instance may serve many subscriptions."""

    tag_codes = None
    bloom_bits = None
    needs_commit_log_check = True
    expression_type = EXPRESSION_TYPE

    def __init__(self, expression: str):
        self.expression = expression
        self._ast = parse(expression, EXPRESSION_TYPE)
        self.property_names = property_names(self._ast)
        try:
            self._evaluate, matches = codegen.compile_functions(self._ast, f"<SQL92 {expression[:60]!r}>")
            self.compiled_to = "python source"
        except (SyntaxError, RecursionError, MemoryError):
            # Too deeply nested for Python's parser: the closure tree evaluates the same way.
            self._evaluate = compile_node(self._ast)
            self.compiled_to = "closures"
            evaluate = self._evaluate

            def matches(properties):
                try:
                    return evaluate(properties if properties is not None else {}) is True
                except EvaluationError:
                    return False

        self._matches = matches
        # The store calls this per candidate message: bind the generated function itself, so a
        # message costs one Python call (the instance attribute shadows the method below).
        self.is_matched_by_commit_log = matches

    def evaluate(self, properties: Mapping[str, str] | None) -> bool | None:
        """Three-valued result: True, False, or None (UNKNOWN, also when evaluation fails)."""
        try:
            return self._evaluate(properties if properties is not None else {})
        except EvaluationError as e:
            # RocketMQ logs and treats the message as not matching; per message, so keep it quiet.
            log.debug("SQL92 filter %r failed on %r: %s", self.expression, properties, e)
            return None

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        """True when the expression is TRUE for `properties` (UNKNOWN and failures are not)."""
        return self._matches(properties)

    def is_matched_by_tag(self, tag: str | None) -> bool:
        """Client-side re-check after a pull: SQL92 subscriptions carry no tag set, keep all."""
        return True

    def __repr__(self) -> str:
        return f"Sql92MessageFilter({self.expression!r})"


@functools.lru_cache(maxsize=256)
def _compile_cached(expression: str) -> Sql92MessageFilter:
    return Sql92MessageFilter(expression)


def compile_sql92(expression: str) -> Sql92MessageFilter:
    """Factory for the `SQL92` expression type; raises FilterExpressionError naming the position."""
    if not isinstance(expression, str):
        return Sql92MessageFilter(expression)  # raises the clear type error
    return _compile_cached(expression)
