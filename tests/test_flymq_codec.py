"""FlyMQ codec: spec wire example, round trips, truncation and garbage handling."""

import pytest
from hypothesis import given, settings, strategies as st

from proxy.errors import FlyMQFrameError
from proxy.protocols.flymq import codec
from proxy.protocols.flymq.codec import (
    AuthRequest,
    AuthResponse,
    CommitRequest,
    CommitResponse,
    ConsumeRequest,
    ConsumeResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    ErrorResponse,
    FetchedMessage,
    FetchRequest,
    FetchResponse,
    FlyMQCodecError,
    ListTopicsRequest,
    ListTopicsResponse,
    MetadataRequest,
    MetadataResponse,
    PartitionInfo,
    ProduceRequest,
    RecordMetadata,
    SubscribeRequest,
    SubscribeResponse,
    decode_frame,
    decode_header,
    decode_request,
    decode_response,
    encode_frame,
)
from proxy.protocols.flymq.constants import ERROR, MAX_FRAME_BYTES, PRODUCE

# ---------------------------------------------------------------- spec wire example

# "Wire Example - Produce "hello" to "test"" (the FlyMQ seed document), byte for byte.
SPEC_PRODUCE_PAYLOAD = bytes.fromhex(
    "0004" "74657374"      # topic "test"
    "00000000"             # key length 0 (no key)
    "00000005" "68656C6C6F"  # value "hello"
    "FFFFFFFF")            # partition -1
SPEC_RECORD_METADATA_FRAME = bytes.fromhex(
    "AF010101" "00000022"
    "0004" "74657374"      # topic "test"
    "00000000"             # partition 0
    "000000000000002A"     # offset 42
    "0000018D5A3B2C00"     # timestamp
    "FFFFFFFF"             # key size -1
    "00000005")            # value size 5


def test_spec_produce_request_payload_byte_for_byte():
    req = ProduceRequest("test", b"hello")
    assert req.encode() == SPEC_PRODUCE_PAYLOAD
    assert ProduceRequest.decode(SPEC_PRODUCE_PAYLOAD) == ProduceRequest("test", b"hello", None, -1)


def test_spec_produce_request_header_uses_real_payload_length():
    # The spec prints "AF 01 01 01 00 00 00 13" but its payload is 23 = 0x17 bytes: the
    # length field must match the bytes actually sent.
    frame = ProduceRequest("test", b"hello").to_frame()
    assert frame[:8] == bytes.fromhex("AF01010100000017")
    assert frame[8:] == SPEC_PRODUCE_PAYLOAD
    assert decode_header(frame) == (0xAF, 1, PRODUCE, 1, 23)


def test_spec_record_metadata_frame_round_trips_byte_for_byte():
    frame = decode_frame(SPEC_RECORD_METADATA_FRAME)
    assert frame is not None and frame.size == len(SPEC_RECORD_METADATA_FRAME)
    assert (frame.version, frame.opcode, frame.flags) == (1, PRODUCE, 1)
    meta = decode_response(frame.opcode, frame.payload)
    assert meta == RecordMetadata("test", 0, 42, 0x0000018D5A3B2C00, -1, 5)
    assert meta.to_frame() == SPEC_RECORD_METADATA_FRAME


def test_spec_string_bytes_and_array_examples():
    assert ListTopicsResponse(["a", "bc"]).encode() == bytes.fromhex("00000002000161000262 63".replace(" ", ""))
    assert ConsumeResponse(b"\xde\xad\xbe\xef").encode() == bytes.fromhex("00000000" "00000004DEADBEEF")
    assert MetadataRequest("hello").encode() == bytes.fromhex("000568656C6C6F")


# ---------------------------------------------------------------- frames

def test_encode_frame_header_fields():
    frame = encode_frame(0x07, b"xyz", flags=0x03, version=2)
    assert frame == bytes([0xAF, 2, 0x07, 0x03, 0, 0, 0, 3]) + b"xyz"


def test_decode_header_bad_magic_is_clear():
    with pytest.raises(FlyMQCodecError, match=r"bad magic 0x16 .*expected 0xAF.*TLS") as info:
        decode_header(b"\x16\x03\x01\x00\x10\x00\x00\x00")
    assert info.value.reason == "bad_magic"
    assert isinstance(info.value, ValueError) and isinstance(info.value, FlyMQFrameError)


