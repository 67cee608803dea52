"""The HA wire format (RocketMQ's): the slave's report and the master's frame header."""
import socket
import struct

REPORT = struct.Struct(">q")  # slave -> master: its max commit-log offset
HEADER = struct.Struct(">qi")  # master -> slave: physical offset, body size (then the body)


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
