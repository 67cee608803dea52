"""HAService: replication's owner in a store (RocketMQ's HAService), its acceptor and the
SYNC_MASTER wait (GroupTransferService).

Controller mode (docs/failover.md, "Replication in controller mode"): the broker's ReplicasManager
sets `controller_mode` (or calls change_to_master / change_to_slave, which set it) and drives the
role; slaves connect with a handshake naming the master epoch they expect, the master knows each
by broker id, proposes sync state set changes through `on_sync_state_set_change` (a checker
thread), and a SYNC_MASTER put's wait is resolved by `confirm_offset()` — what the confirmed set
acknowledged — instead of any one slave's acknowledgement."""
from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import threading
import time

from rmq_core.config import DEFAULT_SERVER_SOCKET_BACKLOG, BrokerRole
from rmq_core.errors import StoreError
from rmq_core.store.ha.ha_client import HAClient
from rmq_core.store.ha.epoch import EPOCH_FILE_NAME, EpochFileCache
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
        # -- controller mode (False: manual mode, RocketMQ 4's replication, unchanged) --
        # The store learns it from its broker (enableControllerMode): the broker sets this before
        # the store starts, and change_to_master / change_to_slave set it too.
        self.controller_mode = False
        self.epoch_cache: EpochFileCache | None = None  # loaded with the store (load_epoch_cache)
        self.broker_id = -1  # this replica's id in its group
        self.master_epoch = 0  # as a master: the epoch the controller gave it
        self.sync_state_set: frozenset[int] = frozenset()  # the controller-confirmed set
        self.sync_state_set_epoch = 0
        # fn(proposed: set[int]) -> None, set by the broker: sends ALTER_SYNC_STATE_SET
        self.on_sync_state_set_change = None
        # broker id -> monotonic time it was last caught up (a member counts as caught up when it
        # enters the confirmed set)
        self._caught_up_at: dict[int, float] = {}
        self._role_lock = threading.RLock()
        self._was_slave = self.config.broker_role is BrokerRole.SLAVE
        self.sync_state_checker = SyncStateSetChecker(self)

    def load_epoch_cache(self) -> None:
        """The epoch file under storePathRootDir (at the store's load: a garbled file stops it)."""
        self.epoch_cache = EpochFileCache(os.path.join(self.config.store_path_root_dir, EPOCH_FILE_NAME))

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
            self._start_master()
        else:
            if self.config.ha_master_address:
                self.ha_client.update_master_address(self.config.ha_master_address)
            self.ha_client.start()

    def _start_master(self) -> None:
        """Listen for slaves (unless listening already) and run the SYNC_MASTER wait."""
        if self.acceptor is None:
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

    def shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        self.ha_client.shutdown()
        self.sync_state_checker.shutdown()
        self._close_acceptor_and_connections()
        self.group_transfer.shutdown()

    def _close_acceptor_and_connections(self) -> None:
        if self.acceptor is not None:
            self.acceptor.shutdown()
            self.acceptor = None
        conns = list(self.connections)
        for conn in conns:
            conn.close()
        for conn in conns:
            conn.join()

    # -- controller mode: roles ------------------------------------------------------------------
    def change_to_master(self, epoch: int, broker_id: int, sync_state_set: set[int],
                         sync_state_set_epoch: int) -> None:
        """Become the master of `epoch` (config.broker_role is SYNC_MASTER already): the HA client
        stops; a log that ends inside a record (a slave's last transfer chunk) is cut at its
        last whole record; epoch entries past the log end go and ⟨epoch, max offset⟩ is
        appended when the epoch is newer; slaves are listened for (haListenPort rules, as at
        start); the controller-confirmed set is kept.  Slaves connected under another epoch are
        dropped (they reconnect with the new one)."""
        with self._role_lock:
            cache = self.epoch_cache
            if epoch < cache.last_epoch():
                raise ValueError(f"change_to_master: epoch {epoch} is older than this log's last epoch "
                                 f"{cache.last_epoch()}")
            self.controller_mode = True
            self.broker_id = broker_id
            self.ha_client.shutdown()
            store = self.store
            if self._was_slave:
                store.cut_partial_record()
                self._was_slave = False
            end = store.commit_log.get_max_offset()
            cache.truncate_from(end + 1)
            if epoch > cache.last_epoch():
                cache.append(epoch, end)
            if epoch != self.master_epoch:
                for conn in list(self.connections):
                    conn.close()
                self._caught_up_at = {}
            self.master_epoch = epoch
            self.push_to_slave_max_offset = min(self.push_to_slave_max_offset, end)
            self.transferred_offset = min(self.transferred_offset, end)
            self.set_sync_state_set(sync_state_set, sync_state_set_epoch)
            if self._started:
                self._start_master()
                self.sync_state_checker.start()
            store._refresh_put_path()
            log.info("HA: master of epoch %d (broker id %d) from offset %d, sync state set %s", epoch, broker_id,
                     end, sorted(self.sync_state_set))

    def change_to_slave(self, master_ha_addr: str | None, master_epoch: int, broker_id: int) -> None:
        """Become a slave of the master of `master_epoch` at master_ha_addr (config.broker_role is
        SLAVE already): the acceptor and every slave connection close (puts waiting on them are
        answered SERVICE_NOT_AVAILABLE), then the HA client connects with the handshake, cuts
        this log to the consistent point and replicates.  Called again with another address or
        epoch, the current connection is dropped at once."""
        with self._role_lock:
            self.controller_mode = True
            self.broker_id = broker_id
            self._was_slave = True
            self.master_epoch = 0
            self.store._refresh_put_path()  # no put is taken from here on
            self._close_acceptor_and_connections()
            self.group_transfer.fail_waiting(PutMessageStatus.SERVICE_NOT_AVAILABLE)
            self.sync_state_set, self.sync_state_set_epoch = frozenset(), 0
            if master_ha_addr:
                self.ha_client.update_master(master_ha_addr, master_epoch, broker_id)
            else:  # the new master's address comes later: follow nobody until then
                self.ha_client.update_master_address(None)
            if self._started:
                self.ha_client.start()

    # -- controller mode: the sync state set -----------------------------------------------------
    def set_sync_state_set(self, ids: set[int], epoch: int) -> None:
        """The set the controller confirmed (its syncStateSetEpoch `epoch`): only it counts for
        acknowledgements.  An older epoch than the one held is ignored."""
        if epoch < self.sync_state_set_epoch:
            log.info("HA: sync state set %s of epoch %d ignored (holding epoch %d)", sorted(ids), epoch,
                     self.sync_state_set_epoch)
            return
        new = frozenset(int(i) for i in ids)
        old = self.sync_state_set
        changed = new != old
        now = time.monotonic()
        for bid in new:  # a new member, or one never seen, is caught up as of now
            if bid not in old or bid not in self._caught_up_at:
                self._caught_up_at[bid] = now
        self.sync_state_set, self.sync_state_set_epoch = new, epoch
        if changed:
            self.store._refresh_put_path()  # (minInSyncReplicas)
        if self.is_master:
            self.group_transfer.on_ack(self.confirm_offset())  # a smaller set may answer waiting puts

    def in_sync_replicas_refusal(self) -> str | None:
        """Why a controller-mode master refuses puts now (its confirmed set is smaller than
        minInSyncReplicas), else None."""
        if not self.controller_mode or not self.is_master:
            return None
        need = self.config.min_in_sync_replicas
        sss = self.sync_state_set
        if len(sss) >= need:
            return None
        return (f"sync state set {sorted(sss)} has {len(sss)} replica(s), fewer than minInSyncReplicas {need}: "
                f"writes are refused until replicas catch up")

    def slave_ack_offset(self, broker_id: int) -> int | None:
        """What replica `broker_id` acknowledged over its live connection (None: not connected)."""
        conn = self._member_connections().get(broker_id)
        return None if conn is None else conn.slave_ack_offset

    def _member_connections(self) -> dict[int, HAConnection]:
        """Broker id -> its live connection (handshaken)."""
        return {c.slave_broker_id: c for c in self.connections if c.slave_broker_id >= 0 and not c.closed}

    def confirm_offset(self) -> int:
        """The offset a controller-mode master's puts count as acknowledged up to:
        allAckInSyncStateSet: the lowest acknowledgement of the confirmed members other than
        itself (its own max offset alone); else the (minInSyncReplicas - 1)-th highest of
        theirs (its own max offset for minInSyncReplicas <= 1).  A member without a connection
        acknowledged nothing (-1)."""
        own = self.store.commit_log.get_max_offset()
        conns = self._member_connections()
        acks = [conns[i].slave_ack_offset if i in conns else -1 for i in self.sync_state_set if i != self.broker_id]
        if self.config.all_ack_in_sync_state_set:
            return min(acks) if acks else own
        k = self.config.min_in_sync_replicas - 1
        if k <= 0:
            return own
        acks.sort(reverse=True)
        return acks[k - 1] if len(acks) >= k else -1

    def acked_offset(self) -> int:
        """What SYNC_MASTER puts wait for: a slave's acknowledgement (manual mode), or the
        confirmed set's (controller mode, confirm_offset)."""
        return self.confirm_offset() if self.controller_mode else self.push_to_slave_max_offset

    def on_handshake(self, conn: HAConnection) -> None:
        """A slave said who it is: an older connection of the same broker id is dropped."""
        for c in list(self.connections):
            if c is not conn and c.slave_broker_id == conn.slave_broker_id:
                log.info("HA: broker id %d reconnected from %s: dropping its connection from %s",
                         conn.slave_broker_id, conn.client_addr, c.client_addr)
                c.close()

    def proposed_sync_state_set(self) -> set[int]:
        """The set this master would have now: a member (not itself) not caught up — connected or
        not — for haMaxTimeSlaveNotCatchup leaves (a member counts as caught up when it entered
        the confirmed set); a connected non-member that is caught up (it reached this log's end
        within that time) joins."""
        now = time.monotonic()
        limit = self.config.ha_max_time_slave_not_catchup / 1000.0
        end = self.store.commit_log.get_max_offset()
        conns = self._member_connections()
        for bid, c in conns.items():
            t = now if c.slave_ack_offset >= end else c.last_caught_up  # (idle: nothing to catch up with)
            if t > self._caught_up_at.get(bid, 0.0):
                self._caught_up_at[bid] = t
        proposed = {self.broker_id}
        for bid in self.sync_state_set:
            if bid != self.broker_id and now - self._caught_up_at.get(bid, 0.0) <= limit:
                proposed.add(bid)
        for bid in conns:
            if bid not in self.sync_state_set and now - self._caught_up_at.get(bid, 0.0) <= limit:
                proposed.add(bid)
        return proposed

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
        """A slave is connected and no more than haSlaveFallbehindMax behind (RocketMQ's isSlaveOK).
        Controller mode: always (the confirmed set is waited for; a member that stays away is
        proposed out of it)."""
        if self.controller_mode:
            return True
        return bool(self.connections) and \
            master_put_where - self.push_to_slave_max_offset < self.config.ha_slave_fallbehind_max

    # -- transfer progress -----------------------------------------------------------------------
    def notify_transfer_some(self, offset: int) -> None:
        """A slave acknowledged bytes below `offset`."""
        if offset > self.push_to_slave_max_offset:
            self.push_to_slave_max_offset = offset
            if not self.controller_mode:
                self.group_transfer.on_ack(offset)
        if self.controller_mode:
            self.group_transfer.on_ack(self.confirm_offset())

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
            info = self.ha_client.runtime_info()
            if self.controller_mode:
                info["brokerId"] = self.broker_id
            return info
        conns = [c.runtime_info() for c in self.connections]
        info = {"haConnectionNum": len(conns), "haConnectionInfo": conns,
                "masterPutWhere": self.store.commit_log.get_max_offset(),
                "haPushToSlaveMaxOffset": self.push_to_slave_max_offset,
                "haListenPort": self.listen_port}
        if self.controller_mode:
            info.update({"brokerId": self.broker_id, "masterEpoch": self.master_epoch,
                         "slaveBrokerIds": sorted(c.slave_broker_id for c in self.connections
                                                  if c.slave_broker_id >= 0),
                         "syncStateSet": sorted(self.sync_state_set), "syncStateSetEpoch": self.sync_state_set_epoch,
                         "confirmOffset": self.confirm_offset()})
        return info


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


