"""ACL commands (mqadmin 4.9's tools/command/acl): updateAclConfig, deleteAclConfig,
updateGlobalWhiteAddr, clusterAclConfigVersion, getAclConfig.  Each works on one broker (-b) or
on every master of a cluster (-c) and changes the plain_acl.yml that broker watches."""
from __future__ import annotations

from rmq_core.admin.commands import arg, broker_targets, command, parse_bool
from rmq_core.admin.output import fmt_time

_B = arg("-b", "--brokerAddr", help="broker address host:port")
_C = arg("-c", "--clusterName", help="cluster name (every master of it)")


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


@command("updateAclConfig", "Create or update an account in the brokers' plain_acl.yml", _B, _C,
         arg("-a", "--accessKey", required=True, help="the account's accessKey (more than 6 characters)"),
         arg("-s", "--secretKey", help="its secretKey (more than 6 characters)"),
         arg("-w", "--whiteRemoteAddress", help="addresses it passes from without a signature, e.g. 192.168.0.*"),
         arg("-i", "--defaultTopicPerm", help="permission on topics not listed: DENY, PUB, SUB or PUB|SUB"),
         arg("-u", "--defaultGroupPerm", help="permission on groups not listed: DENY, PUB, SUB or PUB|SUB"),
         arg("-t", "--topicPerms", help="topic permissions, e.g. topicA=DENY,topicD=SUB"),
         arg("-g", "--groupPerms", help="group permissions, e.g. groupA=DENY,groupD=SUB"),
         arg("-m", "--admin", type=parse_bool, help="true: may send admin-only requests"))
def update_acl_config(admin, args, out):
    rows = []
    for addr in broker_targets(admin, args):
        admin.update_acl_config(addr, args.accessKey, secret_key=args.secretKey,
                                white_remote_address=args.whiteRemoteAddress, admin=args.admin,
                                default_topic_perm=args.defaultTopicPerm, default_group_perm=args.defaultGroupPerm,
                                topic_perms=_list(args.topicPerms), group_perms=_list(args.groupPerms))
        out.message(f"create or update plain access config to {addr} success.")
        rows.append((addr, args.accessKey, "updated"))
    out.table(["Broker Addr", "Access Key", "Result"], rows)


@command("deleteAclConfig", "Delete an account from the brokers' plain_acl.yml", _B, _C,
         arg("-a", "--accessKey", required=True, help="the account's accessKey"))
def delete_acl_config(admin, args, out):
    rows = []
    for addr in broker_targets(admin, args):
        admin.delete_acl_config(addr, args.accessKey)
        out.message(f"delete plain access config account from {addr} success.")
        rows.append((addr, args.accessKey, "deleted"))
    out.table(["Broker Addr", "Access Key", "Result"], rows)


@command("updateGlobalWhiteAddr", "Replace the brokers' globalWhiteRemoteAddresses", _B, _C,
         arg("-g", "--globalWhiteRemoteAddresses", required=True,
             help="address patterns, e.g. 10.10.103.*,192.168.0.* (empty: none)"),
         arg("-p", "--aclFileFullPath", help="the ACL file to change (default: the broker's plainAclFile)"))
def update_global_white_addr(admin, args, out):
    addrs = _list(args.globalWhiteRemoteAddresses) or []
    rows = []
    for addr in broker_targets(admin, args):
        admin.update_global_white_addrs(addr, addrs, args.aclFileFullPath)
        out.message(f"update global white remote addresses to {addr} success.")
        rows.append((addr, ",".join(addrs)))
    out.table(["Broker Addr", "Global White Remote Addresses"], rows)


@command("clusterAclConfigVersion", "The ACL config version of each broker", _B, _C)
def cluster_acl_config_version(admin, args, out):
    rows = [(v.cluster, v.broker_name, v.broker_addr, v.acl_file, v.counter, fmt_time(v.timestamp))
            for addr in broker_targets(admin, args) for v in admin.acl_config_version(addr)]
    out.table(["Cluster Name", "Broker Name", "Broker Addr", "AclFilePath", "AclConfigVersionNum",
               "AclLastUpdateTime"], rows)


MASKED = "******"


@command("getAclConfig", "The accounts and global white addresses of each broker (secret keys masked unless "
                         "--show-secrets)", _B, _C,
         arg("--show-secrets", dest="show_secrets", action="store_true",
             help="print the accounts' secret keys (masked otherwise: the output lands in terminals and logs)"))
def get_acl_config(admin, args, out):
    rows = []
    for addr in broker_targets(admin, args):
        config = admin.acl_config(addr)
        white = ",".join(config["globalWhiteAddrs"])
        for a in config["plainAccessConfigs"]:
            secret = a.get("secretKey") if args.show_secrets or not a.get("secretKey") else MASKED
            rows.append((addr, white, a.get("accessKey"), secret, a.get("whiteRemoteAddress"),
                         bool(a.get("admin")), a.get("defaultTopicPerm"), a.get("defaultGroupPerm"),
                         ",".join(a.get("topicPerms") or []), ",".join(a.get("groupPerms") or [])))
        if not config["plainAccessConfigs"]:
            rows.append((addr, white, None, None, None, None, None, None, "", ""))
    out.table(["Broker Addr", "Global White Addrs", "Access Key", "Secret Key", "White Remote Address", "Admin",
               "Default Topic Perm", "Default Group Perm", "Topic Perms", "Group Perms"], rows)
