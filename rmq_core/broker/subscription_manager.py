"""Subscription groups with the broker's policy (auto-creation), persisted by config_file."""
from __future__ import annotations

import logging
import threading

from rmq_core.errors import StoreError
from rmq_core.broker.config_file import SubscriptionGroupConfig, SubscriptionGroupTable

log = logging.getLogger("rmq.broker")


class SubscriptionGroupManager:
    def __init__(self, broker_config, config_dir: str):
        self.broker_config = broker_config
        self.table = SubscriptionGroupTable(config_dir)
        self._lock = threading.Lock()

    def load(self) -> None:
        self.table.load()

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        return self.table.get(group)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        cfg = self.table.get(group)
        if cfg is None and self.broker_config.auto_create_subscription_group:
            with self._lock:
                cfg = self.table.get(group)
                if cfg is None:
                    cfg = SubscriptionGroupConfig(group_name=group)
                    self.table.put(cfg)
                    log.info("auto create a subscription group, %s", group)
                    try:  # coalesced: a heartbeat storm of new groups shares the writes
                        self.table.persist_soon()
                    except StoreError as e:  # (a full disk) the group serves from memory meanwhile
                        log.error("auto-created subscription group %s is not persisted yet: %s", group, e)
        return cfg

    async def update(self, cfg: SubscriptionGroupConfig) -> None:
        """An admin's change: returns once written."""
        with self._lock:
            self.table.put(cfg)
        await _written(self.table.persist_soon())

    async def delete(self, group: str) -> None:
        with self._lock:
            if self.table.get(group) is None:
                return
            self.table.delete(group)
        await _written(self.table.persist_soon())

    async def flush(self) -> None:
        await self.table.flush()

    def serialize(self) -> dict:
        """SubscriptionGroupWrapper for GET_ALL_SUBSCRIPTIONGROUP_CONFIG (its dataVersion tells a
        slave whether to copy the table)."""
        return {"subscriptionGroupTable": {name: cfg.to_json() for name, cfg in self.table.items()},
                "dataVersion": self.table.data_version.to_json()}


async def _written(write) -> None:
    if write is not None:
        await write
