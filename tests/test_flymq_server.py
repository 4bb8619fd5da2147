"""Reference FlyMQ server driven over real sockets by the sync client."""

import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from loadgen.flymq.client import FlyMQAuthError, FlyMQClient, FlyMQServerError, parse_host
from loadgen.flymq.server import FlyMQServerThread, main
from proxy.protocols.flymq import codec
from proxy.protocols.flymq.codec import (
    CreateTopicResponse,
    ErrorResponse,
    FetchResponse,
    SubscribeResponse,
    ProduceRequest,
    RecordMetadata,
    decode_frame,
)
from proxy.protocols.flymq.constants import ERROR, MAX_FRAME_BYTES, METADATA, PRODUCE
from tests._support.processes import ROOT, frametap_env


@pytest.fixture
def server():
    with FlyMQServerThread(users={"alice": "wonderland", "bob": ("builder", ["producer"])}) as srv:
        yield srv


@pytest.fixture
def client(server):
    c = FlyMQClient("127.0.0.1", server.port, timeout=5)
    yield c
    c.close()


def test_produce_then_consume_and_fetch_return_stored_values(client):
    assert client.create_topic("orders", 1).success
    metas = [client.produce("orders", b"value-%d" % i, key=b"k%d" % i if i % 2 else None)
             for i in range(5)]
    assert [m.offset for m in metas] == [0, 1, 2, 3, 4]
    assert all(m.topic == "orders" and m.partition == 0 for m in metas)
    assert [m.key_size for m in metas] == [-1, 2, -1, 2, -1]
    assert [m.value_size for m in metas] == [7] * 5
    now_ms = time.time() * 1000
    assert all(abs(m.timestamp - now_ms) < 10_000 for m in metas)

    got = client.consume("orders", 0, 3)
    assert (got.key, got.value) == (b"k3", b"value-3")
    assert client.consume("orders", 0, 0).key is None

    batch = client.fetch("orders", 0, 1, max_messages=3)
    assert [(m.offset, m.key, m.value) for m in batch.messages] == [
        (1, b"k1", b"value-1"), (2, None, b"value-2"), (3, b"k3", b"value-3")]
    assert batch.next_offset == 4
    tail = client.fetch("orders", 0, batch.next_offset, max_messages=100)
    assert [m.offset for m in tail.messages] == [4] and tail.next_offset == 5
    empty = client.fetch("orders", 0, 5)
    assert empty.messages == [] and empty.next_offset == 5


def test_consume_missing_offset_or_topic_is_error(client):
    client.produce("t", b"only")
    with pytest.raises(FlyMQServerError, match="offset 1 out of range"):
        client.consume("t", 0, 1)
    with pytest.raises(FlyMQServerError, match="unknown topic"):
        client.consume("nope", 0, 0)
    with pytest.raises(FlyMQServerError, match="no partition 3"):
        client.fetch("t", 3, 0)
    # the connection is still usable after ERROR responses
    assert client.consume("t", 0, 0).value == b"only"


def test_partition_choice_keyed_and_round_robin(client):
    client.create_topic("p3", 3)
    unkeyed = [client.produce("p3", b"x").partition for _ in range(6)]
    assert sorted(unkeyed) == [0, 0, 1, 1, 2, 2]
    keyed = {client.produce("p3", b"x", key=b"user-42").partition for _ in range(5)}
    assert len(keyed) == 1
    explicit = client.produce("p3", b"x", partition=2)
    assert explicit.partition == 2
    meta = client.metadata("p3")
    assert meta.partitions == 3 and sum(meta.high_watermarks) == 12
    with pytest.raises(FlyMQServerError, match="no partition 7"):
        client.produce("p3", b"x", partition=7)


def test_produce_auto_creates_topic_with_one_partition(client):
    assert "fresh" not in client.list_topics()
    client.produce("fresh", b"v")
    assert "fresh" in client.list_topics()
    assert client.metadata("fresh").high_watermarks == [1]


def test_topic_admin(client):
    assert client.create_topic("a", 2).success
    # as in the real broker: creating an existing topic and deleting a missing one succeed
    assert client.create_topic("a", 5).success and client.metadata("a").partitions == 2
    with pytest.raises(FlyMQServerError, match="partitions must be"):
        client.create_topic("b", -1)  # 0 means 1, as on the real server
    assert client.list_topics() == ["a"]
    assert client.delete_topic("a").success
    assert client.delete_topic("a").success
    assert client.list_topics() == []
    with pytest.raises(FlyMQServerError, match="unknown topic"):
        client.metadata("a")


