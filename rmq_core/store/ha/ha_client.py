"""HAClient: the slave's side (RocketMQ's HAService.HAClient).

One thread (and a page-cache warmer, see WARM_AHEAD): connect to the master's HA address,
report this store's max commit-log offset, then read frames — a read's whole frames appended at
once, their bytes unchanged (CommitLog.append_data: one pwritev), then the records they
completed dispatched at once (DefaultMessageStore.dispatch_appended: consume queues, index,
listeners) — and report the new max offset after each read's frames, and at least every
haSendHeartbeatInterval.  A frame whose offset is not where this log ends, a master silent for
haHousekeepingInterval, or a broken connection: disconnect and connect again (to the latest
address given).

Controller mode (update_master): the connection opens with the handshake (wire.py) naming this
replica's broker id and the master epoch the controller gave it; the master's answer must carry
that epoch (else disconnect and retry later).  Then, on this thread, the log is cut to the point
where it and the master's agree (EpochFileCache.find_consistent_point, DefaultMessageStore.truncate_to)
before the first report; the master's epoch entries are taken as this log reaches their starts.
"""
from __future__ import annotations

import logging
import socket
import threading
import time

from rmq_core.errors import StoreError, os_error_text
from rmq_core.store.ha.epoch import EpochEntry
from rmq_core.store.ha.wire import (EPOCH_ENTRY, HANDSHAKE, HANDSHAKE_ANSWER, HANDSHAKE_REQUEST, HEADER, REPORT,
                                    close_quietly, recv_exactly)

log = logging.getLogger("rmq.store.ha")