class SyncStateSetChecker(ServiceThread):
    """Controller mode, on a master: every CHECK_INTERVAL, while the set it would propose differs
    from the confirmed one, hands the proposal to the broker (HAService.on_sync_state_set_change)."""

    name = "SyncStateSetChecker"
    CHECK_INTERVAL = 0.2

    def __init__(self, service: HAService):
        super().__init__()
        self.service = service

    def interval(self) -> float:
        return self.CHECK_INTERVAL

    def run_once(self) -> None:
        svc = self.service
        fn = svc.on_sync_state_set_change
        if not svc.controller_mode or not svc.is_master or fn is None:
            return
        proposed = svc.proposed_sync_state_set()
        if proposed != set(svc.sync_state_set):
            fn(proposed)


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
    """The SYNC_MASTER wait (RocketMQ's GroupTransferService), pipelined as the SYNC_FLUSH group commit is:
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
        self._put_ok = _resolved(_PUT_OK)
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
        if svc.controller_mode and svc.acked_offset() >= end_offset:
            # nothing to wait for (minInSyncReplicas 1 without allAckInSyncStateSet, or alone in the set)
            return flush if flush is not None else self._put_ok
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
        acked = svc.acked_offset()
        if acked >= r.target:  # acknowledged meanwhile
            self.on_ack(acked)
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
        self.fail_waiting(PutMessageStatus.SERVICE_NOT_AVAILABLE)

    def fail_waiting(self, status: PutMessageStatus) -> None:
        """Answer every waiting put with `status` (the store stops, or a master becomes a slave)."""
        with self._lock:
            left = self._rounds + self._flush_waiting
            self._rounds, self._flush_waiting, self._open = [], [], None
        for r in left:
            _set(r.future, status)


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
