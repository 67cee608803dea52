"""rmq plugin: the `REGEX` expression type, a regular expression the whole tag must match."""
from __future__ import annotations

import re
from typing import Mapping

from rmq_core.errors import FilterExpressionError
from rmq_core.filtering import MessageFilter
from rmq_core.plugins import hookimpl

EXPRESSION_TYPE = "REGEX"
TAGS = "TAGS"  # the message property holding the tag (RocketMQ MessageConst.PROPERTY_TAGS)


class RegexTagFilter(MessageFilter):
    tag_codes = None  # a pattern has no single hash code: every entry is a candidate ...
    needs_commit_log_check = True  # ... and the tag is tested on the stored properties
    expression_type = EXPRESSION_TYPE

    def __init__(self, expression: str):
        if not isinstance(expression, str) or not expression:
            raise FilterExpressionError(repr(expression), 0, "expected a regular expression", EXPRESSION_TYPE)
        try:
            self._pattern = re.compile(expression)
        except re.error as e:
            raise FilterExpressionError(expression, e.pos or 0, e.msg, EXPRESSION_TYPE) from None
        self.expression = expression

    def is_matched_by_tag(self, tag: str | None) -> bool:
        return tag is not None and self._pattern.fullmatch(tag) is not None

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return self.is_matched_by_tag((properties or {}).get(TAGS))

    def __repr__(self) -> str:
        return f"RegexTagFilter({self.expression!r})"


@hookimpl
def rmq_filters():
    return {EXPRESSION_TYPE: RegexTagFilter}
