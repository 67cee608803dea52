"""The admin calls of plain ACL (plain_acl.yml on each broker)."""
from __future__ import annotations

import json
from typing import Sequence

from rmq_core.admin.calls.transport import AdminTransport
from rmq_core.admin.values import AclVersion, AdminError
from rmq_core.remoting.body import loads_lenient
from rmq_core.remoting.codes import RequestCode


class AclCalls(AdminTransport):
    """Plain ACL's calls."""

    # --- ACL (plain_acl.yml on each broker) ----------------------------------------------------------------
    def update_acl_config(self, addr: str, access_key: str, *, secret_key: str | None = None,
                          white_remote_address: str | None = None, admin: bool | None = None,
                          default_topic_perm: str | None = None, default_group_perm: str | None = None,
                          topic_perms: Sequence[str] | None = None, group_perms: Sequence[str] | None = None) -> None:
        """updateAclConfig: create or update one account in the broker's plain_acl.yml (fields left
        None are kept as the file has them)."""
        ext = {"accessKey": access_key, "secretKey": secret_key, "whiteRemoteAddress": white_remote_address,
               "defaultTopicPerm": default_topic_perm, "defaultGroupPerm": default_group_perm,
               "topicPerms": ",".join(topic_perms) if topic_perms is not None else None,
               "groupPerms": ",".join(group_perms) if group_perms is not None else None,
               "admin": None if admin is None else str(bool(admin)).lower()}
        self._call(addr, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, {k: v for k, v in ext.items() if v is not None},
                   what=f"update ACL account {access_key}")

    def delete_acl_config(self, addr: str, access_key: str) -> None:
        """deleteAclConfig: remove one account from the broker's plain_acl.yml."""
        self._call(addr, RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key},
                   what=f"delete ACL account {access_key}")

    def update_global_white_addrs(self, addr: str, addresses: Sequence[str], acl_file: str | None = None) -> None:
        """updateGlobalWhiteAddr: replace the broker's globalWhiteRemoteAddresses."""
        self._call(addr, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
                   {"globalWhiteAddrs": ",".join(addresses), "aclFileFullPath": acl_file or ""},
                   what="update globalWhiteRemoteAddresses")

    def acl_config_version(self, addr: str) -> list[AclVersion]:
        """clusterAclConfigVersion's rows of one broker: one per ACL file it reads (plainAclFile first)."""
        r = self._call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, what="get ACL config version")
        get = r.ext_fields.get
        try:
            files = json.loads(get("allAclFileVersion") or "{}")
        except ValueError as e:
            raise AdminError(f"get ACL config version on {addr}: bad allAclFileVersion: {e}") from None
        return [AclVersion(get("clusterName") or "", get("brokerName") or "", get("brokerAddr") or addr, path,
                           int(v.get("counter", 0)), int(v.get("timestamp", 0)))
                for path, v in files.items()]

    def acl_config(self, addr: str) -> dict:
        """getAclConfig: {"globalWhiteAddrs": [...], "plainAccessConfigs": [{accessKey, ...}, ...]}."""
        r = self._call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, what="get ACL config")
        try:
            d = loads_lenient(r.body or b"{}")
        except ValueError as e:
            raise AdminError(f"get ACL config on {addr}: bad answer: {e}") from None
        return {"globalWhiteAddrs": list(d.get("globalWhiteAddrs") or []),
                "plainAccessConfigs": list(d.get("plainAccessConfigs") or [])}
