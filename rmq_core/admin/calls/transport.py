"""AdminTransport: the admin client's connections (one blocking socket per concurrent caller and
address, the ACL signer among its request steps) and its request helpers, which turn every failure
into an AdminError naming what was asked of whom."""
from __future__ import annotations

import os
import threading
import time
from typing import Mapping, Sequence

from rmq_core.acl import signer_from
from rmq_core.admin.values import NO_NAMESRV, AdminError
from rmq_core.errors import RemotingError
from rmq_core.remoting.blocking import BlockingChannelPool
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand


class AdminTransport:
    """What every family of admin calls sends through (AdminClient's constructor and close).

    namesrv: 'host:port' or 'host:port;host:port' (else NAMESRV_ADDR from the environment), or an
    embedded cluster's `inproc://` address.
    """

    def __init__(self, namesrv: str | None = None, *, timeout: float = 5.0, request_steps=(),
                 access_key: str | None = None, secret_key: str | None = None, require_namesrv: bool = True):
        namesrv = namesrv or os.environ.get("NAMESRV_ADDR")
        if not namesrv and require_namesrv:
            raise AdminError(NO_NAMESRV)
        # (require_namesrv=False: the controller's calls need none; a name server call then raises)
        self.namesrv_addrs = [a.strip() for a in (namesrv or "").split(";") if a.strip()]
        self.timeout = timeout
        # request_steps: its own client-side steps (rmq_core.remoting.RequestStep), on every request;
        # access_key / secret_key add an ACL signer (as mqadmin's AclClientRPCHook), last
        signer = signer_from(access_key, secret_key, owner="AdminClient")
        self._request_steps = tuple(request_steps or ()) + ((signer,) if signer is not None else ())
        self._pool = BlockingChannelPool(max_per_address=8, connect_timeout=min(timeout, 3.0),
                                         request_steps=self._request_steps)
        self._producer = None
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.shutdown()
            self._producer = None
        self._pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- transport ----------------------------------------------------------------------------------------
    def invoke(self, addr: str, code: int, ext: Mapping | None = None, body: bytes | None = None,
               *, timeout: float | None = None, what: str = "") -> RemotingCommand:
        """One request to `addr`; returns the response whatever its code (callers check it).
        Connection failures and timeouts raise AdminError naming the address."""
        request = RemotingCommand.create_request(code, ext, body)
        request.language = "PYTHON"  # our broker then passes LZ4 bodies through (we decompress them)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while True:
                response = self._pool.invoke(addr, request, timeout)
                if response is not None:
                    return response
                if time.monotonic() > deadline:  # every connection to addr busy all along
                    raise AdminError(f"{what or 'request'}: every connection to {addr} stayed busy for {timeout:g}s")
                time.sleep(0.005)
        except RemotingError as e:
            raise AdminError(f"{what + ': ' if what else ''}{e}") from None

    def _call(self, addr: str, code: int, ext: Mapping | None = None, body: bytes | None = None, *,
              what: str, ok: Sequence[int] = (ResponseCode.SUCCESS,), timeout: float | None = None) -> RemotingCommand:
        """invoke, and raise AdminError("<what> on <addr>: <remark>") unless the code is in `ok`."""
        response = self.invoke(addr, code, ext, body, timeout=timeout, what=what)
        if response.code not in ok:
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise AdminError(f"{what}: {addr} does not support request code {code} ({RequestCode(code).name})")
            raise AdminError(f"{what} on {addr} failed: {response.remark or f'response code {response.code}'}")
        return response

    def _namesrv_call(self, code: int, ext: Mapping | None = None, body: bytes | None = None, *, what: str,
                      ok: Sequence[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """A request to the first name server that answers."""
        if not self.namesrv_addrs:
            raise AdminError(NO_NAMESRV)
        errors = []
        for addr in self.namesrv_addrs:
            try:
                response = self.invoke(addr, code, ext, body, what=what)
            except AdminError as e:
                errors.append(str(e))
                continue
            if response.code not in ok:
                raise AdminError(f"{what}: {response.remark or f'response code {response.code}'}")
            return response
        raise AdminError(f"{what}: no name server answered ({'; '.join(errors)})")
