"""Malformed remoting frames against a running server: `fuzz(addr, n, seed) -> FuzzReport`.

Reusable against any rmq server (name server, broker):

    from tests.fuzz_frames import fuzz
    report = fuzz("127.0.0.1:10911", 2000, seed=7)      # blocking; run it in a thread from async code
    python -m tests.fuzz_frames 127.0.0.1:10911 2000 7   # the same from a shell

Two kinds of garbage are sent:
* connection killers, each on a fresh TCP connection: random bytes, absurd/negative lengths, frames
  cut short (then the connection is closed by us), undecodable JSON or binary headers, unknown
  serialize types.  The server must drop that connection and nothing else.
* well-framed nonsense on one long-lived connection: real and random request codes with wrong ext
  field types (objects, arrays, floats, huge numbers, nulls, deep nesting, garbage strings) and
  random bodies.  The server must answer each (any code) and keep the connection open.

The report counts what was sent and answered; `answered_all` is False when a well-framed request
on the long-lived connection went unanswered or that connection was dropped.
"""
from __future__ import annotations

import json
import random
import socket
import struct
import time
from dataclasses import dataclass, field

KNOWN_CODES = [10, 11, 12, 14, 15, 17, 21, 29, 30, 31, 33, 34, 35, 36, 37, 38, 41, 42, 43, 100, 101, 102, 103,
               104, 105, 106, 200, 205, 206, 216, 217, 219, 224, 304, 310, 320, 322, 327]
FIELD_NAMES = ["topic", "brokerName", "brokerAddr", "clusterName", "brokerId", "namespace", "key", "value",
               "cluster", "bodyCrc32", "compressed", "haServerAddr", "queueId", "queueOffset", "consumerGroup",
               "producerGroup", "sysFlag", "maxMsgNums", "commitOffset", "properties", "batch", "a", "b", "clientID"]


@dataclass
class FuzzReport:
    frames: int = 0
    killer_frames: int = 0
    killer_connections_closed_by_server: int = 0
    killer_connections_left_open: int = 0  # the server kept a connection it should have dropped
    wellformed_requests: int = 0
    responses: int = 0
    reconnects: int = 0
    answered_all: bool = True
    kinds: dict = field(default_factory=dict)


def _frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def _weird_value(rng: random.Random, depth: int = 0):
    choice = rng.randrange(12)
    if choice == 0:
        return rng.randrange(-2**63, 2**63)
    if choice == 1:
        return rng.random() * 10 ** rng.randrange(-5, 30)
    if choice == 2:
        return None
    if choice == 3:
        return rng.choice([True, False])
    if choice == 4 and depth < 3:
        return [_weird_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if choice == 5 and depth < 3:
        return {str(rng.randrange(100)): _weird_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if choice == 6:
        return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(20)))
    if choice == 7:
        return str(rng.randrange(-1000, 10**6))
    if choice == 8:
        return "127.0.0.1:" + str(rng.randrange(-10, 70000))
    if choice == 9:
        return ""
    if choice == 10:
        return "x" * rng.randrange(0, 5000)
    return str(rng.randrange(2))


def _wellformed(rng: random.Random, codes) -> tuple[str, bytes]:
    code = rng.choice(codes) if rng.random() < 0.8 else rng.randrange(-32768, 32768)
    ext = {rng.choice(FIELD_NAMES): _weird_value(rng) for _ in range(rng.randrange(8))}
    header = {"code": code, "flag": rng.choice([0, 0, 0, 4, 8]), "language": rng.choice(["CPP", "JAVA", "??"]),
              "opaque": rng.randrange(2**31), "version": rng.randrange(0, 500), "extFields": ext}
    if rng.random() < 0.2:
        header["remark"] = _weird_value(rng)
    body_kind = rng.randrange(5)
    if body_kind == 0:
        body = b""
    elif body_kind == 1:
        body = rng.randbytes(rng.randrange(1, 2000))
    elif body_kind == 2:
        body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {
            "T": {"perm": _weird_value(rng), "readQueueNums": _weird_value(rng)}}}}).encode()
    elif body_kind == 3:
        body = b"[" * rng.randrange(1, 5000)
    else:
        body = json.dumps(_weird_value(rng)).encode()
    try:
        text = json.dumps(header, allow_nan=True).encode()
    except (TypeError, ValueError):
        text = b'{"code":0}'
    return "wellformed", _frame(text, body)


