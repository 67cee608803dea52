"""`delegate`: a property that reads (and, writable, sets) an attribute of an attribute, for the
objects that show a part's value as their own (a consumer's client id, a trace dispatcher's
buffer capacity, an embedded cluster's broker address)."""
from __future__ import annotations

import operator


def delegate(path: str, doc: str | None = None, *, writable: bool = False) -> property:
    """A property reading the dotted `path` from its object ("client_config.client_id"); with
    `writable`, assigning it sets the last attribute of the path."""
    get = operator.attrgetter(path)
    if not writable:
        return property(get, doc=doc)
    head, _, name = path.rpartition(".")
    owner = operator.attrgetter(head) if head else (lambda obj: obj)
    return property(get, lambda obj, value: setattr(owner(obj), name, value), doc=doc)
