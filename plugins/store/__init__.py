"""Built-in store plugins: consumer offset stores `remote` (clustering) and `local_file` (broadcasting).

`factory(group, *, broker_api=None, offset_dir=None, client_id=None) -> OffsetStore`.
"""
from rmq_core.plugins import hookimpl
from rmq_plugins.store.offset_store import (  # noqa: F401 - re-exported
    LocalFileOffsetStore,
    OffsetStore,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
    local_file_factory,
    remote_factory,
)


@hookimpl
def rmq_offset_stores():
    return {"remote": remote_factory, "local_file": local_file_factory}
