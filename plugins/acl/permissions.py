"""The plain ACL's permission model (RocketMQ's acl Permission and PlainAccessResource): the
permission bits, the admin-only request codes, what each request needs (PlainAccessValidator.parse),
the accounts and the merged rules of every ACL file, and the refusals in RocketMQ's words."""
from __future__ import annotations

import json

import attrs

from rmq_core.acl import SigningKey
from rmq_core.errors import ConfigError
from rmq_core.message import MixAll, TopicValidator
from rmq_core.remoting.body import DataVersion
from rmq_core.remoting.codes import RequestCode
from rmq_core.remoting.steps import RequestRefused

from .address import AddressPattern

# Permission bits (RocketMQ's acl Permission)
DENY, ANY, PUB, SUB = 1, 2, 4, 8
PERM_BY_NAME = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    return "|".join(n for n, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit) or "none"


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission: DENY wins; ANY is PUB or SUB."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


# Request codes only an account with `admin: true` may send (RocketMQ's Permission.ADMIN_CODE, and
# the other codes that change a broker's tables, offsets or ACL, or read the accounts' secrets).
ADMIN_CODES = frozenset(int(c) for c in (
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG, RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, RequestCode.RESET_CONSUMER_OFFSET_IN_BROKER,
    RequestCode.CLONE_GROUP_OFFSET, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, RequestCode.CLEAN_UNUSED_TOPIC,
    RequestCode.TRIGGER_DELETE_FILES, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, RequestCode.DELETE_ACL_CONFIG,
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
))

RETRY = MixAll.RETRY_GROUP_TOPIC_PREFIX
TRACE_TOPIC = TopicValidator.RMQ_SYS_TRACE_TOPIC


def describe(resource: str) -> str:
    """PlainAccessResource.printStr: 'topic=T' or 'group=G' (a group is kept as its retry topic)."""
    return f"group={resource[len(RETRY):]}" if resource.startswith(RETRY) else f"topic={resource}"


# --- what a request needs (PlainAccessValidator.parse) -------------------------------------------------
def group_resource(name: str | None) -> str:
    return RETRY + (name or "")


def _send(ext, topic_key: str):
    return send_of(ext.get(topic_key) or "")


def send_of(topic: str):
    # a retry topic's send (a consumer's message sent back as a plain send) needs SUB on its group
    return ((topic, SUB),) if topic.startswith(RETRY) else ((topic, PUB),)


def _pop(ext):
    """Pop consumption needs what a pull needs: SUB on the topic and on the group.  An ack names
    the topic the message is stored in, maybe the group's pop retry topic %RETRY%<group>_<topic>:
    the check is on <topic>."""
    group = ext.get("consumerGroup") or ""
    topic = ext.get("topic") or ""
    prefix = f"{RETRY}{group}_"
    if group and topic.startswith(prefix):
        topic = topic[len(prefix):]
    return ((topic, SUB), (group_resource(group), SUB))


def _batch_ack(ext, body):
    """BATCH_ACK_MESSAGE: what each BatchAck of its body names (c group, t topic)."""
    try:
        acks = json.loads(bytes(body or b"{}")).get("acks") or ()
    except (ValueError, AttributeError):
        acks = ()
    needed = []
    for a in acks:
        if isinstance(a, dict):
            needed.extend(_pop({"consumerGroup": a.get("c", a.get("consumerGroup")), "topic": a.get("t", a.get("topic"))}))
    return needed


def _heartbeat(ext, body):
    from rmq_core.broker.client_manager import parse_heartbeat

    needed = []
    for c in parse_heartbeat(body)["consumers"]:
        if c["group"]:
            needed.append((group_resource(c["group"]), SUB))
        needed.extend((s.topic, SUB) for s in c["subscriptions"])
    return needed


