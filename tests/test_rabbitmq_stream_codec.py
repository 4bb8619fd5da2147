"""RabbitMQ Stream codec: every command both ways, frames at every split point, chunks."""

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.errors import FrameError
from proxy.protocols.rabbitmq_stream import constants as C
from proxy.protocols.rabbitmq_stream.codec import (
    REQUEST_LAYOUTS,
    RESPONSE_LAYOUTS,
    Broker,
    Chunk,
    Command,
    CommandVersion,
    PublishedMessage,
    PublishingError,
    StreamCodecError,
    StreamMetadata,
    SubBatch,
    build_chunk,
    decode_body,
    decode_command,
    decode_frame,
    decode_metadata_response,
    encode_body,
    encode_command,
    encode_frame,
    encode_metadata_response,
    parse_chunk,
    parse_chunk_header,
    parse_delivered_chunk,
    split_deliver,
)

CHUNK = build_chunk([b"first", SubBatch.of([b"a", b"bb"]), b""], first_offset=40,
                    timestamp=1_700_000_000_123, epoch=3)

# (key, response, version, fields): one entry per direction of every command.
CASES = [
    (C.DECLARE_PUBLISHER, False, 1, dict(correlation_id=1, publisher_id=7, reference="ref",
                                         stream="orders")),
    (C.DECLARE_PUBLISHER, True, 1, dict(correlation_id=1, code=C.PRECONDITION_FAILED)),
    (C.PUBLISH, False, 1, dict(publisher_id=2, messages=[
        PublishedMessage(1, b"hello"), PublishedMessage(2, b""),
        PublishedMessage(3, SubBatch.of([b"x", b"yz"]))])),
    (C.PUBLISH, False, 2, dict(publisher_id=2, messages=[
        PublishedMessage(9, b"hello", "eu"), PublishedMessage(10, b"world", None)])),
    (C.PUBLISH_CONFIRM, False, 1, dict(publisher_id=2, publishing_ids=[1, 2, 2**64 - 1])),
    (C.PUBLISH_ERROR, False, 1, dict(publisher_id=2, errors=[
        PublishingError(5, C.PUBLISHER_DOES_NOT_EXIST)])),
    (C.QUERY_PUBLISHER_SEQUENCE, False, 1, dict(correlation_id=3, reference="r", stream="s")),
    (C.QUERY_PUBLISHER_SEQUENCE, True, 1, dict(correlation_id=3, code=C.OK, sequence=99)),
    (C.DELETE_PUBLISHER, False, 1, dict(correlation_id=4, publisher_id=255)),
    (C.DELETE_PUBLISHER, True, 1, dict(correlation_id=4, code=C.OK)),
    (C.SUBSCRIBE, False, 1, dict(correlation_id=5, subscription_id=1, stream="s",
                                 offset_type=C.OFFSET_FIRST, offset=None, credit=10,
                                 properties={})),
    (C.SUBSCRIBE, False, 1, dict(correlation_id=5, subscription_id=1, stream="s",
                                 offset_type=C.OFFSET_OFFSET, offset=2**63, credit=1,
                                 properties={"name": "c1", "single-active-consumer": "true"})),
    (C.SUBSCRIBE, False, 1, dict(correlation_id=5, subscription_id=1, stream="s",
                                 offset_type=C.OFFSET_TIMESTAMP, offset=-5, credit=1,
                                 properties={})),
    (C.SUBSCRIBE, True, 1, dict(correlation_id=5, code=C.STREAM_DOES_NOT_EXIST)),
    (C.DELIVER, False, 1, dict(subscription_id=4, chunk=parse_chunk(CHUNK))),
    (C.DELIVER, False, 2, dict(subscription_id=4, committed_chunk_id=40,
                               chunk=parse_chunk(CHUNK))),
    (C.CREDIT, False, 1, dict(subscription_id=4, credit=65535)),
    (C.CREDIT, True, 1, dict(code=C.SUBSCRIPTION_ID_DOES_NOT_EXIST, subscription_id=4)),
    (C.STORE_OFFSET, False, 1, dict(reference="app", stream="s", offset=123)),
    (C.QUERY_OFFSET, False, 1, dict(correlation_id=6, reference="app", stream="s")),
    (C.QUERY_OFFSET, True, 1, dict(correlation_id=6, code=C.NO_OFFSET, offset=0)),
    (C.UNSUBSCRIBE, False, 1, dict(correlation_id=7, subscription_id=4)),
    (C.UNSUBSCRIBE, True, 1, dict(correlation_id=7, code=C.OK)),
    (C.CREATE, False, 1, dict(correlation_id=8, stream="s",
                              arguments={"max-length-bytes": "1000"})),
    (C.CREATE, True, 1, dict(correlation_id=8, code=C.STREAM_ALREADY_EXISTS)),
    (C.DELETE, False, 1, dict(correlation_id=9, stream="s")),
    (C.DELETE, True, 1, dict(correlation_id=9, code=C.OK)),
    (C.METADATA, False, 1, dict(correlation_id=10, streams=["a", "b"])),
    (C.METADATA, True, 1, dict(correlation_id=10, brokers=[Broker(0, "host", 5552)],
                               streams=[StreamMetadata("a", C.OK, 0, [1, 2]),
                                        StreamMetadata("b", 2, 0xFFFF, [])])),
    (C.METADATA_UPDATE, False, 1, dict(code=C.STREAM_NOT_AVAILABLE, stream="s")),
    (C.PEER_PROPERTIES, False, 1, dict(correlation_id=11, properties={"product": "x"})),
    (C.PEER_PROPERTIES, True, 1, dict(correlation_id=11, code=C.OK, properties={})),
    (C.SASL_HANDSHAKE, False, 1, dict(correlation_id=12)),
    (C.SASL_HANDSHAKE, True, 1, dict(correlation_id=12, code=C.OK,
                                     mechanisms=["PLAIN", "ANONYMOUS"])),
    (C.SASL_AUTHENTICATE, False, 1, dict(correlation_id=13, mechanism="PLAIN",
                                         data=b"\0guest\0guest")),
    (C.SASL_AUTHENTICATE, False, 1, dict(correlation_id=13, mechanism="ANONYMOUS",
                                         data=None)),
    (C.SASL_AUTHENTICATE, True, 1, dict(correlation_id=13, code=C.OK, challenge=None)),
    (C.SASL_AUTHENTICATE, True, 1, dict(correlation_id=13, code=0x0A,  # SASL_CHALLENGE
                                        challenge=b"nonce")),
    (C.TUNE, False, 1, dict(frame_max=1048576, heartbeat=60)),
    (C.TUNE, True, 1, dict(frame_max=0, heartbeat=0)),
    (C.OPEN, False, 1, dict(correlation_id=14, virtual_host="/")),
    (C.OPEN, True, 1, dict(correlation_id=14, code=C.OK,
                           properties={"advertised_host": "h", "advertised_port": "5552"})),
    (C.OPEN, True, 1, dict(correlation_id=14, code=C.VIRTUAL_HOST_ACCESS_FAILURE,
                           properties=None)),
    (C.CLOSE, False, 1, dict(correlation_id=15, code=C.OK, reason="bye")),
    (C.CLOSE, True, 1, dict(correlation_id=15, code=C.OK)),
    (C.HEARTBEAT, False, 1, dict()),
    (C.ROUTE, False, 1, dict(correlation_id=16, routing_key="k", super_stream="ss")),
    (C.ROUTE, True, 1, dict(correlation_id=16, code=C.OK, streams=["ss-0"])),
    (C.PARTITIONS, False, 1, dict(correlation_id=17, super_stream="ss")),
    (C.PARTITIONS, True, 1, dict(correlation_id=17, code=C.OK, streams=["ss-0", "ss-1"])),
    (C.CONSUMER_UPDATE, False, 1, dict(correlation_id=18, subscription_id=3, active=1)),
    (C.CONSUMER_UPDATE, True, 1, dict(correlation_id=18, code=C.OK,
                                      offset_type=C.OFFSET_OFFSET, offset=77)),
    (C.CONSUMER_UPDATE, True, 1, dict(correlation_id=18, code=C.OK,
                                      offset_type=C.OFFSET_NEXT, offset=None)),
    (C.EXCHANGE_COMMAND_VERSIONS, False, 1, dict(correlation_id=19, commands=[
        CommandVersion(C.PUBLISH, 1, 2), CommandVersion(C.DELIVER, 1, 2)])),
    (C.EXCHANGE_COMMAND_VERSIONS, True, 1, dict(correlation_id=19, code=C.OK, commands=[
        CommandVersion(1, 1, 1), CommandVersion(2, 1, 2)])),
    (C.STREAM_STATS, False, 1, dict(correlation_id=20, stream="s")),
    (C.STREAM_STATS, True, 1, dict(correlation_id=20, code=C.OK,
                                   stats={"first_chunk_id": 0, "committed_chunk_id": -1})),
]


