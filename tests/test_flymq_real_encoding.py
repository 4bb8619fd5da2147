"""The reference FlyMQ server answers in the real server's encoding (docs/design.md,
"FlyMQ" and "Reference servers in general").

The expected bytes are written out by hand from the real server's encoders
(firefly-oss/flymq v1.26.11: ``internal/protocol/binary.go`` ``EncodeBinary*Response``,
``internal/protocol/protocol.go`` ``ReadHeader``/``WriteError``, and the handlers in
``internal/server/server.go``), not produced by our codec, so a codec that drifts from
the real layouts fails here.
"""

import socket
import struct

import pytest

from loadgen.flymq.server import FlyMQServerThread
from proxy.protocols.flymq.codec import decode_frame


def _s(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def _b(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _frame(op: int, payload: bytes = b"", version: int = 1, flags: int = 1) -> bytes:
    return bytes([0xAF, version, op, flags]) + struct.pack(">I", len(payload)) + payload


class _Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)

    def call(self, op, payload=b"", **kw):
        self.sock.sendall(_frame(op, payload, **kw))
        buf = b""
        while True:
            got = decode_frame(buf)
            if got is not None:
                return got
            chunk = self.sock.recv(65536)
            assert chunk, "server closed the connection"
            buf += chunk

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def server():
    with FlyMQServerThread(users={"alice": ("wonderland", ["admin", "producer"])}) as srv:
        yield srv


@pytest.fixture
def conn(server):
    c = _Conn(server.port)
    yield c
    c.close()


def _produce(conn, topic, value, key=b"", partition=0):
    f = conn.call(0x01, _s(topic) + _b(key) + _b(value) + struct.pack(">i", partition))
    assert f.opcode == 0x01, f.payload


def test_fetch_response_puts_next_offset_first_and_offset_before_each_record(conn):
    # EncodeBinaryFetchResponse: count u32, next_offset u64, then per message
    # offset u64, key (u32 len + bytes), value (u32 len + bytes)
    assert conn.call(0x03, _s("fetch-t") + struct.pack(">i", 1)).payload == b"\x01"
    _produce(conn, "fetch-t", b"v0", b"k0")
    _produce(conn, "fetch-t", b"value-1")
    f = conn.call(0x07, _s("fetch-t") + struct.pack(">iQi", 0, 0, 10) + _s(""))
    assert f.opcode == 0x07 and f.flags == 0x01
    assert f.payload == (struct.pack(">IQ", 2, 2)
                         + struct.pack(">Q", 0) + _b(b"k0") + _b(b"v0")
                         + struct.pack(">Q", 1) + _b(b"") + _b(b"value-1"))


def test_create_and_delete_topic_answer_one_byte_and_are_idempotent(conn):
    # EncodeBinaryCreateTopicResponse / EncodeBinaryDeleteTopicResponse: one byte; the
    # broker's ApplyCreateTopic/ApplyDeleteTopic return nil for an existing/missing topic
    for _ in range(2):
        f = conn.call(0x03, _s("idem") + struct.pack(">i", 0))
        assert (f.opcode, f.flags, f.payload) == (0x03, 0x01, b"\x01")
    for _ in range(2):
        f = conn.call(0x09, _s("idem"))
        assert (f.opcode, f.flags, f.payload) == (0x09, 0x01, b"\x01")


def test_commit_answers_one_byte_for_any_group_topic_partition(conn):
    # the broker's CommitOffset creates the group on demand and never refuses
    f = conn.call(0x06, _s("never-created") + _s("g") + struct.pack(">iQ", 7, 3))
    assert (f.opcode, f.payload) == (0x06, b"\x01")


def test_auth_is_answered_with_auth_response_in_the_real_layout(conn):
    # OpAuthResponse (0x71); EncodeBinaryAuthResponse: success u8, username (u16 string),
    # role count u32, roles as u8 length + bytes, error (u16 string)
    f = conn.call(0x70, _s("alice") + _s("wonderland"))
    assert f.opcode == 0x71 and f.flags == 0x01
    assert f.payload == (b"\x01" + _s("alice") + struct.pack(">I", 2)
                         + b"\x05admin" + b"\x08producer" + _s(""))
    f = conn.call(0x70, _s("alice") + _s("nope"))
    assert f.opcode == 0x71
    assert f.payload == b"\x00" + _s("") + struct.pack(">I", 0) + _s("invalid credentials")


def test_a_malformed_auth_gets_the_coded_error_form(conn):
    # handleAuth -> sendErrorResponse: BinaryErrorResponse{Code: 1, Message}, flag binary
    f = conn.call(0x70, b"\x00")
    assert f.opcode == 0xFF and f.flags == 0x01
    code, n = struct.unpack_from(">iH", f.payload)
    assert code == 1 and len(f.payload) == 6 + n
    assert f.payload[6:].startswith(b"invalid auth request: ")


def test_errors_are_plain_text_with_flags_zero(conn):
    # handleConn: protocol.WriteError(conn, err) -> OpError, []byte(err.Error()), flags 0
    f = conn.call(0x5A)
    assert (f.opcode, f.flags, f.payload) == (0xFF, 0x00, b"unknown opcode: 90")
    f = conn.call(0x02, _s("nowhere") + struct.pack(">iQ", 0, 0))
    assert f.opcode == 0xFF and f.flags == 0x00
    assert f.payload.startswith(b"unknown topic") and b"\x00" not in f.payload


def test_metadata_uses_the_real_code_bases_partition_layout(conn):
    # EncodeBinaryMetadataResponse: topic, u32 count, per partition id i32, leader i32,
    # oldest u64, newest u64
    conn.call(0x03, _s("meta-t") + struct.pack(">i", 2))
    _produce(conn, "meta-t", b"x", partition=1)
    f = conn.call(0x04, _s("meta-t"))
    assert f.payload == (_s("meta-t") + struct.pack(">I", 2)
                         + struct.pack(">iiQQ", 0, 0, 0, 0) + struct.pack(">iiQQ", 1, 0, 0, 1))


@pytest.mark.parametrize("version", [0x00, 0x02, 0xFF])
def test_a_protocol_version_mismatch_closes_the_connection_without_an_answer(server, version):
    # ReadHeader returns ErrInvalidVersion before reading the payload; handleConn returns
    before = server.server.requests_served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(_frame(0x08, version=version))
        try:
            got = raw.recv(100)
        except ConnectionResetError:
            got = b""
        assert got == b""
    assert server.server.requests_served == before
    c = _Conn(server.port)          # the server carries on
    try:
        assert c.call(0x08).opcode == 0x08
    finally:
        c.close()
