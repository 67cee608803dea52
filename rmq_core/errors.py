"""Exceptions.  Each names the bad value so the user never has to read a traceback to learn it."""


class RMQError(Exception):
    """Base of every rmq error."""


def one_line(e: BaseException) -> str:
    """An error's message on one line, as a command line or an HTTP answer shows it (a KeyError's
    key without the quotes repr adds; the type's name when the message is empty)."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return " ".join(text.split()) or type(e).__name__


class ConfigError(RMQError, ValueError):
    """A configuration key or value is wrong (unknown key, bad value, unknown plugin name)."""


class PluginNotFoundError(ConfigError):
    """A configuration names a plugin implementation that no installed plugin provides."""

    def __init__(self, kind: str, name: str, available):
        self.kind, self.name, self.available = kind, name, sorted(available)
        super().__init__(
            f"unknown {kind} {name!r}; available: {', '.join(self.available) or '(none)'}"
        )


class PluginLoadError(ConfigError):
    """An installed plugin (a built-in, or one under the entry-point group `rmq`) failed to import."""

    def __init__(self, plugin: str, cause: BaseException):
        self.plugin, self.cause = plugin, cause
        super().__init__(f"plugin {plugin} failed to import: {type(cause).__name__}: {cause}")


class IllegalArgumentError(RMQError, ValueError):
    """A caller passed a bad value (bad topic name, empty body, oversize message...)."""


class PropertiesSizeExceededError(IllegalArgumentError):
    """A message's properties are longer than the int16 length field allows (32767 bytes)."""


class BatchFormatError(IllegalArgumentError):
    """A SEND_BATCH_MESSAGE body does not decode (docs/protocol.md §5.5)."""


class MessageDecodeError(RMQError, ValueError):
    """Bytes that are not a valid record / batch body; names the offset and what is wrong."""

    def __init__(self, offset: int, reason: str):
        self.offset, self.reason = offset, reason
        super().__init__(f"bad message data at offset {offset}: {reason}")


class StoreError(RMQError):
    """The message store could not do what was asked."""


class MessageTooLargeError(StoreError, IllegalArgumentError):
    def __init__(self, size: int, limit: int):
        self.size, self.limit = size, limit
        super().__init__(f"message size {size} bytes exceeds maxMessageSize {limit} bytes")


class DiskFullError(StoreError):
    """Writes are refused: the disk holding the store is over the hard watermark."""


class RemotingError(RMQError):
    """Transport-level failure: connect, send, timeout, closed connection, malformed frame."""


def os_error_text(error: BaseException) -> str:
    """The one wording of a socket (or file) error, whichever path met it: the error's text without
    its errno ("Connection refused", not "[Errno 111] Connection refused")."""
    return (error.strerror if isinstance(error, OSError) and error.strerror else None) or str(error)


class RemotingConnectError(RemotingError):
    @classmethod
    def connecting(cls, addr: str, error: OSError) -> "RemotingConnectError":
        """The one wording of a failed connect, whichever path made it (os_error_text)."""
        return cls(f"connect to {addr} failed: {os_error_text(error)}")


class RemotingTimeoutError(RemotingError, TimeoutError):
    pass


class RemotingCommandError(RemotingError):
    """A frame or header could not be decoded."""


class MQClientError(RMQError):
    """A client-side failure (no route, not started, bad state...)."""

    def __init__(self, message: str, code: int = -1):
        self.code = code
        super().__init__(message)


class NamesrvUnreachableError(MQClientError):
    """No name server answered: names each address tried and its socket error."""


class ReceiptHandleExpiredError(MQClientError):
    """An ack or a change of invisible duration came after the received message's invisible
    duration ended: the message is delivered again (names the message and when it became visible)."""


class MQBrokerError(RMQError):
    """The broker (or name server) answered with a non-success response code."""

    def __init__(self, code: int, remark: str | None, addr: str | None = None):
        self.code, self.remark, self.addr = code, remark or "", addr
        where = f" from {addr}" if addr else ""
        super().__init__(f"broker error code {code}{where}: {self.remark}")


class FilterExpressionError(IllegalArgumentError):
    """A subscription expression does not parse; names the expression, position and reason."""

    def __init__(self, expression: str, position: int, reason: str, expression_type: str = "SQL92"):
        self.expression, self.position, self.reason = expression, position, reason
        self.expression_type = expression_type
        super().__init__(
            f"bad {expression_type} expression {expression!r} at position {position}: {reason}"
        )


class AclError(RMQError):
    """An access-control setting or request is refused (RocketMQ's AclException); names the
    account, resource or value concerned."""