def test_subscribe_and_commit_keep_group_offsets(server, client):
    client.create_topic("events", 2)
    for i in range(7):
        client.produce("events", b"e%d" % i, partition=1)
    assert client.subscribe("events", "g1", 1, "earliest") == 0
    assert client.subscribe("events", "g1", 1, "latest") == 7
    assert client.subscribe("events", "g1", 1, "commit") == 0  # nothing committed yet
    assert client.commit("events", "g1", 1, 5) is True
    assert client.commit("missing", "g1", 0, 1)  # the real broker stores any offset
    with FlyMQClient("127.0.0.1", server.port) as other:
        assert other.subscribe("events", "g1", 1, "commit") == 5
        assert other.subscribe("events", "g2", 1, "commit") == 0
        assert other.subscribe("events", "g1", 0, "commit") == 0
    with pytest.raises(FlyMQServerError, match="bad subscribe mode"):
        client.subscribe("events", "g1", 1, "newest")


def test_auth_ok_and_fail(client):
    ok = client.auth("alice", "wonderland")
    assert ok.success and ok.username == "alice" and ok.roles == ["admin"]
    assert client.auth("bob", "builder").roles == ["producer"]
    with pytest.raises(FlyMQAuthError, match="invalid credentials"):
        client.auth("alice", "wrong")
    with pytest.raises(FlyMQAuthError):
        client.auth("mallory", "wonderland")


def test_require_auth_refuses_requests_before_auth():
    with FlyMQServerThread(users={"alice": "pw"}, require_auth=True) as srv:
        with FlyMQClient("127.0.0.1", srv.port) as c:
            with pytest.raises(FlyMQServerError, match="authentication required"):
                c.produce("t", b"v")
            with pytest.raises(FlyMQAuthError):
                c.auth("alice", "nope")
            with pytest.raises(FlyMQServerError, match="authentication required"):
                c.list_topics()
            c.auth("alice", "pw")
            assert c.produce("t", b"v").offset == 0


def test_unknown_opcode_gives_error_with_text(client):
    opcode, _flags, payload = client.request(0x99, b"whatever")
    assert opcode == ERROR
    assert payload == b"unknown opcode: 153"  # the real server's plain-text error
    opcode, _flags, payload = client.request(0x10, b"")  # in the spec, not implemented
    assert opcode == ERROR and "REGISTER_SCHEMA" in ErrorResponse.decode(payload).message
    # bad payload for a known opcode: ERROR, connection stays up
    opcode, _flags, payload = client.request(PRODUCE, b"\x00\x05ab")
    assert opcode == ERROR and "bad PRODUCE request" in ErrorResponse.decode(payload).message
    assert client.list_topics() == []


def test_responses_echo_request_opcode(client):
    opcode, flags, payload = client.request(PRODUCE, ProduceRequest("t", b"v").encode())
    assert opcode == PRODUCE and flags == 1
    assert RecordMetadata.decode(payload).offset == 0
    assert client.request(METADATA, b"\x00\x01t")[0] == METADATA


def _closed_by_peer(sock):
    sock.settimeout(5)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("bad", [
    b"\x16\x03\x01\x02\x00\x01\x00\x00",                                        # TLS hello
    bytes([0xAF, 1, 1, 1]) + (MAX_FRAME_BYTES + 1).to_bytes(4, "big"),          # too large
])
def test_bad_frame_closes_that_connection_only(server, client, bad, caplog):
    client.produce("keep", b"before")
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(bad)
        assert _closed_by_peer(raw)
    assert client.produce("keep", b"after").offset == 1
    with FlyMQClient("127.0.0.1", server.port) as fresh:
        assert fresh.consume("keep", 0, 1).value == b"after"


def test_service_time_delays_responses_measurably():
    with FlyMQServerThread() as fast, FlyMQServerThread(service_time="60ms") as slow:
        with FlyMQClient("127.0.0.1", fast.port) as cf, FlyMQClient("127.0.0.1", slow.port) as cs:
            cf.list_topics(), cs.list_topics()  # warm up
            t0 = time.perf_counter()
            for _ in range(3):
                cf.list_topics()
            fast_each = (time.perf_counter() - t0) / 3
            t0 = time.perf_counter()
            for _ in range(3):
                cs.list_topics()
            slow_each = (time.perf_counter() - t0) / 3
    assert slow_each >= 0.055
    assert fast_each < 0.03


