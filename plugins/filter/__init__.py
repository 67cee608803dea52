"""Built-in filter plugins: the TAG and SQL92 expression types."""
from rmq_core.plugins import hookimpl

from .sql92 import compile_sql92
from .tag import compile_tag


@hookimpl
def rmq_filters():
    return {"TAG": compile_tag, "SQL92": compile_sql92}