class HAClient:
    RECONNECT_INTERVAL = 1.0  # after a failed connect or a dropped connection
    READ_BUFFER = 4 * 1024 * 1024
    # A slave's appends go into page cache its log never held: the kernel's first touch of each
    # page (allocating it, zeroing it; on a VM the host backing it) costs more than the copy, and
    # a walk of the records through the mapping would meet it as readahead zero-filling past the
    # log end.  The warmer thread brings the next WARM_AHEAD bytes of the segment into the page
    # cache while this thread receives and appends, so a catch-up uses two cores, not one.
    WARM_AHEAD = 32 * 1024 * 1024

    def __init__(self, store):
        self.store = store
        self.config = store.config
        self.master_address: str | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._warmer: threading.Thread | None = None
        self._appended = threading.Event()  # wakes the warmer
        self.connected = False
        self.master_offset = -1  # the furthest offset a frame of the master reached
        self.last_read_time = 0.0
        self.reconnects = 0  # connections made (tests: a bad frame makes it reconnect)
        self.bad_frames = 0
        # controller mode: (master epoch, this broker's id), None in manual mode
        self.controller: tuple[int, int] | None = None
        self.handshakes = 0  # handshakes the master accepted (tests)
        self.refusals = 0  # handshakes refused or answered with another epoch (tests)
        self._pending_epochs: list[EpochEntry] = []  # the master's entries past this log's end

    # -- control ---------------------------------------------------------------------------------
    def update_master_address(self, addr: str | None) -> None:
        """Connect to `addr` (host:port of the master's HA listener) from now on; a connection to
        another address is dropped."""
        addr = (addr or "").strip() or None
        if addr is not None:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"HA master address {addr!r} is not host:port")
        with self._lock:
            if addr == self.master_address:
                return
            log.info("HA: master address %s -> %s", self.master_address, addr)
            self.master_address = addr
            sock = self._sock
        close_quietly(sock)
        self._wake.set()

    def update_master(self, addr: str, master_epoch: int, broker_id: int) -> None:
        """Controller mode: replicate from the master of `master_epoch` at `addr` (its HA
        listener) as broker `broker_id`.  Any other connection is dropped at once: bytes of an
        older master are never acknowledged after this returns."""
        addr = (addr or "").strip()
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"HA master address {addr!r} is not host:port")
        with self._lock:
            if addr == self.master_address and self.controller == (master_epoch, broker_id):
                return
            log.info("HA: master %s (epoch %s) -> %s (epoch %d)", self.master_address,
                     self.controller[0] if self.controller else None, addr, master_epoch)
            self.master_address = addr
            self.controller = (master_epoch, broker_id)
            sock, self._sock = self._sock, None
        close_quietly(sock)
        self._wake.set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopped.clear()
        self._thread = threading.Thread(target=self._loop, name="HAClient", daemon=True)
        self._thread.start()
        self._warmer = threading.Thread(target=self._warm_loop, name="HAClient-warmer", daemon=True)
        self._warmer.start()

    def shutdown(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._appended.set()  # (the warmer ends at once: a slave becoming master waits on this)
        with self._lock:
            sock = self._sock
        close_quietly(sock)
        for t in (self._thread, self._warmer):
            if t is not None and t.is_alive():
                t.join(10)
        self._thread = self._warmer = None

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                addr, controller = self.master_address, self.controller
            if addr is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                sock = self._connect(addr, controller)
            except OSError as e:
                log.info("HA: cannot connect to master %s: %s", addr, os_error_text(e))
                self._wake.wait(self.RECONNECT_INTERVAL)
                self._wake.clear()
                continue
            try:
                if controller is not None:
                    self._handshake(sock, addr, controller)
                self._serve(sock, addr)
            except (OSError, StoreError) as e:
                if not self._stopped.is_set():
                    log.info("HA: connection to master %s closed: %s", addr, e)
            except Exception:
                log.exception("HA: replication from %s failed", addr)
            finally:
                with self._lock:
                    self._sock = None
                self.connected = False
                close_quietly(sock)
            if not self._stopped.is_set() and addr == self.master_address and controller == self.controller:
                self._wake.wait(self.RECONNECT_INTERVAL)
                self._wake.clear()

    def _handshake(self, sock: socket.socket, addr: str, controller: tuple[int, int]) -> None:
        """Controller mode: say who this is and which epoch it expects, read the master's epoch
        entries, cut this log to where it agrees with the master's and take the master's
        entries up to this log's end (the rest as the log reaches them)."""
        epoch, broker_id = controller
        sock.settimeout(self.config.ha_housekeeping_interval / 1000.0)
        sock.sendall(HANDSHAKE_REQUEST.pack(HANDSHAKE, broker_id, epoch))
        try:
            head = recv_exactly(sock, HEADER.size)
        except OSError as e:
            self.refusals += 1
            raise OSError(f"master {addr} refused the handshake for epoch {epoch} (not the master of that "
                          f"epoch?): {os_error_text(e)}") from None
        offset, size = HEADER.unpack(head)
        if offset != HANDSHAKE or size < HANDSHAKE_ANSWER.size:
            raise StoreError(f"master {addr} answered the handshake with a frame at {offset} of {size} bytes")
        body = recv_exactly(sock, size)
        master_epoch, master_max, n = HANDSHAKE_ANSWER.unpack_from(body, 0)
        if size != HANDSHAKE_ANSWER.size + n * EPOCH_ENTRY.size:
            raise StoreError(f"master {addr}'s handshake answer is {size} bytes for {n} epoch entries")
        if master_epoch != epoch:
            self.refusals += 1
            raise StoreError(f"master {addr} is at epoch {master_epoch}, not the expected {epoch}")
        entries = [EpochEntry(*EPOCH_ENTRY.unpack_from(body, HANDSHAKE_ANSWER.size + i * EPOCH_ENTRY.size))
                   for i in range(n)]
        store = self.store
        cache = store.ha_service.epoch_cache
        mine = store.get_max_phy_offset()
        point = cache.find_consistent_point(entries, master_max, mine)
        if 0 <= point < mine:
            log.warning("HA: this log (epochs %s, max offset %d) agrees with master %s's (epochs %s, max offset "
                        "%d) up to %d: cutting it there", cache.entries(), mine, addr, entries, master_max, point)
            store.truncate_to(point)
            mine = store.get_max_phy_offset()
        cache.truncate_from(mine + 1)
        cache.replace_suffix([e for e in entries if e.start_offset <= mine])
        self._pending_epochs = [e for e in entries if e.start_offset > mine]
        self.master_offset = -1  # (another master's frames from now on)
        self.handshakes += 1
        log.info("HA: handshake with master %s done (epoch %d, this log ends at %d)", addr, epoch, mine)

    def _take_epochs(self, mine: int) -> None:
        """The master's epoch entries this log has reached."""
        pending = self._pending_epochs
        cache = self.store.ha_service.epoch_cache
        while pending and pending[0].start_offset <= mine:
            e = pending.pop(0)
            if e.epoch > cache.last_epoch():
                cache.append(e.epoch, e.start_offset)

    def _connect(self, addr: str, controller=None) -> socket.socket:
        host, _, port = addr.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=3.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._stopped.is_set() or addr != self.master_address or controller != self.controller:
                close_quietly(sock)
                raise OSError("master address changed or client stopped")
            self._sock = sock
        self.connected = True
        self.reconnects += 1
        log.info("HA: connected to master %s", addr)
        return sock

    def _serve(self, sock: socket.socket, addr: str) -> None:
        cfg = self.config
        store = self.store
        commit_log = store.commit_log
        heartbeat = cfg.ha_send_heartbeat_interval / 1000.0
        housekeeping = cfg.ha_housekeeping_interval / 1000.0
        sock.settimeout(min(heartbeat, 1.0))
        buf = bytearray(max(self.READ_BUFFER, cfg.ha_transfer_batch_size * 2 + HEADER.size))
        view = memoryview(buf)
        used = 0
        # a log holding nothing reports 0, as RocketMQ's empty slave: the master starts it at its
        # last segment (an empty segment's offset may be one the master no longer has)
        mfq = commit_log.mapped_file_queue
        reported = 0 if mfq.holds_no_bytes() else commit_log.get_max_offset()
        sock.sendall(REPORT.pack(reported))
        last_report = self.last_read_time = time.monotonic()
        hsize = HEADER.size
        while not self._stopped.is_set():
            try:
                n = sock.recv_into(view[used:])
            except socket.timeout:
                n = -1
            if n == 0:
                raise OSError("master closed the connection")
            now = time.monotonic()
            if n > 0:
                used += n
                self.last_read_time = now
                pos = 0
                bodies = []  # the read's whole frames, appended in one call (one pwritev)
                first = expect = None
                while used - pos >= hsize:
                    offset, size = HEADER.unpack_from(buf, pos)
                    if size < 0:
                        raise StoreError(f"bad frame from master {addr}: size {size}")
                    if used - pos < hsize + size:
                        if hsize + size > len(buf):  # a master with a larger haTransferBatchSize
                            buf = _grown(buf, hsize + size, pos, used)
                            view = memoryview(buf)
                            used -= pos
                            pos = 0
                        break
                    if expect is None:
                        mine = commit_log.get_max_offset()
                        if mine != offset and not mfq.holds_no_bytes():
                            self.bad_frames += 1
                            raise StoreError(f"master {addr} sent offset {offset} but this log ends at {mine}: "
                                             f"reconnecting")
                        first = expect = offset
                    elif offset != expect:
                        self._append(bodies, first, addr)
                        self.bad_frames += 1
                        raise StoreError(f"master {addr} sent offset {offset} but this log ends at {expect}: "
                                         f"reconnecting")
                    if size:
                        bodies.append(view[pos + hsize:pos + hsize + size])
                        expect += size
                    if expect > self.master_offset:
                        self.master_offset = expect
                    pos += hsize + size
                if bodies:  # appended at once, dispatched once for the whole read
                    self._append(bodies, first, addr)
                    self._appended.set()
                    store.dispatch_appended()
                    if self._pending_epochs:
                        self._take_epochs(commit_log.get_max_offset())
                if pos:
                    rest = used - pos
                    if rest:  # a frame's beginning: moved to the front (a copy: the ranges may overlap)
                        buf[:rest] = bytes(view[pos:used])
                    used = rest
            elif now - self.last_read_time > housekeeping:
                raise OSError(f"master sent nothing for {cfg.ha_housekeeping_interval} ms")
            mine = 0 if mfq.holds_no_bytes() else commit_log.get_max_offset()
            if mine != reported or now - last_report >= heartbeat:
                sock.sendall(REPORT.pack(mine))
                reported, last_report = mine, now

    def _warm_loop(self) -> None:
        """After each append: the page cache of the last segment up to WARM_AHEAD bytes past its
        end (MappedFile.prefetch), each byte asked for once."""
        mfq = self.store.commit_log.mapped_file_queue
        warmed: tuple[str | None, int] = (None, 0)  # (segment path, how far it is warmed)
        while not self._stopped.is_set():
            self._appended.wait(1.0)
            self._appended.clear()
            mf = mfq.get_last_mapped_file()
            if mf is None:
                continue
            wp = mf.wrote_position
            start = max(wp, warmed[1]) if warmed[0] == mf.path else wp
            end = min(mf.file_size, wp + self.WARM_AHEAD)
            if end > start:
                try:
                    mf.prefetch(start, end)
                except OSError as e:  # (the segment deleted meanwhile: a truncate or retention)
                    log.debug("HA: warming %s failed: %s", mf.path, e)
                    continue
                warmed = (mf.path, end)

    def _append(self, bodies: list, offset: int, addr: str) -> None:
        if bodies and not self.store.commit_log.append_data(offset, bodies):
            raise StoreError(f"frames from master {addr} at {offset} do not continue this log")
        bodies.clear()

    def runtime_info(self) -> dict:
        mine = self.store.commit_log.get_max_offset()
        return {"masterAddr": self.master_address, "haConnected": self.connected,
                **({"masterEpoch": self.controller[0]} if self.controller is not None else {}),
                "haMasterOffset": self.master_offset, "slaveMaxOffset": mine,
                "slaveFallBehindBytes": self.fall_behind_bytes(),
                "lastReadTimestamp": self.last_read_time}

    def fall_behind_bytes(self) -> int:
        """How far this slave is behind what the master's frames have shown (0 before any)."""
        if self.master_offset < 0:
            return 0
        return max(0, self.master_offset - self.store.commit_log.get_max_offset())


def _grown(buf: bytearray, need: int, pos: int, used: int) -> bytearray:
    out = bytearray(max(need, len(buf) * 2))
    out[:used - pos] = buf[pos:used]
    return out