def test_decode_header_over_limit_length():
    header = bytes([0xAF, 1, 1, 1]) + (MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    with pytest.raises(FlyMQCodecError, match="exceeds limit") as info:
        decode_header(header)
    assert info.value.reason == "too_large"
    # exactly at the limit is fine, and a smaller caller limit applies
    assert decode_header(bytes([0xAF, 1, 1, 1]) + MAX_FRAME_BYTES.to_bytes(4, "big"))[4] == MAX_FRAME_BYTES
    with pytest.raises(FlyMQCodecError):
        decode_header(encode_frame(1, b"x" * 11), max_length=10)


def test_decode_header_short_buffer():
    with pytest.raises(FlyMQCodecError, match="short header"):
        decode_header(b"\xaf\x01\x01")


def test_decode_frame_needs_more_then_splits():
    frame = encode_frame(0x08, b"") + encode_frame(0x04, b"\x00\x01a")
    for cut in range(0, 8):
        assert decode_frame(frame[:cut]) is None
    first = decode_frame(frame)
    assert first.opcode == 0x08 and first.payload == b"" and first.size == 8
    second = decode_frame(frame[first.size:])
    assert second.opcode == 0x04 and second.payload == b"\x00\x01a"
    assert decode_frame(frame[first.size:-1]) is None


def test_encode_rejects_out_of_range_values():
    with pytest.raises(FlyMQCodecError, match="partition"):
        ProduceRequest("t", b"v", partition=2**31).encode()
    with pytest.raises(FlyMQCodecError, match="offset"):
        ConsumeRequest("t", 0, -1).encode()
    with pytest.raises(FlyMQCodecError, match="65535"):
        MetadataRequest("x" * 70000).encode()
    with pytest.raises(FlyMQCodecError, match="bytes-like"):
        ProduceRequest("t", "not bytes").encode()
    with pytest.raises(FlyMQCodecError, match="opcode"):
        encode_frame(256, b"")


# ---------------------------------------------------------------- round trips

EXAMPLES = [
    ProduceRequest("orders", b"value", b"key-1", 2),
    ProduceRequest("orders", b"", None, -1),
    RecordMetadata("orders", 2, 2**64 - 1, -5, 5, 0),
    ConsumeRequest("orders", 1, 77),
    ConsumeResponse(b"v" * 300, b"k"),
    ConsumeResponse(b"v", None),
    FetchRequest("orders", 0, 10, 50),
    FetchRequest("orders", 0, 10, 50, "needle"),
    FetchResponse([FetchedMessage(10, b"a", b"k1"), FetchedMessage(11, b"", None)], 12),
    FetchResponse([], 0),
    CreateTopicRequest("tópico", 8),
    CreateTopicResponse(True),
    CreateTopicResponse(False),
    MetadataRequest("orders"),
    MetadataResponse("orders", [PartitionInfo(0, 0, 0, 0), PartitionInfo(1, 2, 3, 5),
                                PartitionInfo(2, -1, 7, 2**40)]),
    MetadataResponse("empty", []),
    SubscribeRequest("orders", "group-1", 3, "commit"),
    SubscribeResponse(1234),
    CommitRequest("orders", "group-1", 3, 99),
    CommitResponse(True),
    CommitResponse(False),
    ListTopicsRequest(),
    ListTopicsResponse(["a", "bc", "ünï"]),
    ListTopicsResponse([]),
    DeleteTopicRequest("orders"),
    DeleteTopicResponse(True),
    AuthRequest("alice", "s3cret"),
    AuthResponse(True, "", "alice", ["admin", "producer"]),
    AuthResponse(False, "invalid credentials", "", []),
    ErrorResponse("unknown opcode: 153"),
    ErrorResponse("invalid auth request: buffer too small", 1),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: f"{type(m).__name__}")
def test_round_trip_every_message_type(msg):
    payload = msg.encode()
    again = type(msg).decode(payload)
    assert again == msg
    assert again.encode() == payload
    frame = decode_frame(msg.to_frame())
    decoder = decode_request if msg.KIND == "request" else decode_response
    assert decoder(frame.opcode, frame.payload) == msg


def test_every_spec_core_opcode_has_request_and_response_types():
    core = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x70}
    assert core <= set(codec.REQUEST_TYPES)
    assert {codec.RESPONSE_OPCODE[op] for op in core} | {ERROR} <= set(codec.RESPONSE_TYPES)
    assert codec.RESPONSE_OPCODE[0x70] == 0x71 and codec.RESPONSE_OPCODE[0x07] == 0x07
    covered = {type(m) for m in EXAMPLES}
    assert set(codec.REQUEST_TYPES.values()) <= covered
    assert set(codec.RESPONSE_TYPES.values()) <= covered


