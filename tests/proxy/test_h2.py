"""rmq's own HTTP/2 + gRPC wire code (rmq_core/_native/h2): HPACK against RFC 7541's examples, the
connection codec frame by frame (flow control both ways, a broken peer answered with GOAWAY).  The
broker's server with a real grpcio client: tests/proxy/test_proxy.py (large messages both ways, a
malformed connection ended while others keep working)."""
from __future__ import annotations

import struct

import pytest

from rmq_core._native import h2

# --- HPACK: RFC 7541 Appendix C -------------------------------------------------------------------
_REQ1 = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")]
_REQ2 = _REQ1 + [("cache-control", "no-cache")]
_REQ3 = [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"), (":authority", "www.example.com"),
         ("custom-key", "custom-value")]
_DATE1, _DATE2 = "Mon, 21 Oct 2013 20:13:21 GMT", "Mon, 21 Oct 2013 20:13:22 GMT"
_LOC = "https://www.example.com"
_COOKIE = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
_RESP1 = [(":status", "302"), ("cache-control", "private"), ("date", _DATE1), ("location", _LOC)]
_RESP2 = [(":status", "307"), ("cache-control", "private"), ("date", _DATE1), ("location", _LOC)]
_RESP3 = [(":status", "200"), ("cache-control", "private"), ("date", _DATE2), ("location", _LOC),
          ("content-encoding", "gzip"), ("set-cookie", _COOKIE)]
_REQ_TABLES = ([(":authority", "www.example.com")],
               [("cache-control", "no-cache"), (":authority", "www.example.com")],
               [("custom-key", "custom-value"), ("cache-control", "no-cache"), (":authority", "www.example.com")])
_RESP_TABLES = ([("location", _LOC), ("date", _DATE1), ("cache-control", "private"), (":status", "302")],
                [(":status", "307"), ("location", _LOC), ("date", _DATE1), ("cache-control", "private")],
                [("set-cookie", _COOKIE), ("content-encoding", "gzip"), ("date", _DATE2)])

RFC_EXAMPLES = {
    # C.3: requests without Huffman coding, C.4: with (one decoder each, table 4096)
    "C.3": (4096, [("828684410f7777772e6578616d706c652e636f6d", _REQ1, 57),
                   ("828684be58086e6f2d6361636865", _REQ2, 110),
                   ("828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565", _REQ3, 164)], _REQ_TABLES),
    "C.4": (4096, [("828684418cf1e3c2e5f23a6ba0ab90f4ff", _REQ1, 57),
                   ("828684be5886a8eb10649cbf", _REQ2, 110),
                   ("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf", _REQ3, 164)], _REQ_TABLES),
    # C.5 / C.6: responses with a 256-octet table (entries evicted)
    "C.5": (256, [("4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d"
                   "546e1768747470733a2f2f7777772e6578616d706c652e636f6d", _RESP1, 222),
                  ("4803333037c1c0bf", _RESP2, 222),
                  ("88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f"
                   "6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b"
                   "2076657273696f6e3d31", _RESP3, 215)], _RESP_TABLES),
    "C.6": (256, [("488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c7"
                   "8f0b97c8e9ae82ae43d3", _RESP1, 222),
                  ("4883640effc1c0bf", _RESP2, 222),
                  ("88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335"
                   "dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007", _RESP3, 215)], _RESP_TABLES),
}


@pytest.mark.parametrize("name", sorted(RFC_EXAMPLES))
def test_hpack_decodes_rfc7541_appendix_c_examples_with_their_dynamic_tables(name):
    table_size, blocks, tables = RFC_EXAMPLES[name]
    d = h2.HpackDecoder(table_size)
    for (hexdata, headers, size), table in zip(blocks, tables):
        assert d.decode(bytes.fromhex(hexdata)) == headers
        assert d.table == table and d.size == size


