"""The bits of PULL_MESSAGE's sysFlag (RocketMQ's common/sysflag/PullSysFlag): the client sets
them, the broker reads them."""
from __future__ import annotations

FLAG_COMMIT_OFFSET = 0x1  # the request carries the consumer's offset to commit
FLAG_SUSPEND = 0x2  # the broker may hold the request (long polling) when nothing is there
FLAG_SUBSCRIPTION = 0x4  # the request carries its subscription expression
FLAG_CLASS_FILTER = 0x8
FLAG_LITE_PULL_MESSAGE = 0x10


def build_pull_sys_flag(commit_offset: bool, suspend: bool, subscription: bool, class_filter: bool = False,
                        lite_pull: bool = False) -> int:
    return ((FLAG_COMMIT_OFFSET if commit_offset else 0) | (FLAG_SUSPEND if suspend else 0)
            | (FLAG_SUBSCRIPTION if subscription else 0) | (FLAG_CLASS_FILTER if class_filter else 0)
            | (FLAG_LITE_PULL_MESSAGE if lite_pull else 0))


__all__ = ["FLAG_COMMIT_OFFSET", "FLAG_SUSPEND", "FLAG_SUBSCRIPTION", "FLAG_CLASS_FILTER", "FLAG_LITE_PULL_MESSAGE",
           "build_pull_sys_flag"]