def _case_id(case):
    key, response, version, _ = case
    return f"{C.command_name(key)}{'-resp' if response else ''}-v{version}"


def test_every_command_has_a_case():
    requests = {k for k, resp, _, _ in CASES if not resp}
    responses = {k for k, resp, _, _ in CASES if resp}
    assert requests == set(REQUEST_LAYOUTS) == set(C.COMMANDS)
    assert responses == set(RESPONSE_LAYOUTS)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_round_trip(case):
    key, response, version, fields = case
    frame = encode_command(key, response=response, version=version, **fields)
    size, wire_key, wire_version = struct.unpack_from(">IHH", frame)
    assert size == len(frame) - 4
    assert wire_key == key | (C.RESPONSE_BIT if response else 0)
    assert wire_version == version
    cmd = decode_command(frame)
    assert (cmd.key, cmd.response, cmd.version) == (key, response, version)
    assert cmd.fields == fields
    assert cmd.to_frame() == frame


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_truncated_body_raises_codec_error(case):
    key, response, version, fields = case
    frame = encode_command(key, response=response, version=version, **fields)
    wire_key = key | (C.RESPONSE_BIT if response else 0)
    body = frame[8:]
    for cut in range(len(body)):
        try:
            decode_body(wire_key, version, body[:cut])
        except StreamCodecError as exc:
            assert isinstance(exc, ValueError) and isinstance(exc, FrameError)
            assert str(exc).startswith("rabbitmq-stream: ")
        else:
            # Only a body ending in an optional field may legally stop early.
            assert key in (C.OPEN, C.SASL_AUTHENTICATE, C.SUBSCRIBE) or (
                key == C.CONSUMER_UPDATE and response), (key, cut)
    with pytest.raises(StreamCodecError):
        decode_body(wire_key, version, body + b"\0")


