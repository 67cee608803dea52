"""Fixtures for the store tests: small segments so roll-overs happen after a few records."""
from __future__ import annotations

import threading

import pytest

from rmq_core.config import FlushDiskType, MessageStoreConfig
from rmq_core.store import DefaultMessageStore, MessageExtBrokerInner


def make_config(root, **kw) -> MessageStoreConfig:
    base = dict(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 100,
        flush_interval_commit_log=50,
        flush_interval_consume_queue=50,
        clean_resource_interval=3_600_000,  # retention rounds are driven by the tests
        message_index_enable=True,
    )
    base.update(kw)
    return MessageStoreConfig(**base)


@pytest.fixture
def config_factory(tmp_path):
    def factory(**kw):
        return make_config(tmp_path / "store", **kw)

    return factory


@pytest.fixture
def store_factory(config_factory):
    opened = []

    def factory(config=None, **kw):
        s = DefaultMessageStore(config or config_factory(**kw))
        s.load()
        s.start()
        opened.append(s)
        return s

    yield factory
    for s in opened:
        s.shutdown()


@pytest.fixture
def store(store_factory):
    return store_factory()


@pytest.fixture
def sync_store(store_factory):
    return store_factory(flush_disk_type=FlushDiskType.SYNC_FLUSH)


def msg(topic="TopicA", queue_id=0, body=b"hello", tags=None, keys=None, **kw) -> MessageExtBrokerInner:
    props = dict(kw.pop("properties", {}))
    if tags is not None:
        props["TAGS"] = tags
    if keys is not None:
        props["KEYS"] = keys
    return MessageExtBrokerInner(topic=topic, queue_id=queue_id, body=body, properties=props, **kw)


def hold_python_rounds(store, monkeypatch):
    """Every group-commit round of `store` goes through commit_log.flush, which waits (up to 10 s)
    for the returned `release` Event; `flushing` is set once a round is under way."""
    release, flushing = threading.Event(), threading.Event()
    real_flush = store.commit_log.flush

    def held_flush(least_pages=0):
        flushing.set()
        release.wait(10)
        return real_flush(least_pages)

    monkeypatch.setattr(store.commit_log, "flush", held_flush)
    monkeypatch.setattr(store.commit_log.flush_service, "serve_natively", False)
    return release, flushing
