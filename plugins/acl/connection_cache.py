"""The plain validator's per-connection cache: what it learned about one connection under one
generation of the rules (the peer's address test, each account it signed with, the signed sends
that passed), kept in `connection.attributes` until the rules change."""
from __future__ import annotations

import os
from typing import Any

from rmq_core.remoting.codes import code_name

from .address import host_of
from .permissions import Account, AclRules, acl_refused

class ConnectionAcl:
    """What the validator knows about one connection under one generation of the rules."""

    __slots__ = ("rules", "ip", "white", "accounts", "sends")

    def __init__(self, rules: AclRules, ip: str, white: bool):
        self.rules, self.ip, self.white = rules, ip, white  # (made anew when the rules are replaced)
        self.accounts: dict[str, tuple[Account, bool]] = {}  # accessKey -> (account, address passes)
        # (accessKey, topic) -> the keyed hash of the account whose signature a lane's send still
        # needs (SigningKey.native; None: none needed), for the sends whose account and permission
        # passed: the lane's native check (send_lane.SignedSendCheck) reads it
        self.sends: dict[tuple[str, str], Any] = {}


CONN_KEY = "acl.plain"


def connection_state(rules: AclRules, remote_addr, connection) -> ConnectionAcl:
    """What the connection's attributes cache under `rules` (made anew when they changed)."""
    attributes = connection.attributes if connection is not None else {}
    state = attributes.get(CONN_KEY)
    if state is None or state.rules is not rules:
        ip = host_of(getattr(connection, "remote_address", None) or remote_addr)
        state = attributes[CONN_KEY] = ConnectionAcl(rules, ip, rules.globally_white(ip))
    return state


def signing_account(state: ConnectionAcl, access_key: str | None, code) -> Account | None:
    """The account a request from this connection signed with (cached for the connection), or
    None when its address passes that account unsigned; refused when there is none."""
    if not access_key:  # (the C++ client sends an empty AccessKey when it has no credentials)
        raise acl_refused(f"No accessKey is configured: {code_name(code)} from {state.ip} is not signed and "
                          f"{state.ip} is not in globalWhiteRemoteAddresses")
    entry = state.accounts.get(access_key)
    if entry is None:
        rules = state.rules
        account = rules.accounts.get(access_key)
        if account is None:
            raise acl_refused(f"No acl config for {access_key}: accessKey={access_key} is not an account of "
                              f"{', '.join(os.path.basename(f.path) for f in rules.files)}")
        entry = state.accounts[access_key] = (account, account.white.match(state.ip))
    account, white = entry
    return None if white else account
