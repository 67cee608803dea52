"""HAConnection: the master's side of one slave (RocketMQ's HAConnection).

Two threads per slave, as RocketMQ has: the reader takes the slave's 8-byte reports (its first
one says where the transfer starts; each is an acknowledgement for SYNC_MASTER), the writer
sends commit-log bytes as frames straight from the segment mapping (`CommitLog.transfer_view`:
a memoryview, up to FRAMES_PER_SEND frames with their headers per sendmsg — no copy, nothing
per message) and an empty
frame as a heartbeat when there is nothing to send.
"""
from __future__ import annotations

import logging
import socket
import threading
import time

from rmq_core.config import BrokerRole
from rmq_core.store.ha.wire import (EPOCH_ENTRY, HANDSHAKE, HANDSHAKE_ANSWER, HANDSHAKE_REQUEST, HEADER, REPORT,
                                    close_quietly, recv_exactly)

_IOV_MAX = 1024  # buffers per sendmsg (Linux's UIO_MAXIOV)

log = logging.getLogger("rmq.store.ha")


class HAConnection:
    # How long the writer sleeps when it has sent everything, unless woken (a SYNC_MASTER put
    # wakes it; an ASYNC_MASTER slave catches up at the next look, as RocketMQ's 100 ms wait).
    IDLE_WAIT = 0.1
    # ASYNC_MASTER: after a frame shorter than haTransferBatchSize (it sent all there was), the
    # writer lets this long's puts gather before it looks again — no put waits on the slave, and
    # chasing every few records with a frame of its own costs the master's loop the GIL per frame
    # (and the slave a read, a dispatch and a report per frame)
    ASYNC_GATHER = 0.01
    # Frames (each at most haTransferBatchSize, the wire format unchanged) sent per sendmsg: a
    # backlog costs Python one loop turn per this many bytes, not per frame
    FRAMES_PER_SEND = 32

    def __init__(self, service, sock: socket.socket, addr: str):
        self.service = service
        self.store = service.store
        self.config = service.store.config
        self.sock = sock
        self.client_addr = addr
        self.slave_request_offset = -1  # the slave's first report: where the transfer starts
        self.slave_ack_offset = -1  # its latest report
        self.next_transfer_from_where = -1
        # controller mode: the slave's broker id (from its handshake; -1 in manual mode), and the
        # monotonic time of its last report that reached what this master's log held when the
        # writer last looked (RocketMQ 5's lastCatchUpTimeMs)
        self.slave_broker_id = -1
        self.last_caught_up = 0.0
        self._mark: tuple[int, float] | None = None  # (log end, when): the writer's last look
        self._requested = threading.Event()
        self._closed = False
        self.last_read_time = time.monotonic()
        self._reader = threading.Thread(target=self._until_closed, name=f"HAConnection-read[{addr}]", daemon=True,
                                        args=(self._read_loop, "connection to slave %s lost"))
        self._writer = threading.Thread(target=self._until_closed, name=f"HAConnection-write[{addr}]", daemon=True,
                                        args=(self._write_loop, "transfer to slave %s stopped"))

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._requested.set()
        close_quietly(self.sock)
        self.service.remove_connection(self)

    def join(self, timeout: float = 5.0) -> None:
        for t in (self._reader, self._writer):
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout)

    def _until_closed(self, loop, lost: str) -> None:
        """A connection thread: `loop` until it returns or the socket fails (`lost` logged unless
        the connection was closed on purpose), then the connection closes."""
        try:
            loop()
        except OSError as e:
            if not self._closed:
                log.info("HA: " + lost + ": %s", self.client_addr, e)
        finally:
            self.close()

    # -- reports from the slave ------------------------------------------------------------------
    def _read_loop(self) -> None:
        sock = self.sock
        # a slave that says nothing for haHousekeepingInterval is gone (it reports at least every
        # haSendHeartbeatInterval)
        sock.settimeout(self.config.ha_housekeeping_interval / 1000.0)
        pending = b""
        if self.service.controller_mode and not self._handshake(sock):
            return
        while not self._closed:
            try:
                data = sock.recv(4096)
            except socket.timeout:
                log.warning("HA: slave %s sent nothing for %d ms: closing its connection", self.client_addr,
                            self.config.ha_housekeeping_interval)
                break
            if not data:
                break
            self.last_read_time = time.monotonic()
            pending += data
            whole = len(pending) - len(pending) % REPORT.size
            if not whole:
                continue
            (offset,) = REPORT.unpack_from(pending, whole - REPORT.size)  # the latest report counts
            pending = pending[whole:]
            max_offset = self.store.commit_log.get_max_offset()
            if offset > max_offset:
                # a slave ahead of its master (the master lost data): it never feeds the master
                log.warning("HA: slave %s reports offset %d beyond this master's log end %d: closing",
                            self.client_addr, offset, max_offset)
                break
            if offset < 0:  # (-2: a controller-mode slave's handshake, which a manual-mode master refuses)
                log.warning("HA: slave %s sent offset %d (a controller-mode handshake?) to a master not in "
                            "controller mode: closing", self.client_addr, offset)
                break
            self.slave_ack_offset = offset
            if self.service.controller_mode:
                self._note_caught_up(offset, max_offset)
            if self.slave_request_offset < 0:
                self.slave_request_offset = offset
                log.info("HA: slave %s requests the log from offset %d", self.client_addr, offset)
                self._requested.set()
            self.service.notify_transfer_some(offset)

    def _handshake(self, sock: socket.socket) -> bool:
        """Controller mode: the slave's handshake (int64 -2, int32 brokerId, int32 the epoch it
        expects), answered with this master's epoch, max offset and epoch entries; False (the
        connection closes) when it is no handshake, this store is no master, or the epochs differ."""
        svc = self.service
        try:
            first = recv_exactly(sock, REPORT.size)
            (marker,) = REPORT.unpack(first)
            if marker != HANDSHAKE:
                log.warning("HA: slave %s sent offset %d, not the controller-mode handshake: closing (it must "
                            "run in controller mode too)", self.client_addr, marker)
                return False
            _, broker_id, epoch = HANDSHAKE_REQUEST.unpack(first + recv_exactly(sock, HANDSHAKE_REQUEST.size - REPORT.size))
        except socket.timeout:
            log.warning("HA: slave %s sent no handshake within %d ms: closing", self.client_addr,
                        self.config.ha_housekeeping_interval)
            return False
        if not svc.is_master:
            log.warning("HA: slave %s (broker id %d) expects a master of epoch %d, but this store is a slave: "
                        "closing", self.client_addr, broker_id, epoch)
            return False
        mine = svc.master_epoch
        if epoch != mine:
            log.warning("HA: slave %s (broker id %d) expects master epoch %d, this master's is %d: closing",
                        self.client_addr, broker_id, epoch, mine)
            return False
        entries = svc.epoch_cache.entries()
        body = HANDSHAKE_ANSWER.pack(mine, self.store.commit_log.visible_offset, len(entries)) + b"".join(
            EPOCH_ENTRY.pack(e.epoch, e.start_offset) for e in entries)
        self.slave_broker_id = broker_id
        svc.on_handshake(self)
        sock.sendall(HEADER.pack(HANDSHAKE, len(body)) + body)
        log.info("HA: slave %s is broker id %d (master epoch %d)", self.client_addr, broker_id, mine)
        return True

    def _note_caught_up(self, offset: int, max_offset: int) -> None:
        """A report at `offset`: caught up when it reached this log's end now, or the end the
        writer saw at its last look (then as of that look)."""
        now = time.monotonic()
        if offset >= max_offset:
            self.last_caught_up = now
            self._mark = None
            return
        mark = self._mark
        if mark is not None and offset >= mark[0]:
            if mark[1] > self.last_caught_up:
                self.last_caught_up = mark[1]
            self._mark = None

    # -- transfer to the slave -------------------------------------------------------------------
    def _write_loop(self) -> None:
        self._requested.wait()
        if not self._closed:
            self._transfer()

    def _start_offset(self) -> int:
        request = self.slave_request_offset
        if request != 0:
            return request
        # an empty slave starts at the beginning of the master's last segment
        master = self.store.commit_log.get_max_offset()
        return max(0, master - master % self.config.mapped_file_size_commit_log)

    def _transfer(self) -> None:
        cfg = self.config
        commit_log = self.store.commit_log
        service = self.service
        sock = self.sock  # (its timeout, haHousekeepingInterval, also ends a send to a frozen slave)
        offset = self.next_transfer_from_where = self._start_offset()
        log.info("HA: transfer to slave %s from offset %d (it requested %d)", self.client_addr, offset,
                 self.slave_request_offset)
        batch = cfg.ha_transfer_batch_size
        most = batch * self.FRAMES_PER_SEND
        gather = self.ASYNC_GATHER if cfg.broker_role is BrokerRole.ASYNC_MASTER else 0.0
        heartbeat = cfg.ha_send_heartbeat_interval / 1000.0
        last_write = time.monotonic()
        controller = service.controller_mode
        while not self._closed:
            if controller and self._mark is None:
                self._mark = (commit_log.visible_offset, time.monotonic())
            view = commit_log.transfer_view(offset, most)
            if view is None:
                now = time.monotonic()
                if now - last_write >= heartbeat:
                    sock.sendall(HEADER.pack(offset, 0))
                    last_write = now
                service.wait_for_data(self, min(self.IDLE_WAIT, heartbeat))
                continue
            with view:
                n = len(view)
                _send_frames(sock, offset, view, batch)
            offset += n
            self.next_transfer_from_where = offset
            last_write = time.monotonic()
            service.on_transferred(offset)
            if n < most and gather:
                service.pause(gather)

    def runtime_info(self) -> dict:
        ack = self.slave_ack_offset
        info = {"addr": self.client_addr, "slaveAckOffset": ack,
                "diff": max(0, self.store.commit_log.get_max_offset() - ack) if ack >= 0 else -1,
                "transferFromWhere": self.next_transfer_from_where}
        if self.slave_broker_id >= 0:
            info["brokerId"] = self.slave_broker_id
        return info


def _send_frames(sock: socket.socket, offset: int, view: memoryview, batch: int) -> None:
    """`view` (the log's bytes from `offset`) as frames of at most `batch` bytes, headers and
    bodies in one sendmsg (the bodies straight from the mapping); a partial send continues where
    it stopped.  The bodies' views are released before it returns (the mapping can close)."""
    parts = []
    try:
        for pos in range(0, len(view), batch):
            body = view[pos:pos + batch]
            parts += (HEADER.pack(offset + pos, len(body)), body)
        i = 0
        while i < len(parts):
            sent = sock.sendmsg(parts[i:i + _IOV_MAX])
            while i < len(parts) and sent >= len(parts[i]):
                sent -= len(parts[i])
                i += 1
            if sent:  # a part sent in part: its rest first
                parts[i] = parts[i][sent:]
    finally:
        for p in parts:
            if isinstance(p, memoryview):
                p.release()
