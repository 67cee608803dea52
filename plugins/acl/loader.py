"""Loading plain_acl.yml (PlainPermissionManager's parse): YAML read with the line of every value, so
an error names the file and line; an account's and a file's checks."""
from __future__ import annotations

import yaml

from rmq_core.remoting.body import DataVersion

from .address import parse_address_pattern
from .permissions import DENY, PERM_BY_NAME, Account, AclFile, AclFileError, AclRules, group_resource, merge_rules

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


def _perm(value, where: str) -> int:
    if value is None or str(value).strip() == "":
        return DENY  # RocketMQ: no default permission is DENY
    p = PERM_BY_NAME.get(str(value).strip().upper())
    if p is None:
        raise AclFileError(f"{where}: bad permission {str(value)!r} (expected DENY, PUB, SUB or PUB|SUB)")
    return p


def _line_of(value, fallback: int) -> int:
    return getattr(value, "line", 0) or fallback


def list_of(value) -> list:
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
    for item in list_of(data.get("globalWhiteRemoteAddresses")):
        try:
            white.append(parse_address_pattern(item))
        except ValueError as e:
            raise AclFileError(f"{path}:{_line_of(item, getattr(data, 'line', 1))}: globalWhiteRemoteAddresses: {e}") from None
    accounts: dict[str, Account] = {}
    for entry in list_of(data.get("accounts")):
        line = getattr(entry, "line", 0)
        where = f"{path}:{line}"
        if not isinstance(entry, dict):
            raise AclFileError(f"{where}: an account must be a mapping with accessKey, secretKey, ...")
        account = build_account(entry, path, line)
        if account.access_key in accounts:
            raise AclFileError(f"{where}: accessKey {account.access_key!r} is defined twice")
        accounts[account.access_key] = account
    versions = list_of(data.get("dataVersion"))
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
        for item in list_of(entry.get(key)):
            item_line = _line_of(item, line)
            item_where = f"{path}:{item_line}" if item_line else path
            name, eq, perm = str(item).partition("=")
            if not eq or not name.strip():
                raise AclFileError(f"{item_where}: {key}: Parse resource permission failed for "
                                   f"{'topic' if is_topic else 'group'}:{item} (expected Res=Perm, e.g. topicA=SUB)")
            resource = name.strip() if is_topic else group_resource(name.strip())
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
