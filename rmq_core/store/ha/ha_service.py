"""HAService: replication's owner in a store (RocketMQ's HAService), its acceptor and the
SYNC_MASTER wait (GroupTransferService)."""
from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import time

from rmq_core.config import DEFAULT_SERVER_SOCKET_BACKLOG, BrokerRole
from rmq_core.errors import StoreError
from rmq_core.store.ha.ha_client import HAClient
from rmq_core.store.ha.ha_connection import HAConnection
from rmq_core.store.ha.wire import close_quietly
from rmq_core.store.service import ServiceThread
from rmq_core.store.types import PutMessageStatus

log = logging.getLogger("rmq.store.ha")

_PUT_OK = PutMessageStatus.PUT_OK


def _resolved(status: PutMessageStatus) -> concurrent.futures.Future:
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_result(status)
    return f


class HAService:
    """Master: listens for slaves (from start()), one HAConnection per slave, the SYNC_MASTER
    wait.  Slave: the HAClient, connected once a master address is known
    (update_master_address, or haMasterAddress)."""

    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.connections: list[HAConnection] = []  # copy-on-write under _lock: read without it
        self._lock = threading.Lock()
        self.push_to_slave_max_offset = 0  # the highest offset a slave acknowledged
        self.transferred_offset = 0  # the highest offset sent to a slave
        self.acceptor: AcceptSocketService | None = None
        self.group_transfer = GroupTransferService(self)
        self.ha_client = HAClient(store)
        # writers with nothing to send wait here; a SYNC_MASTER put wakes them
        self._data_cond = threading.Condition(threading.Lock())
        self.idle_writers = 0
        self._started = False
        self.listen_host = store.store_host[0]  # where the acceptor binds (the broker sets its own)
        self.backlog = DEFAULT_SERVER_SOCKET_BACKLOG  # serverSocketBacklog (the broker sets its own)
        # the broker's default when haListenPort is not set: its listenPort + 1 (any port when
        # its own is any); taken, any free port serves (slaves learn it from the name server)
        self.default_listen_port: int | None = None

    @property
    def is_master(self) -> bool:
        return self.config.broker_role is not BrokerRole.SLAVE

    @property
    def listen_port(self) -> int | None:
        """The bound HA port of a master (None before start and on a slave)."""
        return self.acceptor.port if self.acceptor is not None else None

    def configured_listen_port(self) -> int | None:
        """haListenPort, else the broker's default (listenPort + 1); None: a store on its own
        that was given no port does not listen for slaves."""
        port = self.config.ha_listen_port
        return self.default_listen_port if port is None else port

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.is_master:
            host, port = self.listen_host, self.configured_listen_port()
            if port is None:
                self.group_transfer.start()  # (SYNC_MASTER puts are answered SLAVE_NOT_AVAILABLE)
                return
            try:
                try:
                    self.acceptor = AcceptSocketService(self, host, port)
                except OSError as e:
                    if self.config.ha_listen_port is not None or port == 0:
                        raise
                    log.warning("HA: default port %d (listenPort + 1) is taken (%s): listening on any free "
                                "port; slaves learn it from the name server (set haListenPort to pin one)",
                                port, e.strerror or e)
                    self.acceptor = AcceptSocketService(self, host, 0)
            except OSError as e:
                self._started = False
                raise StoreError(f"cannot listen for slaves on {host}:{port} (haListenPort, by default "
                                 f"the broker's listenPort + 1): {e.strerror or e}") from None
            self.acceptor.start()
            self.group_transfer.start()
        else:
            if self.config.ha_master_address:
                self.ha_client.update_master_address(self.config.ha_master_address)
            self.ha_client.start()

    def shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        self.ha_client.shutdown()
        if self.acceptor is not None:
            self.acceptor.shutdown()
        for conn in list(self.connections):
            conn.close()
        for conn in list(self.connections):
            conn.join()
        self.group_transfer.shutdown()

    # -- connections -----------------------------------------------------------------------------
    def add_connection(self, conn: HAConnection) -> None:
        with self._lock:
            self.connections = self.connections + [conn]

    def remove_connection(self, conn: HAConnection) -> None:
        with self._lock:
            if conn in self.connections:
                self.connections = [c for c in self.connections if c is not conn]
                log.info("HA: slave %s disconnected (%d connected)", conn.client_addr, len(self.connections))

    def connection_count(self) -> int:
        return len(self.connections)

    def is_slave_ok(self, master_put_where: int) -> bool:
        """A slave is connected and no more than haSlaveFallbehindMax behind (RocketMQ's isSlaveOK)."""
        return bool(self.connections) and \
            master_put_where - self.push_to_slave_max_offset < self.config.ha_slave_fallbehind_max

    # -- transfer progress -----------------------------------------------------------------------
    def notify_transfer_some(self, offset: int) -> None:
        """A slave acknowledged bytes below `offset`."""
        if offset > self.push_to_slave_max_offset:
            self.push_to_slave_max_offset = offset
            self.group_transfer.on_ack(offset)

    def on_transferred(self, offset: int) -> None:
        if offset > self.transferred_offset:
            self.transferred_offset = offset

    def wait_for_data(self, conn: HAConnection, timeout: float) -> None:
        """A writer that sent everything waits here until woken or `timeout`."""
        with self._data_cond:
            self.idle_writers += 1
            try:
                # a put that came between the writer's last look and now finds idle_writers set
                # only from here on: look once more before sleeping
                if conn.store.commit_log.visible_offset > conn.next_transfer_from_where:
                    return
                self._data_cond.wait(timeout)
            finally:
                self.idle_writers -= 1

    def pause(self, timeout: float) -> None:
        """A writer waits `timeout` (woken early only by wake_writers)."""
        with self._data_cond:
            self._data_cond.wait(timeout)

    def wake_writers(self) -> None:
        with self._data_cond:
            self._data_cond.notify_all()

    # -- slave side ------------------------------------------------------------------------------
    def update_master_address(self, addr: str) -> None:
        self.ha_client.update_master_address(addr)

    def runtime_info(self) -> dict:
        if not self.is_master:
            return self.ha_client.runtime_info()
        conns = [c.runtime_info() for c in self.connections]
        return {"haConnectionNum": len(conns), "haConnectionInfo": conns,
                "masterPutWhere": self.store.commit_log.get_max_offset(),
                "haPushToSlaveMaxOffset": self.push_to_slave_max_offset,
                "haListenPort": self.listen_port}