def test_service_time_keeps_pipelined_responses_in_order():
    with FlyMQServerThread(service_time="exp:5ms") as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as raw:
            raw.settimeout(10)
            raw.sendall(b"".join(ProduceRequest("t", b"m%d" % i).to_frame() for i in range(30)))
            buf = b""
            offsets = []
            while len(offsets) < 30:
                chunk = raw.recv(65536)
                assert chunk, "server closed early"
                buf += chunk
                while (frame := decode_frame(buf)) is not None:
                    buf = buf[frame.size:]
                    assert frame.opcode == PRODUCE
                    offsets.append(RecordMetadata.decode(frame.payload).offset)
    assert offsets == list(range(30))


def test_retention_drops_oldest_but_keeps_offsets():
    with FlyMQServerThread(retention_messages=10) as srv, FlyMQClient("127.0.0.1", srv.port) as c:
        for i in range(25):
            assert c.produce("r", b"%d" % i).offset == i
        got = c.fetch("r", 0, 0, max_messages=100)
        assert got.messages[0].offset > 0 and got.messages[-1].offset == 24
        assert got.next_offset == 25
        assert [m.value for m in got.messages] == [b"%d" % m.offset for m in got.messages]
        with pytest.raises(FlyMQServerError, match="out of range"):
            c.consume("r", 0, 0)


