"""The plain validator's admin writes (updateAclConfig, deleteAclConfig, updateGlobalWhiteAddr) and
reads (getAclConfigVersion, getAllAclConfig): a read-modify-write of the ACL file concerned, written
with its next dataVersion and taken at once."""
from __future__ import annotations

import os
import threading
from typing import Any, Iterable

import yaml

from rmq_core.common.files import atomic_write
from rmq_core.errors import AclError
from rmq_core.remoting.body import DataVersion

from .address import parse_address_pattern
from .loader import build_account, build_file, list_of
from .permissions import AclFileError
from .watcher import AclFileWatcher


class AclAdminWrites(AclFileWatcher):
    """The admin commands over the watched ACL files."""

    def __init__(self, acl_file: str, acl_dir: str | None, poll_interval: float):
        super().__init__(acl_file, acl_dir, poll_interval)
        self._lock = threading.Lock()  # the admin commands' read-modify-write of a file

    def _file_of(self, access_key: str | None) -> str | None:
        """The file that defines this account (the rules as on disk now), or None."""
        self.reload()
        return self.rules.file_of.get(access_key)

    def update_access_config(self, config: dict) -> None:
        """Create or update one account (keys as plain_acl.yml) in the file that defines it - a new
        one in plainAclFile, as RocketMQ 4.9; AclError names what is wrong."""
        ak = config.get("accessKey")
        with self._lock:
            path = self._file_of(ak) or self.path
            data = self._file_data(path)
            accounts = data.setdefault("accounts", []) or []
            data["accounts"] = accounts
            existing = next((a for a in accounts if isinstance(a, dict) and str(a.get("accessKey")) == ak), None)
            merged = dict(existing or {})
            merged.update({k: v for k, v in config.items() if v is not None})
            try:
                build_account(merged, f"account accessKey={ak}")
            except AclFileError as e:
                raise AclError(str(e)) from None
            if existing is None:
                accounts.append(merged)
            else:
                accounts[accounts.index(existing)] = merged
            self._write(path, data)

    def delete_access_config(self, access_key: str) -> bool:
        """Remove an account from the file that defines it; False when there is none by that key."""
        with self._lock:
            path = self._file_of(access_key)
            if path is None:
                return False
            data = self._file_data(path)
            accounts = data.get("accounts") or []
            kept = [a for a in accounts if not (isinstance(a, dict) and str(a.get("accessKey")) == access_key)]
            if len(kept) == len(accounts):
                return False
            data["accounts"] = kept
            self._write(path, data)
            return True

    def update_global_white_addrs(self, addresses: Iterable[str], acl_file: str | None = None) -> None:
        """Replace the globalWhiteRemoteAddresses of `acl_file` (mqadmin's aclFileFullPath: one of the
        ACL files this broker reads; default plainAclFile)."""
        path = os.path.abspath(acl_file) if acl_file else self.path
        if path not in self.acl_files():
            raise AclError(f"the ACL file {acl_file} is not one this broker reads; it reads "
                           f"{', '.join(self.acl_files())}")
        addresses = [a.strip() for a in addresses if a and a.strip()]
        for a in addresses:
            try:
                parse_address_pattern(a)
            except ValueError as e:
                raise AclError(str(e)) from None
        with self._lock:
            data = self._file_data(path)
            data["globalWhiteRemoteAddresses"] = addresses
            self._write(path, data)

    def version(self) -> tuple[DataVersion, dict[str, DataVersion]]:
        """plainAclFile's data version and the version of each ACL file (getAllAclConfigVersion)."""
        rules = self.rules
        return rules.data_version, {f.path: f.data_version for f in rules.files}

    def all_config(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_ACL_CONFIG's body (getAllAclConfig): globalWhiteAddrs and
        plainAccessConfigs of every ACL file."""
        configs, white = [], []
        for f in self.rules.files:
            raw = f.raw
            white.extend(str(w) for w in list_of(raw.get("globalWhiteRemoteAddresses")))
            for a in list_of(raw.get("accounts")):
                if not isinstance(a, dict):
                    continue
                configs.append({
                    "accessKey": _str_or_none(a.get("accessKey")), "secretKey": _str_or_none(a.get("secretKey")),
                    "whiteRemoteAddress": _str_or_none(a.get("whiteRemoteAddress")), "admin": bool(a.get("admin", False)),
                    "defaultTopicPerm": _str_or_none(a.get("defaultTopicPerm")),
                    "defaultGroupPerm": _str_or_none(a.get("defaultGroupPerm")),
                    "topicPerms": [str(t) for t in list_of(a.get("topicPerms"))],
                    "groupPerms": [str(g) for g in list_of(a.get("groupPerms"))],
                })
        return {"globalWhiteAddrs": white, "plainAccessConfigs": configs}

    def _file_data(self, path: str) -> dict:
        """An ACL file as it is now (a bad file is refused: an update must not lose what it holds)."""
        self.reload()
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise AclError(f"cannot read the ACL file {path}: {e.strerror}") from None
        try:
            build_file(path, text)
        except AclFileError as e:
            raise AclError(f"{e}; fix the file before changing it with an admin command") from None
        data = yaml.safe_load(text) if text.strip() else {}
        return data if isinstance(data, dict) else {}

    def _write(self, path: str, data: dict) -> None:
        """Write an ACL file with its next dataVersion (replaced by rename: a reader never sees half
        a file), then take the new rules at once."""
        dv = DataVersion.from_json((list_of(data.get("dataVersion")) or [None])[0])
        dv.next_version()
        data["dataVersion"] = [dv.to_json()]
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
        atomic_write(path, text.encode("utf-8"), mode=0o600)  # (it holds secret keys)
        self.reload()


def _str_or_none(v):
    return None if v is None else str(v)
