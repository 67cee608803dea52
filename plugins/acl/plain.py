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
from rmq_core.remoting.codes import RequestCode, code_name
from rmq_core.remoting.steps import RequestRefused, RequestStep

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
class AclRules:
    """One loaded plain_acl.yml; replaced whole when the file changes (`generation` counts)."""
    path: str
    generation: int
    global_white: tuple  # AddressPattern, ...
    accounts: dict  # accessKey -> Account
    data_version: DataVersion
    raw: dict  # the file's data, for getAclConfig

    def globally_white(self, ip: str) -> bool:
        return any(p.match(ip) for p in self.global_white)


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


def build_rules(path: str, text: str, generation: int) -> AclRules:
    """Parse plain_acl.yml text; AclFileError names the file, the line and what is wrong."""
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
    return AclRules(path, generation, tuple(white), accounts, dv, _plain(data))


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

    __slots__ = ("generation", "ip", "white", "accounts", "sends")

    def __init__(self, generation: int, ip: str, white: bool):
        self.generation, self.ip, self.white = generation, ip, white
        self.accounts: dict[str, tuple[Account, bool]] = {}  # accessKey -> (account, address passes)
        # (accessKey, topic) -> the account whose signature a lane's send still needs (None: none
        # needed), for the sends whose account and permission passed: one look-up per send
        self.sends: dict[tuple[str, str], Account | None] = {}


_CONN_KEY = "acl.plain"


def _refused(remark: str) -> RequestRefused:
    return RequestRefused("AclException: " + remark)


def _signature_failed(access_key: str) -> RequestRefused:
    return _refused(f"Check signature failed for accessKey={access_key}: the request's Signature does not "
                    f"match the content signed with the secretKey of accessKey={access_key}")


_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)