def test_known_wire_bytes_match_rstream_and_the_real_server():
    # PeerProperties request as rstream writes it: count 1, "a" -> "b".
    assert encode_command(C.PEER_PROPERTIES, correlation_id=1, properties={"a": "b"}) == (
        bytes.fromhex("00000012" "0011" "0001" "00000001" "00000001" "0001" "61" "0001" "62"))
    # Credit response: code then subscription id, no correlation id (rabbit_stream_core).
    assert encode_command(C.CREDIT, response=True, code=4, subscription_id=9) == (
        bytes.fromhex("00000007" "8009" "0001" "0004" "09"))
    # Open response without properties (what the real server sends on failure).
    cmd = decode_body(C.OPEN | C.RESPONSE_BIT, 1, bytes.fromhex("00000005" "000c"))
    assert (cmd.correlation_id, cmd.code, cmd.properties) == (5, 0x0C, None)
    # Subscribe without the properties array (the real server accepts it).
    body = bytes.fromhex("00000002" "01" "0001" "73" "0001" "000a")
    assert decode_body(C.SUBSCRIBE, 1, body).properties == {}
    # ConsumerUpdate response as rstream writes it (offset always present).
    body = bytes.fromhex("00000003" "0001" "0003" "0000000000000000")
    assert decode_body(C.CONSUMER_UPDATE | C.RESPONSE_BIT, 1, body).offset == 0
    # Null strings decode as None.
    body = struct.pack(">IBhh", 1, 0, -1, 1) + b"s"
    assert decode_body(C.DECLARE_PUBLISHER, 1, body).reference is None


