"""The "plain" access validator: accounts and permissions from plain_acl.yml, as RocketMQ 4.x's
PlainAccessValidator + PlainPermissionManager.

    globalWhiteRemoteAddresses: ['10.10.103.*', '192.168.0.*']   # pass without a signature
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678
        whiteRemoteAddress:                 # addresses this account passes from unsigned
        admin: false                        # admin-only request codes need true
        defaultTopicPerm: DENY              # for topics not listed below
        defaultGroupPerm: SUB
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB]

The validator is a broker-side request step: `before(remote_addr, request, connection)` raises
RequestRefused (SYSTEM_ERROR, an AclException remark in RocketMQ's words followed by the account,
resource and permission concerned) before any processor runs.  What it learns about a connection
(the peer's address test, each account it signed with) is kept in `connection.attributes` until
the rules change.  The file is polled (read and compared) every `poll_interval` seconds, so an
in-place rewrite and a replacement by rename are both seen; a file that does not load keeps the
last good rules and logs why, with the line.
"""
from __future__ import annotations

import hmac
import logging
import os
import threading
from typing import Any, Iterable

import attrs
import yaml

from rmq_core.acl import ACCESS_KEY, SIGNATURE, SigningKey, signed_order
from rmq_core.common.files import atomic_write
from rmq_core.errors import AclError, ConfigError
from rmq_core.message import MixAll, TopicValidator
from rmq_core.remoting.body import DataVersion
from rmq_core.remoting.codes import RequestCode, ResponseCode, code_name
from rmq_core.remoting.steps import RequestRefused, RequestStep
from rmq_core._native.send_lane import SignedSendCheck

from .address import AddressPattern, host_of, parse_address_pattern

log = logging.getLogger("rmq.acl")

# Permission bits (RocketMQ's acl Permission)
DENY, ANY, PUB, SUB = 1, 2, 4, 8
_PERM_BY_NAME = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}


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

_RETRY = MixAll.RETRY_GROUP_TOPIC_PREFIX
_TRACE_TOPIC = TopicValidator.RMQ_SYS_TRACE_TOPIC


def describe(resource: str) -> str:
    """PlainAccessResource.printStr: 'topic=T' or 'group=G' (a group is kept as its retry topic)."""
    return f"group={resource[len(_RETRY):]}" if resource.startswith(_RETRY) else f"topic={resource}"


# --- what a request needs (PlainAccessValidator.parse) -------------------------------------------------
def _group(name: str | None) -> str:
    return _RETRY + (name or "")


def _send(ext, topic_key: str):
    return _send_of(ext.get(topic_key) or "")


def _send_of(topic: str):
    # a retry topic's send (a consumer's message sent back as a plain send) needs SUB on its group
    return ((topic, SUB),) if topic.startswith(_RETRY) else ((topic, PUB),)


def _pop(ext):
    """Pop consumption needs what a pull needs: SUB on the topic and on the group.  An ack names
    the topic the message is stored in, maybe the group's pop retry topic %RETRY%<group>_<topic>:
    the check is on <topic>."""
    group = ext.get("consumerGroup") or ""
    topic = ext.get("topic") or ""
    prefix = f"{_RETRY}{group}_"
    if group and topic.startswith(prefix):
        topic = topic[len(prefix):]
    return ((topic, SUB), (_group(group), SUB))


def _batch_ack(ext, body):
    """BATCH_ACK_MESSAGE: what each BatchAck of its body names (c group, t topic)."""
    import json

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
            needed.append((_group(c["group"]), SUB))
        needed.extend((s.topic, SUB) for s in c["subscriptions"])
    return needed