class AcceptSocketService:
    """Binds the HA port at start (so listen_port is known at once) and accepts slaves."""

    def __init__(self, service: HAService, host: str, port: int):
        self.service = service
        self.sock = socket.create_server((host, port), reuse_port=False, backlog=service.backlog)
        self.port = self.sock.getsockname()[1]
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="HAAcceptSocketService", daemon=True)
        log.info("HA: listening for slaves on %s:%d", host, self.port)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stopped = True
        close_quietly(self.sock)  # wakes accept()
        if self._thread.is_alive():
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stopped:
            try:
                sock, peer = self.sock.accept()
            except OSError:
                if self._stopped:
                    return
                log.exception("HA: accept failed")
                time.sleep(0.1)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            addr = f"{peer[0]}:{peer[1]}"
            log.info("HA: slave %s connected", addr)
            conn = HAConnection(self.service, sock, addr)
            self.service.add_connection(conn)
            conn.start()


class _Round:
    """SYNC_MASTER puts waiting for one acknowledgement: their shared Future, the offset a slave
    must acknowledge (the furthest end of its puts), the deadline, and — under SYNC_FLUSH — the
    flush Future of its furthest put (a flush Future covering it covers every earlier put)."""

    __slots__ = ("future", "target", "deadline", "flush", "replica_status")

    def __init__(self, target: int, deadline: float, flush):
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.target = target
        self.deadline = deadline
        self.flush = flush
        self.replica_status = None  # set once the slave answered (or timed out) while the flush is pending


