"""The request signature (AclClientRPCHook / PlainAccessValidator): ours equals OpenSSL's
HMAC-SHA1 over RocketMQ's content for random ext fields, bodies and secrets (long ones too); one
changed byte anywhere fails it."""
import base64
import hmac

from hypothesis import given, settings, strategies as st

from rmq_core.acl import SIGNATURE, AclSigner, SigningKey


def reference_signature(ext_fields: dict, body: bytes | None, secret: str) -> str:
    """OpenSSL's HMAC-SHA1 (hmac.digest) over RocketMQ's content (combineRequestContent): the
    values of the ext fields but Signature and _UNIQUE_KEY_QUERY, ordered by key, then the body."""
    content = "".join(v for k, v in sorted(ext_fields.items()) if k not in ("Signature", "_UNIQUE_KEY_QUERY"))
    return base64.b64encode(hmac.digest(secret.encode("utf-8"), content.encode("utf-8") + (body or b""), "sha1")).decode()


def request_signature(ext, body, secret: bytes) -> str:
    return SigningKey(secret).sign(ext, body)


keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", min_size=1, max_size=12)
ext_fields = st.dictionaries(keys, st.text(max_size=40), max_size=16)
bodies = st.one_of(st.none(), st.binary(max_size=600))
secrets = st.text(min_size=1, max_size=100)


class _Request:
    def __init__(self, ext, body):
        self.ext_fields, self.body = ext, body


@settings(max_examples=300, deadline=None)
@given(ext_fields, bodies, secrets)
def test_signature_equals_reference_hmac(ext, body, secret):
    assert request_signature(ext, body, secret.encode()) == reference_signature(ext, body, secret)


@settings(max_examples=200, deadline=None)
@given(ext_fields, bodies, secrets)
def test_signer_adds_access_key_and_a_verifiable_signature(ext, body, secret):
    req = _Request(dict(ext), body)
    AclSigner("RocketMQ", secret).before("127.0.0.1:10911", req)
    assert req.ext_fields["AccessKey"] == "RocketMQ"
    signed = {k: v for k, v in req.ext_fields.items() if k != SIGNATURE}
    assert req.ext_fields[SIGNATURE] == reference_signature(signed, body, secret)


@settings(max_examples=300, deadline=None)
@given(st.data(), ext_fields.filter(bool), st.binary(min_size=1, max_size=300), secrets)
def test_one_changed_byte_fails_verification(data, ext, body, secret):
    good = request_signature(ext, body, secret.encode())
    if data.draw(st.booleans()):  # a byte of the body
        i = data.draw(st.integers(0, len(body) - 1))
        changed = body[:i] + bytes([body[i] ^ data.draw(st.integers(1, 255))]) + body[i + 1:]
        assert request_signature(ext, changed, secret.encode()) != good
    else:  # one character of one field's value (one appended when the value is empty)
        key = data.draw(st.sampled_from(sorted(ext)))
        value = ext[key]
        if value:
            i = data.draw(st.integers(0, len(value) - 1))
            value = value[:i] + chr(ord(value[i]) ^ 1) + value[i + 1:]  # (never a surrogate: D800-DFFF is aligned)
        else:
            value = "x"
        assert request_signature({**ext, key: value}, body, secret.encode()) != good


def test_unique_key_query_flag_is_not_signed_as_rocketmq_validates():
    ext = {"topic": "T", "key": "k"}
    assert request_signature({**ext, "_UNIQUE_KEY_QUERY": "true"}, None, b"secret12") == request_signature(ext, None, b"secret12")


# the producer's native send frame (frame.pyx SendHeader), signed as it is written
names = st.text(alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
                min_size=1, max_size=20)
properties = st.dictionaries(names, names, max_size=5)


@settings(max_examples=200, deadline=None)
@given(names, names, st.integers(0, 1000), properties, st.binary(max_size=400), secrets,
       st.one_of(st.none(), names), st.booleans(), st.one_of(st.none(), st.integers(0, 32)),
       st.integers(-2**63, 2**63 - 1), st.integers(0, 16))
def test_natively_built_send_frame_is_signed_as_acl_signs_it(group, topic, queue_id, props, body, secret, token, v2,
                                                              max_reconsume, flag, reconsume):
    from rmq_core._native.frame import SendHeader
    from rmq_core.remoting.command import RemotingCommand

    header = SendHeader(group, topic, queue_id, "broker-a", v2=v2)
    send = header.request(0, flag, props, 7, body, reconsume, max_reconsume)  # (what the client's steps get)
    unsigned = dict(send.ext_fields)
    AclSigner("RocketMQ", secret, token).before("127.0.0.1:10911", send)
    frame = send.frame()
    request = RemotingCommand.decode(frame[4:])
    ext = dict(request.ext_fields)
    # the header values the steps read are the frame's
    assert {k: v for k, v in ext.items() if k not in ("AccessKey", "SecurityToken", SIGNATURE)} == unsigned
    assert ext["AccessKey"] == "RocketMQ" and ext.get("SecurityToken") == token
    assert (request.body or b"") == body
    assert ext[SIGNATURE] == SigningKey(secret).sign(ext, body) == reference_signature(ext, body, secret)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), secrets, st.integers(0, 27), st.integers(1, 255))
def test_native_verify_takes_the_signature_and_no_changed_byte(content, body, secret, i, flip):
    # the broker's check of a lane's send: SigningKey.verify compares natively what signature() gives
    key = SigningKey(secret)
    good = key.signature(content, body)
    assert good == base64.b64encode(hmac.digest(secret.encode("utf-8"), content + body, "sha1"))
    assert key.verify(good, content, body)
    assert not key.verify(good[:i] + bytes([good[i] ^ flip]) + good[i + 1:], content, body)
    assert not key.verify(good[:-1], content, body)
    assert not key.verify(good, content + b"x", body)