def test_hpack_refuses_bad_blocks_naming_the_problem():
    with pytest.raises(h2.HpackError, match="index 70 is past the dynamic table"):
        h2.HpackDecoder().decode(bytes([0x80 | 70]))
    with pytest.raises(h2.HpackError, match="size update to 8192 exceeds the announced 4096"):
        h2.HpackDecoder().decode(bytes([0x3F, 0xE1, 0x3F]))  # 31 + 8161 = 8192
    with pytest.raises(h2.HpackError, match="size update after a header field"):
        h2.HpackDecoder().decode(bytes([0x82, 0x20]))
    with pytest.raises(h2.HpackError, match="runs past the header block"):
        h2.HpackDecoder().decode(bytes([0x00, 0x05, 0x61]))
    with pytest.raises(ValueError, match="EOS or bad padding"):
        h2.huffman_decode(bytes([0xF1, 0xE3, 0xC2, 0xE5, 0xF2, 0x3A, 0x6B, 0xA0, 0xAB, 0x90, 0xF4, 0xFE]))  # a 0 in padding
    assert h2.huffman_decode(bytes.fromhex("f1e3c2e5f23a6ba0ab90f4ff")) == b"www.example.com"


def test_hpack_encoder_output_decodes_to_its_input():
    headers = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "13"),
               ("grpc-message", h2.percent_encode("topic \u00e9 100% gone\n")), ("x-long", "v" * 300)]
    block = h2.encode_headers(headers)
    assert block[0] == 0x88  # (:status 200: static index 8)
    assert h2.HpackDecoder().decode(block) == headers
    assert headers[3][1] == "topic %C3%A9 100%25 gone%0A"
    assert h2.grpc_timeout("1500m") == 1.5 and h2.grpc_timeout("2S") == 2.0
    with pytest.raises(ValueError, match="bad grpc-timeout '12'"):
        h2.grpc_timeout("12")


# --- the connection codec, frame by frame -----------------------------------------------------------
def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", sid) + payload


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                    data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW, CONT = 0, 1, 3, 4, 6, 7, 8, 9
REQUEST = h2.encode_headers([(":method", "POST"), (":scheme", "http"), (":path", "/x/Y"),
                             ("content-type", "application/grpc"), ("x-mq-client-id", "c1")])


def connected(settings: bytes = b"") -> h2.H2Connection:
    c = h2.H2Connection(max_message=1 << 20)
    c.take_output()
    assert c.feed(h2.PREFACE + frame(SETTINGS, 0, 0, settings)) == []
    assert frames(c.take_output()) == [(SETTINGS, 1, 0, b"")]  # (acked)
    return c


def test_preface_settings_ping_and_a_request_split_anywhere():
    c = h2.H2Connection()
    out = frames(c.take_output())
    assert [f[0] for f in out] == [SETTINGS, WINDOW]  # the server's preface, the connection window opened
    msg = h2.grpc_message(b"request")
    wire = (h2.PREFACE + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"12345678")
            + frame(HEADERS, 0x8 | 0x20, 1, bytes([3]) + b"\0\0\0\0\x10" + REQUEST[:10] + b"pad")  # padded, priority
            + frame(CONT, 0x4, 1, REQUEST[10:])
            + frame(DATA, 0x8 | 0x1, 1, bytes([2]) + msg + b"\0\0"))  # padded, END_STREAM
    events = []
    for i in range(len(wire)):  # one byte at a time: nothing depends on how reads split
        events += c.feed(wire[i:i + 1])
    assert events == [(h2.EV_HEADERS, 1, {":method": "POST", ":scheme": "http", ":path": "/x/Y",
                                          "content-type": "application/grpc", "x-mq-client-id": "c1"}),
                      (h2.EV_MESSAGE, 1, b"request"), (h2.EV_END, 1, None)]
    assert frames(c.take_output()) == [(SETTINGS, 1, 0, b""), (PING, 1, 0, b"12345678")]
    c.respond(1, h2.encode_headers([(":status", "200")]), b"answer", h2.encode_headers([("grpc-status", "0")]))
    out = frames(c.take_output())
    assert [(f[0], f[1]) for f in out] == [(HEADERS, 0x4), (DATA, 0), (HEADERS, 0x5)]
    assert out[1][3] == h2.grpc_message(b"answer") and c.open_streams == 0