class GroupTransferService(ServiceThread):
    """The SYNC_MASTER wait (RocketMQ's GroupTransferService), pipelined as the group commit:
    a put joins the open round — extending its target — while the transfer has not sent past
    that target yet, so every put of a burst shares one Future (the native send lane answers
    them in one write); once the transfer passed it the round is closed and the next put opens a
    new one.  A slave's acknowledgement (HAConnection's reader) resolves the rounds it covers;
    this thread only answers the rounds whose syncFlushTimeout ran out, FLUSH_SLAVE_TIMEOUT.
    Under SYNC_FLUSH a round's answer also waits for its flush Future (RocketMQ's thenCombine:
    the replica's failure wins over the flush's)."""

    name = "GroupTransferService"

    def __init__(self, service: HAService):
        super().__init__()
        self.service = service
        self._lock = threading.Lock()
        self._rounds: list[_Round] = []  # in target order; the last may be open
        self._open: _Round | None = None
        self._flush_waiting: list[_Round] = []  # acknowledged, their flush Future not done yet
        self._not_available = _resolved(PutMessageStatus.SLAVE_NOT_AVAILABLE)
        self._not_available_after: tuple | None = None  # (flush Future, its chained SLAVE_NOT_AVAILABLE)
        self.rounds_resolved = 0  # for tests and stats: puts per acknowledgement

    # -- the put side ----------------------------------------------------------------------------
    def request(self, end_offset: int, flush=None) -> concurrent.futures.Future:
        """The Future a SYNC_MASTER put ending at `end_offset` waits on (`flush`: its SYNC_FLUSH
        Future, or None): PUT_OK once a slave acknowledged it (and it is flushed),
        SLAVE_NOT_AVAILABLE at once with no slave fit to wait for."""
        svc = self.service
        if not svc.is_slave_ok(end_offset):
            return self._slave_not_available(flush)
        now = time.monotonic()
        timeout = self.timeout()
        with self._lock:
            r = self._open
            # (a round the transfer is stuck on is not joined past half its time: a put joining
            # it would be answered at the round's deadline, before its own syncFlushTimeout)
            if r is not None and svc.transferred_offset < r.target and r.deadline - now > timeout / 2:
                if end_offset > r.target:
                    r.target = end_offset
                if flush is not None:
                    r.flush = flush
            else:
                was_idle = not self._rounds and not self._flush_waiting
                r = self._open = _Round(end_offset, now + timeout, flush)
                self._rounds.append(r)
                if was_idle:
                    self.wakeup()  # the deadline thread may be sleeping a long interval
        if svc.push_to_slave_max_offset >= r.target:  # acknowledged meanwhile
            self.on_ack(svc.push_to_slave_max_offset)
        elif svc.idle_writers:
            svc.wake_writers()
        return r.future

    def timeout(self) -> float:
        return self.service.config.sync_flush_timeout / 1000.0

    def _slave_not_available(self, flush) -> concurrent.futures.Future:
        if flush is None:
            return self._not_available
        pair = self._not_available_after
        if pair is not None and pair[0] is flush:
            return pair[1]
        chained: concurrent.futures.Future = concurrent.futures.Future()
        flush.add_done_callback(lambda f: _set(chained, PutMessageStatus.SLAVE_NOT_AVAILABLE))
        self._not_available_after = (flush, chained)
        return chained

    # -- the acknowledgement side ----------------------------------------------------------------
    def on_ack(self, acked: int) -> None:
        done = []
        with self._lock:
            rounds = self._rounds
            i = 0
            while i < len(rounds) and rounds[i].target <= acked:
                i += 1
            if i:
                done = rounds[:i]
                del rounds[:i]
                if self._open is not None and self._open in done:
                    self._open = None
        for r in done:
            self._answer(r, _PUT_OK)

    def _answer(self, r: _Round, replica_status: PutMessageStatus) -> None:
        self.rounds_resolved += 1
        flush = r.flush
        if flush is None:
            _set(r.future, replica_status)
            return
        if flush.done() or replica_status is not _PUT_OK:
            _combine(r, replica_status)
            return
        r.replica_status = replica_status
        with self._lock:
            self._flush_waiting.append(r)
        flush.add_done_callback(lambda f: self._flush_done(r))

    def _flush_done(self, r: _Round) -> None:
        with self._lock:
            try:
                self._flush_waiting.remove(r)
            except ValueError:
                return  # answered by the deadline
        _combine(r, r.replica_status)

    # -- deadlines -------------------------------------------------------------------------------
    def interval(self) -> float:
        with self._lock:
            pending = [r.deadline for r in self._rounds[:1]] + [r.deadline for r in self._flush_waiting[:1]]
        if not pending:
            return 1.0
        return max(0.001, min(pending) - time.monotonic())

    def run_once(self) -> None:
        now = time.monotonic()
        expired = []
        late_flush = []
        with self._lock:
            rounds = self._rounds
            while rounds and rounds[0].deadline <= now:
                expired.append(rounds.pop(0))
            if self._open is not None and self._open in expired:
                self._open = None
            keep = []
            for r in self._flush_waiting:
                (late_flush if r.deadline <= now else keep).append(r)
            self._flush_waiting = keep
        for r in expired:
            self._answer(r, PutMessageStatus.FLUSH_SLAVE_TIMEOUT)
        for r in late_flush:  # the slave acknowledged, the disk did not flush in time
            _set(r.future, PutMessageStatus.FLUSH_DISK_TIMEOUT)

    def on_stop(self) -> None:
        with self._lock:
            left = self._rounds + self._flush_waiting
            self._rounds, self._flush_waiting, self._open = [], [], None
        for r in left:
            _set(r.future, PutMessageStatus.SERVICE_NOT_AVAILABLE)


def _combine(r: _Round, replica_status: PutMessageStatus) -> None:
    if replica_status is not _PUT_OK:
        _set(r.future, replica_status)
        return
    try:
        flushed = r.flush.result(timeout=0)
    except BaseException:  # a failed or cancelled flush: answered as a flush that did not finish
        flushed = PutMessageStatus.FLUSH_DISK_TIMEOUT
    _set(r.future, flushed)


def _set(future: concurrent.futures.Future, status: PutMessageStatus) -> None:
    try:
        future.set_result(status)
    except concurrent.futures.InvalidStateError:
        pass  # answered already (a deadline and an acknowledgement raced)
