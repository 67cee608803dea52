"""KVConfigManager: namespaced key/value settings kept by the name server (e.g. ORDER_TOPIC_CONFIG).

Persisted as RocketMQ's kvConfig.json (`{"configTable": {namespace: {key: value}}}`), written to a
temporary file and renamed so a crash never leaves half a file.  An empty path keeps it in memory.
"""
from __future__ import annotations

import json
import logging
import os

from rmq_core.common.files import atomic_write
from rmq_core.errors import ConfigError

log = logging.getLogger("rmq.namesrv")

NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class KVConfigManager:
    def __init__(self, path: str | None):
        self.path = path or None
        self.config_table: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        if self.path is None or not os.path.exists(self.path):
            return
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read name server KV config {self.path!r}: {e}") from None
        table = data.get("configTable") if isinstance(data, dict) else None
        if not isinstance(table, dict):
            raise ConfigError(f"bad name server KV config {self.path!r}: no configTable object")
        self.config_table = {str(ns): {str(k): str(v) for k, v in kv.items()}
                             for ns, kv in table.items() if isinstance(kv, dict)}
        log.info("load KV config table from %s: %d namespaces", self.path, len(self.config_table))

    def persist(self) -> None:
        if self.path is None:
            return
        text = json.dumps({"configTable": self.config_table}, indent=1, sort_keys=True, ensure_ascii=False)
        atomic_write(self.path, text.encode("utf-8"))

    def put(self, namespace: str, key: str, value: str) -> None:
        kv = self.config_table.setdefault(namespace, {})
        old = kv.get(key)
        kv[key] = value
        log.info("%s KV config, namespace %s key %s value %s", "update" if old is not None else "put",
                 namespace, key, value)
        self.persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self.config_table.get(namespace, {}).get(key)

    def get_namespace(self, namespace: str) -> dict[str, str] | None:
        kv = self.config_table.get(namespace)
        return dict(kv) if kv else None

    def delete(self, namespace: str, key: str) -> bool:
        kv = self.config_table.get(namespace)
        if kv is None or key not in kv:
            return False
        del kv[key]
        if not kv:
            del self.config_table[namespace]
        log.info("delete KV config, namespace %s key %s", namespace, key)
        self.persist()
        return True