def test_error_response_is_plain_text_or_code_and_string():
    # the real server's WriteError (flags 0) and sendErrorResponse (code + string)
    assert ErrorResponse("no").encode() == b"no"
    assert ErrorResponse("no").to_frame() == b"\xaf\x01\xff\x00\x00\x00\x00\x02no"
    assert ErrorResponse("no", 1).encode() == b"\x00\x00\x00\x01\x00\x02no"
    assert ErrorResponse("no", 1).to_frame()[3] == 0x01
    # decoded as the real client's decodeError does: coded when it fits, else plain
    assert ErrorResponse.decode(b"topic not found") == ErrorResponse("topic not found")
    assert ErrorResponse.decode(b"\x00\x00\x00\x01\x00\x02no") == ErrorResponse("no", 1)
    assert ErrorResponse.decode(b"") == ErrorResponse("")


def test_auth_request_repr_hides_password():
    assert "s3cret" not in repr(AuthRequest("alice", "s3cret"))


def test_empty_key_decodes_as_no_key():
    assert ProduceRequest.decode(ProduceRequest("t", b"v", b"").encode()).key is None


# ---------------------------------------------------------------- bad payloads

@pytest.mark.parametrize("msg", [m for m in EXAMPLES
                                 if m.encode() and not isinstance(m, ErrorResponse)],
                         ids=lambda m: type(m).__name__)
def test_every_truncation_raises_codec_error(msg):
    payload = msg.encode()
    if isinstance(msg, FetchRequest) and msg.filter:
        # the optional filter is dropped, not refused, when cut (real server's rule)
        payload = FetchRequest(msg.topic, msg.partition, msg.offset, msg.max_messages).encode()
    for cut in range(len(payload)):
        with pytest.raises(FlyMQCodecError):
            type(msg).decode(payload[:cut])


@pytest.mark.parametrize("msg", [m for m in EXAMPLES
                                 if m.KIND == "response" and not isinstance(m, ErrorResponse)],
                         ids=lambda m: type(m).__name__)
def test_trailing_bytes_in_a_response_raise_codec_error(msg):
    with pytest.raises(FlyMQCodecError, match="trailing"):
        type(msg).decode(msg.encode() + b"\x00")


# ------------------------------------------- requests as the real server reads them
# firefly-oss/flymq 4df79e0 internal/protocol/binary.go: every DecodeBinary*Request stops
# after its last known field, so a newer client's extra fields never make it fail.

