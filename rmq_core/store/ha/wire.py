"""The HA wire format (RocketMQ's): the slave's report and the master's frame header, and the
controller-mode handshake (docs/failover.md): the slave sends HANDSHAKE_REQUEST (int64 -2,
int32 brokerId, int32 expected master epoch); the master answers a frame whose header offset is
-2 and whose body is HANDSHAKE_ANSWER (int32 masterEpoch, int64 masterMaxOffset, int32 n) then
n × EPOCH_ENTRY (int32 epoch, int64 startOffset), or closes the connection."""
import socket
import struct

REPORT = struct.Struct(">q")  # slave -> master: its max commit-log offset
HEADER = struct.Struct(">qi")  # master -> slave: physical offset, body size (then the body)
HANDSHAKE = -2  # the first 8-byte value of a controller-mode slave, and the offset of the answer's header
HANDSHAKE_REQUEST = struct.Struct(">qii")
HANDSHAKE_ANSWER = struct.Struct(">iqi")
EPOCH_ENTRY = struct.Struct(">iq")


def close_quietly(sock: socket.socket | None) -> None:
    """Shut a socket down (waking a thread blocked on it) and close it."""
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """n bytes from `sock` (OSError when it closes first)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)
