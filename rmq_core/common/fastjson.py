"""fastjson's dialect of JSON, as RocketMQ's Java side writes it: keys sorted, and `Map<Long, ...>`
keys UNQUOTED (`{0:"127.0.0.1:10911"}`), which Python's json rejects.  `loads_lenient` reads
both forms (a wire body, a config file a Java broker wrote, a name server's route); `dumps`
writes standard JSON with quoted keys in fastjson's order (docs/protocol.md §4.1)."""
from __future__ import annotations

import json
from typing import Any

from rmq_core.errors import RemotingCommandError


# (made once: json.dumps with arguments makes an encoder per call, which costs more than a small body)
_encode = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode


def dumps(obj: Any) -> bytes:
    """Compact JSON with sorted keys (fastjson's order), UTF-8."""
    return _encode(obj).encode("utf-8")


def _quote_bare_keys(text: str) -> str:
    """Quote fastjson's bare numeric object keys (`{0:"a",-1:"b"}`) outside string literals."""
    out = []
    i, n = 0, len(text)
    in_string = False
    expect_key = False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
            continue
        if c == '"':
            in_string = True
            expect_key = False
        elif c in "{,":
            expect_key = True
        elif expect_key and (c.isdigit() or c == "-"):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append('"' + text[i:j] + '"')
                i = j
                expect_key = False
                continue
            expect_key = False
        elif not c.isspace():
            expect_key = False
        out.append(c)
        i += 1
    return "".join(out)


def loads_lenient(data: bytes | bytearray | memoryview | str | None) -> Any:
    """Parse a JSON body, also accepting fastjson's unquoted numeric keys; errors name the problem."""
    if data is None or len(data) == 0:
        raise RemotingCommandError("expected a JSON body, got none")
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        pass
    except RecursionError:
        raise RemotingCommandError("bad JSON body: nested too deeply") from None
    try:
        return json.loads(_quote_bare_keys(text))
    except (ValueError, RecursionError) as e:
        raise RemotingCommandError(f"bad JSON body: {e}") from None


__all__ = ["dumps", "loads_lenient"]