def test_main_help_returns_zero(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--listen" in out and "--service-time" in out and "--require-auth" in out


def test_main_bad_arguments_return_two(capsys):
    assert main(["--listen", "nowhere"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert main(["--service-time", "soon"]) == 2
    assert "bad service time" in capsys.readouterr().err


def test_main_port_in_use_returns_two(server, capsys):
    assert main(["--listen", f"127.0.0.1:{server.port}"]) == 2
    assert "cannot listen on" in capsys.readouterr().err


def test_client_local_address_and_closed_state(server):
    c = FlyMQClient("127.0.0.1", server.port)
    host, port = c.local_address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    c.close()
    with pytest.raises(ConnectionError, match="closed"):
        c.list_topics()


@pytest.mark.parametrize("text,expected", [
    ("flymq://10.0.0.1:19092", ("10.0.0.1", 19092)), ("127.0.0.1:9093", ("127.0.0.1", 9093)),
    ("broker", ("broker", 9092)), ("[::1]:9000", ("::1", 9000)),
])
def test_parse_host(text, expected):
    assert parse_host(text) == expected


@pytest.mark.parametrize("text", [None, "", "http://x:1", "h:99999", "h:abc", ":80"])
def test_parse_host_rejects(text):
    with pytest.raises(ValueError):
        parse_host(text)


def test_main_runs_until_sigterm():
    env = frametap_env()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from loadgen.flymq.server import main; "
         "sys.exit(main(sys.argv[1:]))", "--listen", "127.0.0.1:0", "--user", "u:p",
         "--require-auth", "--service-time", "1ms±1ms"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        with FlyMQClient("127.0.0.1", int(m.group(1))) as c:
            with pytest.raises(FlyMQServerError, match="authentication required"):
                c.list_topics()
            c.auth("u", "p")
            assert c.produce("t", b"v").offset == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------- frames a real client sends
# What the real server (firefly-oss/flymq 4df79e0, internal/protocol/binary.go and
# internal/server/server.go) accepts, ours accepts and answers the same way.

def _raw_call(port: int, opcode: int, payload: bytes, flags: int = 0x01):
    """Send one hand-built frame, return the decoded answer frame."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(bytes([0xAF, 0x01, opcode, flags]) + len(payload).to_bytes(4, "big")
                     + payload)
        buf = b""
        while True:
            frame = decode_frame(buf)
            if frame is not None:
                return frame
            chunk = sock.recv(65536)
            assert chunk, "server closed the connection without answering"
            buf += chunk


def _s(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def _fetch_payload(topic, partition, offset, max_messages) -> bytes:
    return (_s(topic) + partition.to_bytes(4, "big", signed=True) + offset.to_bytes(8, "big")
            + max_messages.to_bytes(4, "big", signed=True))


def _filled(server, client, topic="f"):
    client.create_topic(topic, 1)
    for i in range(15):
        client.produce(topic, b"Value-%d" % i, key=b"apple" if i == 7 else None)


def test_fetch_with_the_real_clients_empty_filter_is_answered(server, client):
    # before: ERROR "FETCH request payload has 2 unexpected trailing bytes"
    _filled(server, client)
    frame = _raw_call(server.port, 0x07, _fetch_payload("f", 0, 0, 3) + b"\x00\x00")
    assert frame.opcode == 0x07
    resp = FetchResponse.decode(frame.payload)
    assert [m.offset for m in resp.messages] == [0, 1, 2] and resp.next_offset == 3


def test_fetch_filter_matches_value_or_key_case_insensitively(server, client):
    _filled(server, client)
    frame = _raw_call(server.port, 0x07, _fetch_payload("f", 0, 0, 100) + _s("VALUE-1"))
    resp = FetchResponse.decode(frame.payload)
    assert [m.value for m in resp.messages] == [b"Value-1"] + [b"Value-1%d" % i for i in range(5)]
    assert resp.next_offset == 15
    resp = client.fetch_filtered("f", 0, 0, 100, "APPLE")
    assert [m.offset for m in resp.messages] == [7]


def test_fetch_zero_max_messages_means_ten(server, client):
    # before: ERROR "max_messages must be > 0, got 0"
    _filled(server, client)
    resp = FetchResponse.decode(_raw_call(server.port, 0x07, _fetch_payload("f", 0, 0, 0)).payload)
    assert len(resp.messages) == 10


def test_subscribe_with_u8_mode_and_empty_mode_means_latest(server, client):
    # before: the u8 mode length was read as half of a u16 → "truncated" ERROR
    _filled(server, client)
    base = _s("f") + _s("g") + (0).to_bytes(4, "big")
    frame = _raw_call(server.port, 0x05, base + b"\x08earliest")
    assert (frame.opcode, SubscribeResponse.decode(frame.payload).offset) == (0x05, 0)
    frame = _raw_call(server.port, 0x05, base + b"\x00")
    assert (frame.opcode, SubscribeResponse.decode(frame.payload).offset) == (0x05, 15)


def test_create_topic_with_zero_partitions_makes_one(server, client):
    # before: CREATE_TOPIC failed with "partitions must be 1..1024, got 0"
    frame = _raw_call(server.port, 0x03, _s("zero") + (0).to_bytes(4, "big"))
    assert frame.opcode == 0x03 and CreateTopicResponse.decode(frame.payload).success
    assert client.metadata("zero").partitions == 1


@pytest.mark.parametrize("opcode, payload", [
    (0x01, _s("t") + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01v" + b"\xff\xff\xff\xff"),
    (0x02, _s("t") + (0).to_bytes(4, "big") + (0).to_bytes(8, "big")),
    (0x03, _s("u") + (2).to_bytes(4, "big")),
    (0x04, _s("t")),
    (0x06, _s("t") + _s("g") + (0).to_bytes(4, "big") + (1).to_bytes(8, "big")),
    (0x08, b""),
    (0x09, _s("u")),
    (0x70, _s("alice") + _s("wonderland")),
], ids=lambda v: f"0x{v:02X}" if isinstance(v, int) else "")
def test_every_request_ignores_a_newer_clients_trailing_field(server, client, opcode, payload):
    # before: every one got ERROR "... unexpected trailing bytes"
    client.create_topic("t", 1)
    client.produce("t", b"x")
    if opcode == 0x09:
        client.create_topic("u", 1)
    frame = _raw_call(server.port, opcode, payload + b"\x00\x04more")
    assert frame.opcode == codec.RESPONSE_OPCODE[opcode], ErrorResponse.decode(frame.payload).message


def test_gzip_compressed_payload_is_inflated(server, client):
    import gzip
    payload = _s("gz") + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x02hi" + b"\xff\xff\xff\xff"
    frame = _raw_call(server.port, 0x01, gzip.compress(payload), flags=0x03)
    assert frame.opcode == 0x01
    assert RecordMetadata.decode(frame.payload).topic == "gz"
    assert client.consume("gz", 0, 0).value == b"hi"
    frame = _raw_call(server.port, 0x01, b"not gzip", flags=0x02)
    assert frame.opcode == ERROR and "decompress" in ErrorResponse.decode(frame.payload).message