def test_metadata_helpers():
    frame = encode_metadata_response(
        42, [(0, "broker-a", 5552), (1, "broker-b", 5553)],
        [("orders", C.OK, 0, [1]), ("missing", C.STREAM_DOES_NOT_EXIST, 0xFFFF, [])])
    key, version, body, size = decode_frame(frame)
    assert (key, version, size) == (C.METADATA | C.RESPONSE_BIT, 1, len(frame))
    assert decode_metadata_response(body) == (
        42, [(0, "broker-a", 5552), (1, "broker-b", 5553)],
        [("orders", C.OK, 0, [1]), ("missing", C.STREAM_DOES_NOT_EXIST, 0xFFFF, [])])
    with pytest.raises(StreamCodecError):
        decode_metadata_response(body[:-1])


# --------------------------------------------------------------------------- frames

FRAMES = [encode_command(*c[:1], response=c[1], version=c[2], **c[3]) for c in CASES[:12]]
STREAM = b"".join(FRAMES)


def _split_all(data: bytes, pieces):
    buf = bytearray()
    out = []
    for piece in pieces:
        buf += piece
        while (split := decode_frame(buf)) is not None:
            key, version, body, size = split
            out.append((key, version, body))
            del buf[:size]
    assert not buf
    return out


EXPECTED = [(struct.unpack_from(">H", f, 4)[0], struct.unpack_from(">H", f, 6)[0], f[8:])
            for f in FRAMES]


def test_decode_frame_at_every_split_point():
    for cut in range(len(STREAM) + 1):
        assert _split_all(STREAM, [STREAM[:cut], STREAM[cut:]]) == EXPECTED