@pytest.mark.parametrize("msg", [m for m in EXAMPLES if m.KIND == "request"],
                         ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("extra", [b"\x00", b"\x00\x07newer-field", b"\xff" * 3])
def test_requests_ignore_trailing_fields_like_the_real_server(msg, extra):
    got = type(msg).decode(msg.encode() + extra)
    if isinstance(msg, FetchRequest) and not msg.filter:
        got.filter = ""  # the extra bytes are read as a filter: see the next test
    assert got == msg


def test_fetch_reads_the_optional_filter_string():
    base = FetchRequest("orders", 0, 10, 50).encode()
    # real client (EncodeBinaryFetchRequest) always appends the filter, even when empty
    assert FetchRequest.decode(base + b"\x00\x00") == FetchRequest("orders", 0, 10, 50)
    assert FetchRequest.decode(base + b"\x00\x03abc") == FetchRequest("orders", 0, 10, 50, "abc")
    # a filter whose bytes are not all there is ignored, not an error
    assert FetchRequest.decode(base + b"\x00\x09ab").filter == ""
    assert FetchRequest.decode(base + b"\x00").filter == ""
    # a filter round-trips; no filter encodes as the four spec fields only
    assert FetchRequest.decode(FetchRequest("t", 1, 2, 3, "x").encode()).filter == "x"
    assert len(FetchRequest("t", 1, 2, 3).encode()) == 2 + 1 + 16


def test_subscribe_mode_is_u8_length_prefixed_like_the_real_server():
    payload = (b"\x00\x06orders" + b"\x00\x02g1" + b"\x00\x00\x00\x03"
               + b"\x06commit")
    assert SubscribeRequest.decode(payload) == SubscribeRequest("orders", "g1", 3, "commit")
    assert SubscribeRequest("orders", "g1", 3, "commit").encode() == payload
    # empty mode (the server treats it as "latest")
    assert SubscribeRequest.decode(payload[:-7] + b"\x00").mode == ""
    with pytest.raises(FlyMQCodecError):
        SubscribeRequest("t", "g", 0, "x" * 256).encode()


def test_request_strings_are_not_checked_for_utf8_and_echo_back_unchanged():
    req = MetadataRequest.decode(b"\x00\x02\xff\xfe")
    assert MetadataRequest(req.topic).encode() == b"\x00\x02\xff\xfe"


def test_list_topics_request_ignores_its_payload():
    assert ListTopicsRequest.decode(b"anything") == ListTopicsRequest()


def test_truncated_message_names_field_and_offset():
    with pytest.raises(FlyMQCodecError, match=r"PRODUCE request.*value.*offset 14"):
        ProduceRequest.decode(SPEC_PRODUCE_PAYLOAD[:16])


def test_bad_bool_and_bad_utf8():
    with pytest.raises(FlyMQCodecError, match="bool"):
        CommitResponse.decode(b"\x02")
    with pytest.raises(FlyMQCodecError, match="UTF-8"):
        ListTopicsResponse.decode(b"\x00\x00\x00\x01\x00\x02\xff\xfe")


def test_huge_counts_fail_fast():
    with pytest.raises(FlyMQCodecError, match="truncated"):
        FetchResponse.decode(b"\xff\xff\xff\xff" + b"\x00" * 8)
    with pytest.raises(FlyMQCodecError, match="truncated"):
        ListTopicsResponse.decode(b"\xff\xff\xff\xff")
    with pytest.raises(FlyMQCodecError):
        MetadataResponse.decode(b"\x00\x01t\x7f\xff\xff\xff")
    with pytest.raises(FlyMQCodecError, match="truncated"):
        MetadataResponse.decode(b"\x00\x01t\xff\xff\xff\xff")


def test_unknown_opcode_has_no_layout():
    with pytest.raises(FlyMQCodecError, match="0x99"):
        decode_request(0x99, b"")
    with pytest.raises(FlyMQCodecError, match="REGISTER_SCHEMA"):
        decode_response(0x10, b"")


ALL_DECODERS = sorted({*codec.REQUEST_TYPES.values(), *codec.RESPONSE_TYPES.values()},
                      key=lambda c: c.__name__)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), cls_index=st.integers(0, len(ALL_DECODERS) - 1))
def test_random_bytes_only_ever_raise_codec_error(data, cls_index):
    cls = ALL_DECODERS[cls_index]
    try:
        msg = cls.decode(data)
    except FlyMQCodecError:
        return
    # whatever decodes must encode back to the same bytes (strict, canonical layout);
    # only ERROR tolerates a non-canonical success byte of 0x01. Requests are read as the
    # real server reads them (trailing bytes ignored, a cut FETCH filter dropped): their
    # encoding is a prefix of what was read.
    if cls is ErrorResponse:  # any bytes are an error text (the real client's fallback)
        assert isinstance(msg.message, str)
    elif cls.KIND == "request":
        assert data.startswith(msg.encode())
    else:
        assert msg.encode() == data


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=64))
def test_random_bytes_into_frame_decoders(data):
    for fn in (decode_header, decode_frame):
        try:
            fn(data)
        except FlyMQCodecError:
            pass


_text = st.text(max_size=40)
_blob = st.binary(max_size=100)
_i32 = st.integers(-2**31, 2**31 - 1)
_u64 = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(topic=_text, value=_blob, key=st.one_of(st.none(), st.binary(min_size=1, max_size=50)),
       partition=_i32)
def test_produce_round_trip_property(topic, value, key, partition):
    msg = ProduceRequest(topic, value, key, partition)
    assert ProduceRequest.decode(msg.to_frame()[8:]) == msg


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(st.tuples(_u64, _blob, st.one_of(st.none(), st.binary(min_size=1, max_size=20))),
                         max_size=10), next_offset=_u64)
def test_fetch_response_round_trip_property(messages, next_offset):
    msg = FetchResponse([FetchedMessage(o, v, k) for o, v, k in messages], next_offset)
    assert FetchResponse.decode(msg.encode()) == msg


@settings(max_examples=200, deadline=None)
@given(success=st.booleans(), error=_text, user=_text, roles=st.lists(_text, max_size=5))
def test_auth_response_round_trip_property(success, error, user, roles):
    msg = AuthResponse(success, error, user, roles)
    assert AuthResponse.decode(msg.encode()) == msg