def _killer(rng: random.Random) -> tuple[str, bytes, bool]:
    """(kind, bytes, whether the server must close the connection by itself)."""
    kind = rng.randrange(9)
    if kind == 0:
        return "random-bytes", rng.randbytes(rng.randrange(1, 400)), False
    if kind == 1:
        return "absurd-length", struct.pack(">i", rng.randrange(64 * 1024 * 1024, 2**31)) + rng.randbytes(8), True
    if kind == 2:
        return "negative-length", struct.pack(">i", -rng.randrange(1, 2**31)), True
    if kind == 3:
        _, full = _wellformed(rng, KNOWN_CODES)
        return "truncated", full[:rng.randrange(1, len(full))], False
    if kind == 4:
        junk = rng.choice([b"{", b"{]", b'{"code":', b"null", b"[]", b'"s"', b"{'code':1}", b"\xff\xfe\xfd",
                           b'{"code":"abc"}', b'{"code":1,"extFields":"x"}', b'{"code":1,"opaque":[1]}'])
        return "bad-json", _frame(junk), True
    if kind == 5:
        return "bad-serialize-type", _frame(b'{"code":1}', stype=rng.randrange(2, 256)), True
    if kind == 6:
        # fixed fields, then a remark length that cannot be right (negative or beyond the header)
        fixed = struct.pack(">hbhii", rng.randrange(-32768, 32768), rng.randrange(-128, 128),
                            rng.randrange(-32768, 32768), rng.randrange(-2**31, 2**31), rng.randrange(-2**31, 2**31))
        bad_len = rng.choice([-rng.randrange(1, 2**31), rng.randrange(1000, 2**31)])
        header = (fixed + struct.pack(">i", bad_len) + rng.randbytes(rng.randrange(0, 20)))[:rng.randrange(0, 40)]
        return "bad-binary-header", _frame(header, stype=1), True
    if kind == 7:
        header = b'{"code":105}'
        return "header-length-beyond-frame", struct.pack(">iI", 4 + len(header), len(header) + 50) + header, True
    return "deep-json", _frame(b"[" * 100000), True


def _recv_frames(sock: socket.socket, buf: bytearray, timeout: float) -> int:
    """Read what arrives within `timeout`; returns the number of complete frames consumed from buf."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed by peer")
        buf += data
    except (socket.timeout, BlockingIOError):
        pass
    count = 0
    while len(buf) >= 4:
        (length,) = struct.unpack(">i", buf[:4])
        if len(buf) < 4 + length:
            break
        frame = bytes(buf[4:4 + length])
        del buf[:4 + length]
        (len_and_type,) = struct.unpack(">I", frame[:4])
        header = json.loads(frame[4:4 + (len_and_type & 0xFFFFFF)])
        assert header["flag"] & 1, f"server sent a non-response: {header}"
        count += 1
    return count


def _connect(host: str, port: int) -> socket.socket:
    return socket.create_connection((host, port), timeout=5)


def fuzz(addr: str, n: int, seed: int, *, codes=None, killer_ratio: float = 0.5) -> FuzzReport:
    """Send `n` malformed frames to `addr` ("host:port"); deterministic for a given seed."""
    rng = random.Random(seed)
    codes = list(codes or KNOWN_CODES)
    host, port_s = addr.rsplit(":", 1)
    port = int(port_s)
    report = FuzzReport()
    steady = _connect(host, port)
    buf = bytearray()
    outstanding = 0
    try:
        for _ in range(n):
            report.frames += 1
            if rng.random() < killer_ratio:
                kind, data, must_close = _killer(rng)
                report.killer_frames += 1
                report.kinds[kind] = report.kinds.get(kind, 0) + 1
                with _connect(host, port) as s:
                    try:
                        s.sendall(data)
                    except OSError:
                        pass  # the server already hung up on an earlier part: fine
                    if must_close:
                        s.settimeout(5)
                        try:
                            while s.recv(65536):
                                pass  # anything before the close would be a bug: no answer expected
                            report.killer_connections_closed_by_server += 1
                        except (socket.timeout, OSError):
                            report.killer_connections_left_open += 1
                    # otherwise we hang up ourselves: the server must forget the half frame
            else:
                kind, data = _wellformed(rng, codes)
                report.kinds[kind] = report.kinds.get(kind, 0) + 1
                report.wellformed_requests += 1
                try:
                    steady.sendall(data)
                    outstanding += 1
                    got = _recv_frames(steady, buf, 0.0005)
                except (ConnectionError, OSError):
                    report.answered_all = False
                    report.reconnects += 1
                    steady.close()
                    steady = _connect(host, port)
                    buf.clear()
                    outstanding = 0
                    continue
                report.responses += got
                outstanding -= got
        deadline = time.monotonic() + 10
        while outstanding > 0 and time.monotonic() < deadline:
            got = _recv_frames(steady, buf, 0.1)
            report.responses += got
            outstanding -= got
        if outstanding > 0:
            report.answered_all = False
    finally:
        steady.close()
    return report


if __name__ == "__main__":  # python -m tests.fuzz_frames 127.0.0.1:10911 5000 7
    import sys

    if len(sys.argv) != 4:
        sys.exit("usage: python -m tests.fuzz_frames HOST:PORT N SEED")
    result = fuzz(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print(result)
    sys.exit(0 if result.answered_all and not result.killer_connections_left_open else 1)
