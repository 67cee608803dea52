"""The commit-log record's constants and field offsets for Python readers.  They are defined once,
in rmq_core/_native/record_layout.pxd (docs/protocol.md §5), and come here through the native
module that exports them.  Readers of a raw record use these names instead of numbers."""
from __future__ import annotations

from rmq_core._native.layout import *  # noqa: F401,F403 (the layout's names are this module's API)
