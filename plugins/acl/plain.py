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

from rmq_core.acl import ACCESS_KEY, SIGNATURE, signed_order
from rmq_core.errors import ConfigError
from rmq_core.remoting.codes import RequestCode, ResponseCode, code_name
from rmq_core.remoting.steps import RequestRefused, RequestStep
from rmq_core._native.send_lane import SignedSendCheck

from .admin_writes import AclAdminWrites
from .connection_cache import CONN_KEY, connection_state, signing_account
from .permissions import ADMIN_CODES, PUB, RESOURCES, TRACE_TOPIC, Account, acl_refused, send_of, signature_failed

log = logging.getLogger("rmq.acl")

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
        raise acl_refused(f"bad authorization header {value[:120]!r}: expected 'MQv2-HMAC-SHA1 Credential=<accessKey>, "
                       f"SignedHeaders=x-mq-date-time, Signature=<hex>'")
    return fields["Credential"].split("/", 1)[0], fields["Signature"]


class PlainAccessValidator(AclAdminWrites, RequestStep):
    """The broker-side request step of aclEnable=true with the plain validator (see the module)."""

    def __init__(self, acl_file: str, *, acl_dir: str | None = None, poll_interval: float = 0.5):
        super().__init__(acl_file, acl_dir, poll_interval)
        log.info("ACL: plain validator loaded %s (%d accounts, %d global white addresses)",
                 ", ".join(f.path for f in self.rules.files), len(self.rules.accounts), len(self.rules.global_white))

    # --- the request step ---------------------------------------------------------------------------
    def lane_check(self, connection, fallback):
        """This check as the native send lane of `connection` runs it (send_lane.SignedSendCheck):
        signed sends checked natively against what check_signed_send cached for the connection,
        the rest - and every miss - through `fallback` (this step's before())."""
        def refill(check):
            state = connection.attributes.get(CONN_KEY)
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
        state = connection_state(self.rules, remote_addr, connection)
        if state.white:
            return
        ext = request.ext_fields
        code = request.code
        account = signing_account(state, ext.get(ACCESS_KEY) if ext else None, code)
        if account is None:
            return
        body = request.body
        signature = ext.get(SIGNATURE)
        if signature is None or not hmac.compare_digest(signature, account.key.sign(ext, body)):
            raise signature_failed(account.access_key)
        resources = RESOURCES.get(code)
        if resources is None:
            self._check(account, code, ())
            return
        try:
            needed = resources(ext, body)
        except Exception as e:  # an unparsable heartbeat body: nothing to check it against
            raise acl_refused(f"cannot tell the resources of {code_name(code)} from accessKey={account.access_key}: "
                           f"{type(e).__name__}: {e}") from None
        self._check(account, code, needed)

    def check_signed_send(self, connection, request, topic: str, access_key: str) -> None:
        """before() of a SEND_MESSAGE_V2 the broker's send lane parsed already (a LaneRequest with
        its topic and AccessKey): the same checks, the signature verified natively over the parsed
        values (LaneRequest.signed_by); what passed is cached for the connection, where the lane's
        native check (lane_check) finds it."""
        state = connection_state(self.rules, None, connection)
        if state.white:
            account = None
        else:
            account = signing_account(state, access_key, _SEND_V2)
            if account is not None:
                if not request.signed_by(account.key.native, signed_order):
                    raise signature_failed(access_key)
                self._check(account, _SEND_V2, send_of(topic))
        if len(state.sends) < 4096:
            state.sends[(access_key, topic)] = None if account is None else account.key.native

    def check_grpc(self, remote_addr: str, authorization: str | None, date_time: str | None, what: str,
                   needed) -> None:
        """A RocketMQ 5 gRPC request (rmq_core/proxy): the same accounts, address rules and
        permission decision as a remoting request's; only the signature differs - the
        `authorization` header `MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
        Signature=<hex HmacSHA1(secretKey, x-mq-date-time)>`.  `what`: the RPC, for the remarks;
        `needed`: (resource, permission) pairs as RESOURCES gives them.  Raises RequestRefused
        with code NO_PERMISSION for a permission refusal, SYSTEM_ERROR for a missing or bad credential."""
        state = connection_state(self.rules, remote_addr, None)
        if state.white:
            return
        access_key, signature = parse_v2_authorization(authorization) if authorization else (None, None)
        account = signing_account(state, access_key, what)
        if account is None:
            return
        expected = hmac.new(account.secret_key.encode("utf-8"), (date_time or "").encode("utf-8"), "sha1").hexdigest()
        if not date_time or not hmac.compare_digest(expected, (signature or "").lower()):
            raise acl_refused(f"Check signature failed for accessKey={account.access_key}: the authorization "
                           f"Signature does not match x-mq-date-time signed with the secretKey of "
                           f"accessKey={account.access_key}")
        try:
            self._check(account, -1, needed)
        except RequestRefused as e:
            raise RequestRefused(e.remark, _NO_PERMISSION) from None

    @staticmethod
    def _check(account: Account, code: int, needed) -> None:
        """An admin code's admin flag, then each (resource, permission) the request needs."""
        if code in ADMIN_CODES and not account.admin:
            raise acl_refused(f"Need admin permission for request code={code}, but accessKey={account.access_key} is "
                           f"not: {code_name(code)} needs an account with admin: true")
        if (TRACE_TOPIC, PUB) in needed:
            return  # message trace may always publish (RocketMQ skips RMQ_SYSTRACE_TOPIC)
        for resource, perm in needed:
            why = account.refusal(resource, perm)
            if why is not None:
                raise acl_refused(why)


def create_plain_validator(broker_config) -> PlainAccessValidator:
    """The `plain` entry of rmq_access_validators: the broker's plainAclFile."""
    path = broker_config.plain_acl_file
    if not path:
        raise ConfigError("aclEnable=true needs plainAclFile (or ROCKETMQ_HOME, for $ROCKETMQ_HOME/conf/plain_acl.yml)")
    home = broker_config.rocketmq_home
    return PlainAccessValidator(path, acl_dir=os.path.join(home, "conf", "acl") if home else None)


__all__ = ["PlainAccessValidator", "create_plain_validator", "parse_v2_authorization"]