def test_decode_frame_one_byte_at_a_time():
    assert _split_all(STREAM, [STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_decode_frame_limits():
    assert decode_frame(b"\x00\x00\x00") is None
    assert decode_frame(b"\x00\x00\x00\x08\x00\x17") is None
    with pytest.raises(StreamCodecError, match="below the minimum") as info:
        decode_frame(b"\x00\x00\x00\x03\x00\x17\x00")
    assert info.value.reason == "short_frame"
    with pytest.raises(StreamCodecError, match="exceeds the limit 100") as info:
        decode_frame(struct.pack(">I", 101), max_size=100)  # rejected before any body arrived
    assert info.value.reason == "too_large"
    with pytest.raises(StreamCodecError, match="TLS"):
        decode_frame(b"\x16\x03\x01\x02\x00\x01\x00\x01")
    assert decode_frame(encode_frame(C.HEARTBEAT, 1, b""), max_size=4) == (C.HEARTBEAT, 1,
                                                                           b"", 8)
    assert decode_frame(struct.pack(">I", 2**31) + b"x", max_size=0) is None  # no limit


def test_unknown_key_and_version():
    with pytest.raises(StreamCodecError, match="unknown request key 0x0063") as info:
        decode_body(99, 1, b"")
    assert info.value.reason == "unknown_key"
    with pytest.raises(StreamCodecError, match="unknown response key 0x8002"):
        decode_body(C.PUBLISH | C.RESPONSE_BIT, 1, b"")
    with pytest.raises(StreamCodecError, match=r"Publish version 3 .*1\.\.2") as info:
        decode_body(C.PUBLISH, 3, b"")
    assert info.value.reason == "bad_version"
    with pytest.raises(StreamCodecError, match="Open version 2"):
        decode_body(C.OPEN, 2, b"")


def test_encode_errors_are_codec_errors():
    with pytest.raises(StreamCodecError, match="needs field 'stream'"):
        encode_command(C.DELETE, correlation_id=1)
    with pytest.raises(StreamCodecError, match="publisher_id=256"):
        encode_command(C.DELETE_PUBLISHER, correlation_id=1, publisher_id=256)
    with pytest.raises(StreamCodecError, match="at most 32767"):
        encode_command(C.DELETE, correlation_id=1, stream="x" * 40000)


# --------------------------------------------------------------------------- chunks

def test_chunk_header_fields_and_crc():
    (magic, ctype, entries, records, ts, epoch, first, crc, data_len, trailer_len,
     reserved) = struct.unpack_from(">BBHIqQQIIII", CHUNK)
    data = CHUNK[48:]
    assert (magic, ctype, entries, records) == (0x50, 0, 3, 4)
    assert (ts, epoch, first) == (1_700_000_000_123, 3, 40)
    assert (data_len, trailer_len, reserved) == (len(data), 0, 0)
    assert crc == zlib.crc32(data)
    # Entries: simple = u32 size (top bit 0) + record; sub-batch = 0x80|comp<<4 ...
    assert data[:9] == b"\x00\x00\x00\x05first"
    assert data[9] == 0x80 and struct.unpack_from(">HII", data, 10) == (2, 11, 11)
    chunk = parse_chunk(CHUNK)
    assert chunk.records() == [b"first", b"a", b"bb", b""]
    assert (chunk.num_entries, chunk.num_records, chunk.crc) == (3, 4, crc)
    assert chunk.to_bytes() == CHUNK


def test_chunk_bad_crc_and_corruption():
    bad = bytearray(CHUNK)
    bad[48 + 4] ^= 0xFF  # first byte of the record b"first"
    with pytest.raises(StreamCodecError, match="CRC") as info:
        parse_chunk(bytes(bad))
    assert info.value.reason == "bad_crc"
    assert parse_chunk(bytes(bad), verify_crc=False).num_records == 4
    with pytest.raises(StreamCodecError, match="magic"):
        parse_chunk(b"\x40" + CHUNK[1:])
    with pytest.raises(StreamCodecError, match="says 5 records"):
        parse_chunk(CHUNK[:4] + struct.pack(">I", 5) + CHUNK[8:])
    for cut in range(len(CHUNK)):
        with pytest.raises(StreamCodecError):
            parse_chunk(CHUNK[:cut])
    with pytest.raises(StreamCodecError):
        parse_chunk(CHUNK + b"\0")


def test_deliver_with_bad_crc_is_refused():
    frame = bytearray(encode_command(C.DELIVER, subscription_id=1, chunk=CHUNK))
    frame[-1] ^= 0x01
    with pytest.raises(StreamCodecError, match="CRC"):
        decode_command(bytes(frame))


def test_gzip_sub_batch():
    raw = SubBatch.of([b"one", b"two"])
    gz = zlib.compressobj(wbits=31)
    data = gz.compress(raw.data) + gz.flush()
    chunk = parse_chunk(build_chunk([SubBatch(1, 2, len(raw.data), data)], 0, 0))
    assert chunk.records() == [b"one", b"two"]
    with pytest.raises(StreamCodecError, match="compression 3"):
        SubBatch(3, 1, 1, b"x").records()


def test_command_attribute_errors_are_clear():
    cmd = Command(C.HEARTBEAT)
    with pytest.raises(AttributeError, match="Heartbeat has no field 'stream'"):
        cmd.stream


# --------------------------------------------------------------------------- properties

@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.integers(0, 0xFFFF), version=st.integers(0, 3), body=st.binary(max_size=200))
def test_garbage_bodies_raise_only_codec_errors(key, version, body):
    try:
        decode_body(key, version, body)
    except StreamCodecError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_streams_raise_only_codec_errors(data):
    try:
        split = decode_frame(data, max_size=1 << 16)
        if split is not None:
            decode_body(*split[:3])
        parse_chunk(data)
    except StreamCodecError:
        pass


def _mutations(frame: bytes):
    for i in range(8, len(frame)):
        for flip in (0x01, 0x80, 0xFF):
            b = bytearray(frame)
            b[i] ^= flip
            yield bytes(b)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_bit_flips_raise_only_codec_errors(case):
    key, response, version, fields = case
    for mutated in _mutations(encode_command(key, response=response, version=version,
                                             **fields)):
        try:
            decode_command(mutated)
        except StreamCodecError:
            pass


text = st.text(max_size=20)


@settings(max_examples=200)
@given(publisher_id=st.integers(0, 255), version=st.integers(1, 2),
       messages=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=50),
                                   st.none() | text), max_size=10))