def test_a_large_request_takes_many_frames_and_windows_are_given_back():
    c = connected()
    body = bytes(range(256)) * 3000  # 768000 bytes: past half the stream's window
    wire = h2.grpc_message(body)
    data = frame(HEADERS, 0x4, 1, REQUEST)
    for i in range(0, len(wire), 16384):
        data += frame(DATA, 0x1 if i + 16384 >= len(wire) else 0, 1, wire[i:i + 16384])
    events = c.feed(data)
    assert events[1:] == [(h2.EV_MESSAGE, 1, body), (h2.EV_END, 1, None)]
    updates = [f for f in frames(c.take_output()) if f[0] == WINDOW]
    assert updates and updates[0][2] == 1 and int.from_bytes(updates[0][3], "big") >= 512 * 1024


def test_a_large_response_waits_for_window_updates_and_its_trailers_follow_it():
    c = connected()
    c.feed(frame(HEADERS, 0x5, 1, REQUEST))
    c.take_output()
    payload = b"r" * 100_000
    c.send_headers(1, h2.encode_headers([(":status", "200")]))
    c.send_message(1, payload)
    c.end_stream(1, h2.encode_headers([("grpc-status", "0")]))
    out = frames(c.take_output())
    sent = sum(len(f[3]) for f in out if f[0] == DATA)
    assert sent == 65535 and out[-1][0] == DATA  # the peer's initial windows; trailers held back
    assert c.feed(frame(WINDOW, 0, 1, struct.pack(">I", 100_000))) == []
    assert c.take_output() is None  # (the connection's window is still closed)
    c.feed(frame(WINDOW, 0, 0, struct.pack(">I", 100_000)))
    out = frames(c.take_output())
    assert sum(len(f[3]) for f in out if f[0] == DATA) == 100_005 - 65535
    assert out[-1][:2] == (HEADERS, 0x5) and c.open_streams == 0
    # SETTINGS_INITIAL_WINDOW_SIZE changes the windows of open streams too
    c.feed(frame(HEADERS, 0x5, 3, REQUEST) + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 0)))
    c.take_output()
    c.send_message(3, b"x")
    assert c.take_output() is None
    c.feed(frame(WINDOW, 0, 3, struct.pack(">I", 6)))
    assert frames(c.take_output()) == [(DATA, 0, 3, h2.grpc_message(b"x"))]


def test_an_oversized_message_refuses_its_stream_only():
    c = connected()
    events = c.feed(frame(HEADERS, 0x4, 1, REQUEST) + frame(DATA, 0, 1, b"\0" + struct.pack(">I", 2 << 20) + b"x"))
    assert events[1] == (h2.EV_REFUSED, 1, (8, f"received message larger than max ({2 << 20} vs. {1 << 20})"))
    events = c.feed(frame(HEADERS, 0x4, 3, REQUEST) + frame(DATA, 1, 3, h2.grpc_message(b"ok")))
    assert events[1] == (h2.EV_MESSAGE, 3, b"ok")


@pytest.mark.parametrize("wire, code, text", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1, "bad connection preface b'GET / HTTP/1.1"),
    (h2.PREFACE + frame(PING, 0, 0, b"1234567"), 1, "first frame is type 6, not SETTINGS"),
    (h2.PREFACE + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"1234567"), 6, "PING of 7 bytes"),
    (h2.PREFACE + frame(SETTINGS, 0, 0) + frame(DATA, 0, 5, b"x"), 1, "DATA on idle stream 5"),
    (h2.PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x4, 1, b"\xff\xff\xff\xff\x0f"), 9, "past the dynamic table"),
    (h2.PREFACE + frame(SETTINGS, 0, 0) + b"\x01\0\0\0\0\0\0\0\0", 6, "exceeds SETTINGS_MAX_FRAME_SIZE"),
    (h2.PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 31)), 3, "INITIAL_WINDOW_SIZE 2147483648"),
])
def test_a_broken_peer_gets_goaway_naming_the_problem(wire, code, text):
    c = h2.H2Connection()
    c.take_output()
    events = c.feed(wire)
    assert events[-1][:2] == (h2.EV_ERROR, code) and text in events[-1][2]
    out = frames(c.take_output())
    assert out[-1][0] == GOAWAY and int.from_bytes(out[-1][3][4:8], "big") == code
    assert text in out[-1][3][8:].decode()
    assert c.feed(frame(PING, 0, 0, b"12345678")) == []  # (ended: nothing more is read)