_RESOURCES = {
    RequestCode.SEND_MESSAGE: lambda ext, body: _send(ext, "topic"),
    RequestCode.SEND_REPLY_MESSAGE: lambda ext, body: _send(ext, "topic"),
    RequestCode.SEND_MESSAGE_V2: lambda ext, body: _send(ext, "b"),
    RequestCode.SEND_BATCH_MESSAGE: lambda ext, body: _send(ext, "b"),
    RequestCode.SEND_REPLY_MESSAGE_V2: lambda ext, body: _send(ext, "b"),
    RequestCode.CONSUMER_SEND_MSG_BACK: lambda ext, body: ((_group(ext.get("group")), SUB),),
    RequestCode.PULL_MESSAGE: lambda ext, body: ((ext.get("topic") or "", SUB), (_group(ext.get("consumerGroup")), SUB)),
    RequestCode.LITE_PULL_MESSAGE: lambda ext, body: ((ext.get("topic") or "", SUB), (_group(ext.get("consumerGroup")), SUB)),
    RequestCode.POP_MESSAGE: lambda ext, body: _pop(ext),
    RequestCode.ACK_MESSAGE: lambda ext, body: _pop(ext),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: lambda ext, body: _pop(ext),
    RequestCode.BATCH_ACK_MESSAGE: _batch_ack,
    RequestCode.QUERY_MESSAGE: lambda ext, body: ((ext.get("topic") or "", SUB),),
    RequestCode.HEART_BEAT: _heartbeat,
    RequestCode.UNREGISTER_CLIENT: lambda ext, body: ((_group(ext["consumerGroup"]), SUB),) if ext.get("consumerGroup") else (),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: lambda ext, body: ((_group(ext.get("consumerGroup")), SUB),),
    RequestCode.UPDATE_CONSUMER_OFFSET: lambda ext, body: ((_group(ext.get("consumerGroup")), SUB), (ext.get("topic") or "", SUB)),
    RequestCode.QUERY_CONSUMER_OFFSET: lambda ext, body: ((_group(ext.get("consumerGroup")), SUB), (ext.get("topic") or "", SUB)),
}
_RESOURCES = {int(k): v for k, v in _RESOURCES.items()}


# --- the rules ------------------------------------------------------------------------------------------
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
            is_group = resource.startswith(_RETRY)
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


class _Str(str):
    __slots__ = ("line",)