class PlainAccessValidator(RequestStep):
    """The broker-side request step of aclEnable=true with the plain validator (see the module)."""

    def __init__(self, acl_file: str, *, poll_interval: float = 0.5):
        self.path = os.path.abspath(acl_file)
        self.poll_interval = poll_interval
        self._lock = threading.Lock()  # the admin commands' read-modify-write of the file
        self._reloading = threading.Lock()  # the watcher's and an admin command's reloads, one at a time
        self._generation = 0
        self._last_text: str | None = None
        self._seen_text: str | None = None  # the watcher's last read of a changed file, not loaded yet
        if not os.path.exists(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a", encoding="utf-8"):
                pass
            log.warning("ACL: %s did not exist; created it empty: every request is refused until it names "
                        "accounts or globalWhiteRemoteAddresses", self.path)
        self.rules = self._load_text(self._read())
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="rmq-acl-watch", daemon=True)
        self._watcher.start()
        log.info("ACL: plain validator loaded %s (%d accounts, %d global white addresses)", self.path,
                 len(self.rules.accounts), len(self.rules.global_white))

    # --- the request step ---------------------------------------------------------------------------
    def before(self, remote_addr, request, connection=None) -> None:
        signed_send = getattr(request, "signed_send", None)
        if signed_send is not None:  # a send the broker's lane parsed: its signed values as they are there
            values = signed_send(signed_order)
            if values is not None:
                self.check_signed_send(connection, *values)
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

    def check_signed_send(self, connection, topic: str, access_key: str, signature: bytes, content: bytes,
                          body: bytes) -> None:
        """before() of a SEND_MESSAGE_V2 the broker's send lane parsed already: its topic, AccessKey,
        Signature, the signed content (rmq_core.acl's order) and body - the same checks, one
        keyed hash, the account and permission the connection cached (send_lane.pyx: LaneRequest.signed_send)."""
        state = connection.attributes.get(_CONN_KEY)
        if state is not None and state.generation == self.rules.generation:
            account = state.sends.get((access_key, topic), False)
            if account is not False:  # (passed before on this connection under these rules)
                if account is not None and not hmac.compare_digest(signature, account.key.signature(content, body)):
                    raise _signature_failed(access_key)
                return
        state = self._connection_state(None, connection)
        if state.white:
            return
        account = self._account(state, access_key, _SEND_V2)
        if account is not None:
            if not hmac.compare_digest(signature, account.key.signature(content, body)):
                raise _signature_failed(access_key)
            self._check(account, _SEND_V2, _send_of(topic))
        if len(state.sends) < 4096:
            state.sends[(access_key, topic)] = account

    def _connection_state(self, remote_addr, connection) -> _ConnectionAcl:
        """What the connection's attributes cache under the current rules (made anew when they changed)."""
        rules = self.rules
        attributes = connection.attributes if connection is not None else {}
        state = attributes.get(_CONN_KEY)
        if state is None or state.generation != rules.generation:
            ip = host_of(getattr(connection, "remote_address", None) or remote_addr)
            state = attributes[_CONN_KEY] = _ConnectionAcl(rules.generation, ip, rules.globally_white(ip))
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
                               f"{os.path.basename(rules.path)}")
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

    # --- the file --------------------------------------------------------------------------------------
    def _read(self) -> str:
        with open(self.path, encoding="utf-8") as f:
            return f.read()

    def _load_text(self, text: str) -> AclRules:
        """The rules of `text` (AclFileError when it does not load)."""
        self._generation += 1
        rules = build_rules(self.path, text, self._generation)
        self._last_text = text
        return rules

    def reload(self) -> bool:
        """Re-read the file when its text changed: True when new rules took effect."""
        with self._reloading:
            return self._reload()

    def _reload(self, settle: bool = False) -> bool:
        try:
            text = self._read()
        except OSError as e:
            if self._last_text is not None:
                log.error("ACL: cannot read %s (%s); keeping the last good rules", self.path, e.strerror)
                self._last_text = None  # logged once; tried again on the next poll
            return False
        if text == self._last_text:
            return False
        if settle and text != self._seen_text:
            # a file rewritten in place may be read half written (even empty): the watcher takes a
            # new text once two polls read the same one
            self._seen_text = text
            return False
        try:
            rules = self._load_text(text)
        except AclFileError as e:
            log.error("ACL: %s; keeping the last good rules", e)
            self._last_text = text  # logged once per bad content
            return False
        self.rules = rules
        log.info("ACL: reloaded %s (%d accounts, %d global white addresses)", self.path, len(rules.accounts),
                 len(rules.global_white))
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
    def update_access_config(self, config: dict) -> None:
        """Create or update one account (keys as plain_acl.yml); AclError names what is wrong."""
        ak = config.get("accessKey")
        with self._lock:
            data = self._file_data()
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
            self._write(data)

    def delete_access_config(self, access_key: str) -> bool:
        """Remove an account; False when there is none by that key."""
        with self._lock:
            data = self._file_data()
            accounts = data.get("accounts") or []
            kept = [a for a in accounts if not (isinstance(a, dict) and str(a.get("accessKey")) == access_key)]
            if len(kept) == len(accounts):
                return False
            data["accounts"] = kept
            self._write(data)
            return True

    def update_global_white_addrs(self, addresses: Iterable[str], acl_file: str | None = None) -> None:
        if acl_file and os.path.abspath(acl_file) != self.path:
            raise AclError(f"the ACL file {acl_file} is not this broker's; its plainAclFile is {self.path}")
        addresses = [a.strip() for a in addresses if a and a.strip()]
        for a in addresses:
            try:
                parse_address_pattern(a)
            except ValueError as e:
                raise AclError(str(e)) from None
        with self._lock:
            data = self._file_data()
            data["globalWhiteRemoteAddresses"] = addresses
            self._write(data)

    def version(self) -> tuple[DataVersion, dict[str, DataVersion]]:
        """The rules' data version and the version of each file (here: the one plainAclFile)."""
        dv = self.rules.data_version
        return dv, {self.path: dv}

    def all_config(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_ACL_CONFIG's body: globalWhiteAddrs and plainAccessConfigs."""
        raw = self.rules.raw
        configs = []
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
        return {"globalWhiteAddrs": [str(w) for w in _list(raw.get("globalWhiteRemoteAddresses"))],
                "plainAccessConfigs": configs}

    def _file_data(self) -> dict:
        """The file as it is now (a bad file is refused: an update must not lose what it holds)."""
        self.reload()
        text = self._read()
        try:
            build_rules(self.path, text, 0)
        except AclFileError as e:
            raise AclError(f"{e}; fix the file before changing it with an admin command") from None
        data = yaml.safe_load(text) if text.strip() else {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict) -> None:
        """Write with the next dataVersion (replaced by rename: a reader never sees half a file),
        then take the new rules at once."""
        dv = DataVersion.from_json((_list(data.get("dataVersion")) or [None])[0])
        dv.next_version()
        data["dataVersion"] = [dv.to_json()]
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
        atomic_write(self.path, text.encode("utf-8"), mode=0o600)  # (it holds secret keys)
        self.reload()


def _str_or_none(v):
    return None if v is None else str(v)


def create_plain_validator(broker_config) -> PlainAccessValidator:
    """The `plain` entry of rmq_access_validators: the broker's plainAclFile."""
    path = broker_config.plain_acl_file
    if not path:
        raise ConfigError("aclEnable=true needs plainAclFile (or ROCKETMQ_HOME, for $ROCKETMQ_HOME/conf/plain_acl.yml)")
    return PlainAccessValidator(path)


__all__ = ["PlainAccessValidator", "AclRules", "Account", "build_rules", "create_plain_validator",
           "ADMIN_CODES", "DENY", "PUB", "SUB", "ANY", "check_permission"]