RESOURCES = {
    RequestCode.SEND_MESSAGE: lambda ext, body: _send(ext, "topic"),
    RequestCode.SEND_REPLY_MESSAGE: lambda ext, body: _send(ext, "topic"),
    RequestCode.SEND_MESSAGE_V2: lambda ext, body: _send(ext, "b"),
    RequestCode.SEND_BATCH_MESSAGE: lambda ext, body: _send(ext, "b"),
    RequestCode.SEND_REPLY_MESSAGE_V2: lambda ext, body: _send(ext, "b"),
    RequestCode.CONSUMER_SEND_MSG_BACK: lambda ext, body: ((group_resource(ext.get("group")), SUB),),
    RequestCode.PULL_MESSAGE: lambda ext, body: ((ext.get("topic") or "", SUB), (group_resource(ext.get("consumerGroup")), SUB)),
    RequestCode.LITE_PULL_MESSAGE: lambda ext, body: ((ext.get("topic") or "", SUB), (group_resource(ext.get("consumerGroup")), SUB)),
    RequestCode.POP_MESSAGE: lambda ext, body: _pop(ext),
    RequestCode.ACK_MESSAGE: lambda ext, body: _pop(ext),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: lambda ext, body: _pop(ext),
    RequestCode.BATCH_ACK_MESSAGE: _batch_ack,
    RequestCode.QUERY_MESSAGE: lambda ext, body: ((ext.get("topic") or "", SUB),),
    RequestCode.HEART_BEAT: _heartbeat,
    RequestCode.UNREGISTER_CLIENT: lambda ext, body: ((group_resource(ext["consumerGroup"]), SUB),) if ext.get("consumerGroup") else (),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: lambda ext, body: ((group_resource(ext.get("consumerGroup")), SUB),),
    RequestCode.UPDATE_CONSUMER_OFFSET: lambda ext, body: ((group_resource(ext.get("consumerGroup")), SUB), (ext.get("topic") or "", SUB)),
    RequestCode.QUERY_CONSUMER_OFFSET: lambda ext, body: ((group_resource(ext.get("consumerGroup")), SUB), (ext.get("topic") or "", SUB)),
}
RESOURCES = {int(k): v for k, v in RESOURCES.items()}


# --- the accounts and rules ------------------------------------------------------------------------------------------
@attrs.define(eq=False)
class Account:
    """One account of plain_acl.yml (PlainAccessResource), with its permission answers memoised."""
    access_key: str
    secret_key: str = attrs.field(repr=False)
    white: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    perms: dict  # resource (topic, or a group as its retry topic) -> permission bits
    key: SigningKey = attrs.field(repr=False, default=None)
    _memo: dict = attrs.field(factory=dict, repr=False)

    def __attrs_post_init__(self):
        self.key = SigningKey(self.secret_key)

    def refusal(self, resource: str, needed: int) -> str | None:
        """None when the account may use `resource` for `needed`, else why not (checkPerm)."""
        key = (resource, needed)
        try:
            return self._memo[key]
        except KeyError:
            pass
        why = None
        if not (self.admin and not self.perms):  # an admin with no listed resources owns them all
            is_group = resource.startswith(RETRY)
            owned = self.perms.get(resource)
            source = "its permission"
            if owned is None:
                owned = self.default_group_perm if is_group else self.default_topic_perm
                source = "defaultGroupPerm" if is_group else "defaultTopicPerm"
            if not check_permission(needed, owned):
                why = (f"No default permission for {describe(resource)}: accessKey={self.access_key} needs "
                       f"{perm_name(needed)} on {describe(resource)} but {source} there is {perm_name(owned)}")
        if len(self._memo) < 4096:
            self._memo[key] = why
        return why


@attrs.frozen
class AclFile:
    """One loaded ACL file: plainAclFile, or a .yml/.yaml under $ROCKETMQ_HOME/conf/acl."""
    path: str
    global_white: tuple  # AddressPattern, ...
    accounts: dict  # accessKey -> Account
    data_version: DataVersion
    raw: dict  # the file's data, for getAclConfig


@attrs.frozen
class AclRules:
    """The rules of every ACL file the broker reads, plainAclFile first (PlainPermissionManager's
    maps); replaced whole when a file changes, appears or goes (`generation` counts)."""
    generation: int
    files: tuple  # AclFile, ...
    global_white: tuple  # every file's globalWhiteRemoteAddresses
    accounts: dict  # accessKey -> Account, from every file
    file_of: dict  # accessKey -> the path of the file that defines it

    @property
    def data_version(self) -> DataVersion:
        """plainAclFile's data version (RocketMQ's deprecated single `version`)."""
        return self.files[0].data_version

    def globally_white(self, ip: str) -> bool:
        return any(p.match(ip) for p in self.global_white)


def merge_rules(files, generation: int) -> AclRules:
    """The rules of these loaded files; an account defined in two of them is an AclFileError naming
    both (RocketMQ 4.9 keeps the first and only warns: here the files must be fixed)."""
    accounts: dict[str, Account] = {}
    file_of: dict[str, str] = {}
    for f in files:
        for ak, account in f.accounts.items():
            if ak in file_of:
                raise AclFileError(f"accessKey {ak!r} is defined in both {file_of[ak]} and {f.path}: an account "
                                   "may be defined in one ACL file only")
            accounts[ak], file_of[ak] = account, f.path
    return AclRules(generation, tuple(files), tuple(p for f in files for p in f.global_white), accounts, file_of)


class AclFileError(ConfigError):
    """plain_acl.yml does not load; the message names the file and line."""


def acl_refused(remark: str) -> RequestRefused:
    return RequestRefused("AclException: " + remark)


def signature_failed(access_key: str) -> RequestRefused:
    return acl_refused(f"Check signature failed for accessKey={access_key}: the request's Signature does not "
                    f"match the content signed with the secretKey of accessKey={access_key}")