class _Map(dict):
    line = 0


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of each mapping and string (for errors naming it)."""


def _construct_str(loader, node):
    s = _Str(loader.construct_scalar(node))
    s.line = node.start_mark.line + 1
    return s


def _construct_map(loader, node):
    loader.flatten_mapping(node)
    m = _Map(loader.construct_pairs(node, deep=True))
    m.line = node.start_mark.line + 1
    return m


_LineLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)
_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)


class AclFileError(ConfigError):
    """plain_acl.yml does not load; the message names the file and line."""


def _perm(value, where: str) -> int:
    if value is None or str(value).strip() == "":
        return DENY  # RocketMQ: no default permission is DENY
    p = _PERM_BY_NAME.get(str(value).strip().upper())
    if p is None:
        raise AclFileError(f"{where}: bad permission {str(value)!r} (expected DENY, PUB, SUB or PUB|SUB)")
    return p


def _line_of(value, fallback: int) -> int:
    return getattr(value, "line", 0) or fallback


def _list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def build_file(path: str, text: str) -> AclFile:
    """Parse an ACL file's text; AclFileError names the file, the line and what is wrong."""
    try:
        data = yaml.load(text, Loader=_LineLoader) if text.strip() else {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise AclFileError(f"{path}{line}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    data = data if data is not None else {}
    if not isinstance(data, dict):
        raise AclFileError(f"{path}:1: expected a mapping with globalWhiteRemoteAddresses and accounts")
    white = []
    for item in _list(data.get("globalWhiteRemoteAddresses")):
        try:
            white.append(parse_address_pattern(item))
        except ValueError as e:
            raise AclFileError(f"{path}:{_line_of(item, getattr(data, 'line', 1))}: globalWhiteRemoteAddresses: {e}") from None
    accounts: dict[str, Account] = {}
    for entry in _list(data.get("accounts")):
        line = getattr(entry, "line", 0)
        where = f"{path}:{line}"
        if not isinstance(entry, dict):
            raise AclFileError(f"{where}: an account must be a mapping with accessKey, secretKey, ...")
        account = build_account(entry, path, line)
        if account.access_key in accounts:
            raise AclFileError(f"{where}: accessKey {account.access_key!r} is defined twice")
        accounts[account.access_key] = account
    versions = _list(data.get("dataVersion"))
    dv = DataVersion.from_json(versions[0]) if versions else DataVersion(0, 0)
    return AclFile(path, tuple(white), accounts, dv, _plain(data))


def build_rules(path: str, text: str, generation: int) -> AclRules:
    """The rules of one file's text (a broker that reads no other ACL file)."""
    return merge_rules([build_file(path, text)], generation)


def build_account(entry: dict, path: str, line: int = 0) -> Account:
    """One account (buildPlainAccessResource + checkPlainAccessConfig); errors name path:line."""
    where = f"{path}:{line}" if line else path
    ak, sk = entry.get("accessKey"), entry.get("secretKey")
    ak = None if ak is None else str(ak)
    sk = None if sk is None else str(sk)
    if not ak or not sk or len(ak) <= 6 or len(sk) <= 6:
        raise AclFileError(f"{where}: The accessKey={ak} and secretKey={'***' if sk else sk} cannot be null and "
                           "length should longer than 6")
    try:
        white = parse_address_pattern(entry.get("whiteRemoteAddress"))
    except ValueError as e:
        raise AclFileError(f"{where}: whiteRemoteAddress: {e}") from None
    admin = entry.get("admin", False)
    if isinstance(admin, str):
        admin = admin.strip().lower() == "true"
    perms: dict[str, int] = {}
    for key, is_topic in (("topicPerms", True), ("groupPerms", False)):
        for item in _list(entry.get(key)):
            item_line = _line_of(item, line)
            item_where = f"{path}:{item_line}" if item_line else path
            name, eq, perm = str(item).partition("=")
            if not eq or not name.strip():
                raise AclFileError(f"{item_where}: {key}: Parse resource permission failed for "
                                   f"{'topic' if is_topic else 'group'}:{item} (expected Res=Perm, e.g. topicA=SUB)")
            resource = name.strip() if is_topic else _group(name.strip())
            perms[resource] = _perm(perm, f"{item_where}: {key}: {item}")
    return Account(ak, sk, white, bool(admin), _perm(entry.get("defaultTopicPerm"), f"{where}: defaultTopicPerm"),
                   _perm(entry.get("defaultGroupPerm"), f"{where}: defaultGroupPerm"), perms)


def _plain(value):
    """The loader's line-remembering values as plain dicts, lists and strs (to write back)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


# --- the validator ----------------------------------------------------------------------------------
class _ConnectionAcl:
    """What the validator knows about one connection under one generation of the rules."""

    __slots__ = ("rules", "ip", "white", "accounts", "sends")

    def __init__(self, rules: AclRules, ip: str, white: bool):
        self.rules, self.ip, self.white = rules, ip, white  # (made anew when the rules are replaced)
        self.accounts: dict[str, tuple[Account, bool]] = {}  # accessKey -> (account, address passes)
        # (accessKey, topic) -> the keyed hash of the account whose signature a lane's send still
        # needs (SigningKey.native; None: none needed), for the sends whose account and permission
        # passed: the lane's native check (send_lane.SignedSendCheck) reads it
        self.sends: dict[tuple[str, str], Any] = {}


_CONN_KEY = "acl.plain"


def _refused(remark: str) -> RequestRefused:
    return RequestRefused("AclException: " + remark)


def _signature_failed(access_key: str) -> RequestRefused:
    return _refused(f"Check signature failed for accessKey={access_key}: the request's Signature does not "
                    f"match the content signed with the secretKey of accessKey={access_key}")


_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_NO_PERMISSION = int(ResponseCode.NO_PERMISSION)


def parse_v2_authorization(value: str) -> tuple[str, str]:
    """(access key, hex signature) of a RocketMQ 5 client's `authorization` header; a Credential
    may carry a scope after the key (`AK/...`, as some clients send it)."""
    algorithm, _, rest = value.strip().partition(" ")
    fields = {}
    for item in rest.split(","):
        k, _, v = item.strip().partition("=")
        fields[k.strip()] = v.strip()
    if algorithm != "MQv2-HMAC-SHA1" or not fields.get("Credential") or "Signature" not in fields:
        raise _refused(f"bad authorization header {value[:120]!r}: expected 'MQv2-HMAC-SHA1 Credential=<accessKey>, "
                       f"SignedHeaders=x-mq-date-time, Signature=<hex>'")
    return fields["Credential"].split("/", 1)[0], fields["Signature"]


class PlainAccessValidator(RequestStep):
    """The broker-side request step of aclEnable=true with the plain validator (see the module)."""

    def __init__(self, acl_file: str, *, acl_dir: str | None = None, poll_interval: float = 0.5):
        self.path = os.path.abspath(acl_file)  # plainAclFile: new accounts and white addresses go here
        self.acl_dir = os.path.abspath(acl_dir) if acl_dir else None  # its .yml/.yaml files, read too
        self.poll_interval = poll_interval
        self._lock = threading.Lock()  # the admin commands' read-modify-write of a file
        self._reloading = threading.Lock()  # the watcher's and an admin command's reloads, one at a time
        self._generation = 0
        self._paths: list[str] = []  # the ACL files found by the last look
        self._files: dict[str, AclFile] = {}  # path -> its last good rules
        self._texts: dict[str, str | None] = {}  # path -> the text last taken (loaded, or logged as bad)
        self._seen: dict[str, str] = {}  # path -> the watcher's last read of a changed file, not taken yet
        if not os.path.exists(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a", encoding="utf-8"):
                pass
            log.warning("ACL: %s did not exist; created it empty: every request is refused until an ACL file "
                        "names accounts or globalWhiteRemoteAddresses", self.path)
        self.rules = self._load(strict=True)
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="rmq-acl-watch", daemon=True)
        self._watcher.start()
        log.info("ACL: plain validator loaded %s (%d accounts, %d global white addresses)",
                 ", ".join(f.path for f in self.rules.files), len(self.rules.accounts), len(self.rules.global_white))

    # --- the request step ---------------------------------------------------------------------------
    def lane_check(self, connection, fallback):
        """This check as the native send lane of `connection` runs it (send_lane.SignedSendCheck):
        signed sends checked natively against what check_signed_send cached for the connection,
        the rest - and every miss - through `fallback` (this step's before())."""
        def refill(check):
            state = connection.attributes.get(_CONN_KEY)
            if state is not None:
                check.sends, check.rules = state.sends, state.rules

        return SignedSendCheck(self, signed_order, fallback, refill)

    def before(self, remote_addr, request, connection=None) -> None:
        signed_send = getattr(request, "signed_send", None)
        if signed_send is not None:  # a send the broker's lane parsed: its signed values as they are there
            values = signed_send()
            if values is not None:
                self.check_signed_send(connection, request, *values)
                return
        state = self._connection_state(remote_addr, connection)
        if state.white:
            return
        ext = request.ext_fields
        code = request.code
        account = self._account(state, ext.get(ACCESS_KEY) if ext else None, code)
        if account is None:
            return
        body = request.body
        signature = ext.get(SIGNATURE)
        if signature is None or not hmac.compare_digest(signature, account.key.sign(ext, body)):
            raise _signature_failed(account.access_key)
        resources = _RESOURCES.get(code)
        if resources is None:
            self._check(account, code, ())
            return
        try:
            needed = resources(ext, body)
        except Exception as e:  # an unparsable heartbeat body: nothing to check it against
            raise _refused(f"cannot tell the resources of {code_name(code)} from accessKey={account.access_key}: "
                           f"{type(e).__name__}: {e}") from None
        self._check(account, code, needed)

    def check_signed_send(self, connection, request, topic: str, access_key: str) -> None:
        """before() of a SEND_MESSAGE_V2 the broker's send lane parsed already (a LaneRequest with
        its topic and AccessKey): the same checks, the signature verified natively over the parsed
        values (LaneRequest.signed_by); what passed is cached for the connection, where the lane's
        native check (lane_check) finds it."""
        state = self._connection_state(None, connection)
        if state.white:
            account = None
        else:
            account = self._account(state, access_key, _SEND_V2)
            if account is not None:
                if not request.signed_by(account.key.native, signed_order):
                    raise _signature_failed(access_key)
                self._check(account, _SEND_V2, _send_of(topic))
        if len(state.sends) < 4096:
            state.sends[(access_key, topic)] = None if account is None else account.key.native

    def check_grpc(self, remote_addr: str, authorization: str | None, date_time: str | None, what: str,
                   needed) -> None:
        """A RocketMQ 5 gRPC request (rmq_core/proxy): the same accounts, address rules and
        permission decision as a remoting request's; only the signature differs - the
        `authorization` header `MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
        Signature=<hex HmacSHA1(secretKey, x-mq-date-time)>`.  `what`: the RPC, for the remarks;
        `needed`: (resource, permission) pairs as _RESOURCES gives them.  Raises RequestRefused
        with code NO_PERMISSION for a permission refusal, SYSTEM_ERROR for a missing or bad credential."""
        state = self._connection_state(remote_addr, None)
        if state.white:
            return
        access_key, signature = parse_v2_authorization(authorization) if authorization else (None, None)
        account = self._account(state, access_key, what)
        if account is None:
            return
        expected = hmac.new(account.secret_key.encode("utf-8"), (date_time or "").encode("utf-8"), "sha1").hexdigest()
        if not date_time or not hmac.compare_digest(expected, (signature or "").lower()):
            raise _refused(f"Check signature failed for accessKey={account.access_key}: the authorization "
                           f"Signature does not match x-mq-date-time signed with the secretKey of "
                           f"accessKey={account.access_key}")
        try:
            self._check(account, -1, needed)
        except RequestRefused as e:
            raise RequestRefused(e.remark, _NO_PERMISSION) from None

    def _connection_state(self, remote_addr, connection) -> _ConnectionAcl:
        """What the connection's attributes cache under the current rules (made anew when they changed)."""
        rules = self.rules
        attributes = connection.attributes if connection is not None else {}
        state = attributes.get(_CONN_KEY)
        if state is None or state.rules is not rules:
            ip = host_of(getattr(connection, "remote_address", None) or remote_addr)
            state = attributes[_CONN_KEY] = _ConnectionAcl(rules, ip, rules.globally_white(ip))
        return state

    def _account(self, state: _ConnectionAcl, access_key: str | None, code: int) -> Account | None:
        """The account a request from this connection signed with (cached for the connection), or
        None when its address passes that account unsigned; refused when there is none."""
        if not access_key:  # (the C++ client sends an empty AccessKey when it has no credentials)
            raise _refused(f"No accessKey is configured: {code_name(code)} from {state.ip} is not signed and "
                           f"{state.ip} is not in globalWhiteRemoteAddresses")
        entry = state.accounts.get(access_key)
        if entry is None:
            rules = self.rules
            account = rules.accounts.get(access_key)
            if account is None:
                raise _refused(f"No acl config for {access_key}: accessKey={access_key} is not an account of "
                               f"{', '.join(os.path.basename(f.path) for f in rules.files)}")
            entry = state.accounts[access_key] = (account, account.white.match(state.ip))
        account, white = entry
        return None if white else account

    @staticmethod
    def _check(account: Account, code: int, needed) -> None:
        """An admin code's admin flag, then each (resource, permission) the request needs."""
        if code in ADMIN_CODES and not account.admin:
            raise _refused(f"Need admin permission for request code={code}, but accessKey={account.access_key} is "
                           f"not: {code_name(code)} needs an account with admin: true")
        if (_TRACE_TOPIC, PUB) in needed:
            return  # message trace may always publish (RocketMQ skips RMQ_SYS_TRACE_TOPIC)
        for resource, perm in needed:
            why = account.refusal(resource, perm)
            if why is not None:
                raise _refused(why)

    # --- the files ------------------------------------------------------------------------------------
    def acl_files(self) -> list[str]:
        """The ACL files read (PlainPermissionManager.getAllAclFiles): plainAclFile, then every .yml
        or .yaml under the acl dir ($ROCKETMQ_HOME/conf/acl), sub-directories included, by path."""
        found = []
        if self.acl_dir and os.path.isdir(self.acl_dir):
            for root, dirs, names in os.walk(self.acl_dir):
                dirs.sort()
                found.extend(os.path.join(root, n) for n in sorted(names) if n.endswith((".yml", ".yaml")))
        return [self.path] + [f for f in found if f != self.path]

    def reload(self) -> bool:
        """Re-read the files when one changed, appeared or went: True when new rules took effect."""
        with self._reloading:
            return self._reload()

    def _load(self, strict: bool = False, settle: bool = False) -> AclRules | None:
        """The rules of the files as they are now, or None when nothing changed.  A file that does
        not load keeps its last good rules and is logged once per content (strict, at start: raised);
        with `settle` a changed text is taken once two polls read the same one (a file rewritten in
        place may be read half written, even empty)."""
        paths = self.acl_files()
        # (a file gone takes its accounts with it; a new one counts once it loads)
        changed, self._paths = bool(set(self._paths) - set(paths)), paths
        files = {}
        for path in paths:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                if strict:
                    raise AclFileError(f"cannot read the ACL file {path}: {e.strerror}") from None
                if self._texts.get(path, "") is not None:
                    log.error("ACL: cannot read %s (%s); keeping the last good rules", path, e.strerror)
                    self._texts[path] = None  # logged once; tried again on the next poll
                text = None
            if text is not None and text != self._texts.get(path):
                if settle and text != self._seen.get(path):
                    self._seen[path] = text
                else:
                    self._texts[path] = text
                    try:
                        files[path] = build_file(path, text)
                        changed = True
                        continue
                    except AclFileError as e:
                        if strict:
                            raise
                        log.error("ACL: %s; keeping the last good rules", e)
            if path in self._files:
                files[path] = self._files[path]
        if not changed:
            return None
        self._files = files
        try:
            rules = merge_rules([files[p] for p in paths if p in files], self._generation + 1)
        except AclFileError as e:
            if strict:
                raise
            log.error("ACL: %s; keeping the last good rules", e)
            return None
        self._generation += 1
        return rules

    def _reload(self, settle: bool = False) -> bool:
        rules = self._load(settle=settle)
        if rules is None:
            return False
        self.rules = rules
        log.info("ACL: reloaded %s (%d accounts, %d global white addresses)", ", ".join(f.path for f in rules.files),
                 len(rules.accounts), len(rules.global_white))
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                with self._reloading:
                    self._reload(settle=True)
            except Exception:
                log.exception("ACL: watching %s failed", self.path)

    def close(self) -> None:
        self._stop.set()
        if self._watcher.is_alive() and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)

    # --- the admin commands (updateAclConfig, deleteAclConfig, updateGlobalWhiteAddr, ...) ---------------
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
            white.extend(str(w) for w in _list(raw.get("globalWhiteRemoteAddresses")))
            for a in _list(raw.get("accounts")):
                if not isinstance(a, dict):
                    continue
                configs.append({
                    "accessKey": _str_or_none(a.get("accessKey")), "secretKey": _str_or_none(a.get("secretKey")),
                    "whiteRemoteAddress": _str_or_none(a.get("whiteRemoteAddress")), "admin": bool(a.get("admin", False)),
                    "defaultTopicPerm": _str_or_none(a.get("defaultTopicPerm")),
                    "defaultGroupPerm": _str_or_none(a.get("defaultGroupPerm")),
                    "topicPerms": [str(t) for t in _list(a.get("topicPerms"))],
                    "groupPerms": [str(g) for g in _list(a.get("groupPerms"))],
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
        dv = DataVersion.from_json((_list(data.get("dataVersion")) or [None])[0])
        dv.next_version()
        data["dataVersion"] = [dv.to_json()]
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
        atomic_write(path, text.encode("utf-8"), mode=0o600)  # (it holds secret keys)
        self.reload()


def _str_or_none(v):
    return None if v is None else str(v)


def create_plain_validator(broker_config) -> PlainAccessValidator:
    """The `plain` entry of rmq_access_validators: the broker's plainAclFile."""
    path = broker_config.plain_acl_file
    if not path:
        raise ConfigError("aclEnable=true needs plainAclFile (or ROCKETMQ_HOME, for $ROCKETMQ_HOME/conf/plain_acl.yml)")
    home = broker_config.rocketmq_home
    return PlainAccessValidator(path, acl_dir=os.path.join(home, "conf", "acl") if home else None)


__all__ = ["PlainAccessValidator", "AclRules", "AclFile", "Account", "build_rules", "build_file", "merge_rules", "create_plain_validator",
           "ADMIN_CODES", "DENY", "PUB", "SUB", "ANY", "check_permission"]