def test_publish_round_trip_property(publisher_id, version, messages):
    msgs = [PublishedMessage(pid, data, fv if version == 2 else None)
            for pid, data, fv in messages]
    cmd = decode_command(encode_command(C.PUBLISH, version=version, publisher_id=publisher_id,
                                        messages=msgs))
    assert cmd.messages == msgs and cmd.publisher_id == publisher_id


@settings(max_examples=200)
@given(records=st.lists(st.binary(max_size=40) | st.lists(st.binary(max_size=10), min_size=1,
                                                          max_size=4).map(SubBatch.of),
                        max_size=10),
       first=st.integers(0, 2**63), ts=st.integers(-2**63, 2**63 - 1))
def test_chunk_round_trip_property(records, first, ts):
    chunk = parse_chunk(build_chunk(records, first, ts))
    assert (chunk.entries, chunk.first_offset, chunk.timestamp) == (records, first, ts)
    flat = [r for e in records for r in (e.records() if isinstance(e, SubBatch) else [e])]
    assert chunk.records() == flat


@settings(max_examples=200)
@given(props=st.dictionaries(text, text, max_size=5), corr=st.integers(0, 2**32 - 1))
def test_map_round_trip_property(props, corr):
    cmd = decode_command(encode_command(C.PEER_PROPERTIES, response=True, correlation_id=corr,
                                        code=C.OK, properties=props))
    assert cmd.properties == props and cmd.correlation_id == corr


def test_chunk_dataclass_computes_counts():
    chunk = Chunk(0, 0, [b"a", SubBatch.of([b"b", b"c"])])
    assert chunk.num_records == 3 and chunk.num_entries == 2


# --------------------------------------------------------------------------- Deliver as sent

def _tracked_chunk(records, trailer=b"\x00" * 13, chunk_type=0):
    return Chunk(7, 1_700_000_000_000, list(records), chunk_type=chunk_type,
                 trailer=trailer).to_bytes()


def test_delivered_chunk_without_its_trailer_is_accepted():
    """The real server sends header + data only while the header counts the trailer."""
    whole = _tracked_chunk([b"a", SubBatch.of([b"b", b"c"])])
    without = whole[:-13]
    for data in (whole, without):
        header = parse_chunk_header(data)
        assert (header.first_offset, header.num_entries, header.num_records) == (7, 2, 3)
        assert header.trailer_length == 13
        chunk = parse_delivered_chunk(data)
        assert chunk.records() == [b"a", b"b", b"c"]
    assert parse_delivered_chunk(whole).trailer == b"\x00" * 13
    assert parse_delivered_chunk(without).trailer == b""
    with pytest.raises(StreamCodecError, match="without the trailer"):
        parse_chunk_header(without[:-1])


def test_delivered_tracking_chunk_has_no_entries():
    data = _tracked_chunk([b"\x00tracking-data-not-entries"], trailer=b"", chunk_type=1)
    chunk = parse_delivered_chunk(data)
    assert (chunk.chunk_type, chunk.entries, chunk.num_records) == (1, [], 1)


def test_delivered_chunk_checks_crc_and_counts():
    data = bytearray(_tracked_chunk([b"abc"], trailer=b""))
    data[-1] ^= 0xFF
    with pytest.raises(StreamCodecError, match="CRC") as info:
        parse_delivered_chunk(bytes(data))
    assert info.value.reason == "bad_crc"
    lying = Chunk(0, 0, [b"x"], num_records=2).to_bytes()
    with pytest.raises(StreamCodecError, match="says 2 records"):
        parse_delivered_chunk(lying)


def test_split_deliver_v1_and_v2():
    chunk = Chunk(0, 0, [b"x"]).to_bytes()
    v1 = encode_body(C.DELIVER, version=1, subscription_id=3, chunk=chunk)
    v2 = encode_body(C.DELIVER, version=2, subscription_id=3, committed_chunk_id=9,
                     chunk=chunk)
    assert split_deliver(1, v1) == (3, None, chunk)
    assert split_deliver(2, v2) == (3, 9, chunk)
    with pytest.raises(StreamCodecError, match="version 3"):
        split_deliver(3, v2)
    with pytest.raises(StreamCodecError, match="truncated"):
        split_deliver(2, v2[:5])
