"""Against a real, private RabbitMQ node (tests/rabbitmq_node.py): rstream, the reference
client, validates the node; then frametap's sync client talks to the same node and
interoperates with rstream in both directions."""

import asyncio
import uuid

import pytest

from loadgen.rabbitmq_stream.client import (
    StreamClient,
    StreamConnectionClosed,
    StreamServerError,
    amqp_body,
    amqp_data,
)
from proxy.protocols.rabbitmq_stream import constants as C
from tests.rabbitmq_node import rabbitmq_node  # noqa: F401  (pytest fixture)

pytestmark = pytest.mark.slow

rstream = pytest.importorskip("rstream")

N = 200


def _stream_name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _client(node, **kw):
    return StreamClient(node.host, node.stream_port, timeout=10.0, **kw)


async def _rstream_publish(node, stream, bodies):
    """Publish with rstream, waiting for every confirm; returns (confirmed, errors)."""
    confirmed, errors = [], []
    done = asyncio.Event()

    async def on_confirm(status):
        (confirmed if status.is_confirmed else errors).append(status.message_id)
        if len(confirmed) + len(errors) == len(bodies):
            done.set()

    async with rstream.Producer(node.host, node.stream_port, username="guest",
                                password="guest") as producer:
        await producer.create_stream(stream, exists_ok=True)
        for i in range(0, len(bodies), 50):
            await producer.send_batch(stream, bodies[i:i + 50], on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 30)
    return confirmed, errors


async def _rstream_consume(node, stream, count, decoder=None):
    """Read ``count`` messages from the start of ``stream`` with rstream."""
    received = []
    offsets = []
    done = asyncio.Event()

    async def on_message(msg, ctx):
        received.append(msg)
        offsets.append(ctx.offset)
        if len(received) >= count:
            done.set()

    consumer = rstream.Consumer(node.host, node.stream_port, username="guest",
                                password="guest")
    await consumer.start()
    try:
        await consumer.subscribe(
            stream, on_message, decoder=decoder,
            offset_specification=rstream.ConsumerOffsetSpecification(
                rstream.OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.sleep(0.3)  # anything beyond `count` would show up now
    finally:
        await consumer.close()
    return received, offsets


def test_fixture_node(rabbitmq_node):
    node = rabbitmq_node
    assert node.nodename.startswith("frametap-test-") and node.nodename.endswith("@localhost")
    assert node.stream_port not in (5552, 5672) and node.amqp_port not in (5552, 5672)
    plugins = node.ctl("eval", "rabbit_plugins:active().").stdout
    assert "rabbitmq_stream" in plugins
    assert node.startup_seconds is not None and node.startup_seconds < 90


def test_rstream_publish_then_consume_from_first(rabbitmq_node):
    stream = _stream_name("rstream")
    bodies = [b"message-%03d" % i for i in range(N)]
    confirmed, errors = asyncio.run(_rstream_publish(rabbitmq_node, stream, bodies))
    assert errors == []
    assert len(confirmed) == N and len(set(confirmed)) == N
    received, offsets = asyncio.run(_rstream_consume(rabbitmq_node, stream, N))
    assert received == bodies
    assert offsets == list(range(N))
    queues = rabbitmq_node.ctl("list_queues", "name", "type", "--no-table-headers",
                               "--quiet").stdout
    assert f"{stream}\tstream" in queues


def test_sync_client_handshake_and_stream_lifecycle(rabbitmq_node):
    stream = _stream_name("sync")
    with _client(rabbitmq_node) as client:
        assert client.frame_max > 0 and client.heartbeat >= 0
        host, port = client.local_address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert client.create(stream, {"max-length-bytes": "10000000"}) is True
        assert client.create(stream, {"max-length-bytes": "10000000"}, exist_ok=True) is False
        with pytest.raises(StreamServerError) as info:
            client.create(stream, {"max-length-bytes": "10000000"})
        assert info.value.status == "STREAM_ALREADY_EXISTS" and info.value.command == "Create"
        with pytest.raises(StreamServerError) as info:  # same name, other arguments
            client.create(stream, exist_ok=True)
        assert info.value.status == "PRECONDITION_FAILED"
        meta = client.metadata([stream, "no-such-stream"])
        assert meta.streams[stream].code == C.OK
        # the advertised host/port configured in the node's rabbitmq.conf
        assert meta.streams[stream].leader == (rabbitmq_node.host, rabbitmq_node.stream_port)
        assert meta.streams["no-such-stream"].code == C.STREAM_DOES_NOT_EXIST
        assert client.query_offset("nobody", stream) is None
        assert client.delete(stream) is True
        assert client.delete(stream, missing_ok=True) is False
        with pytest.raises(StreamServerError):
            client.declare_publisher(1, stream)


def test_sync_client_publish_confirm_and_consume(rabbitmq_node):
    stream = _stream_name("sync")
    bodies = [b"sync-%03d" % i for i in range(N)]
    with _client(rabbitmq_node) as client:
        client.create(stream)
        assert client.declare_publisher(3, stream) == 0
        ids = []
        for i in range(0, N, 25):
            ids += client.publish_batch(3, [amqp_data(b) for b in bodies[i:i + 25]])
        assert ids == list(range(1, N + 1))
        confirms = client.wait_confirms(3, ids, timeout=15)
        assert confirms.complete and sorted(confirms.confirmed) == ids

        client.subscribe(7, stream, "first", credit=1)
        records, first_offsets = [], []
        while len(records) < N:
            d = client.poll_deliver(timeout=10)
            assert d is not None, f"only {len(records)} of {N} records delivered"
            assert d.subscription_id == 7 and d.num_records == len(d.records)
            first_offsets.append(d.chunk_first_offset)
            records += d.records
            client.credit(7, 1)
        assert [amqp_body(r) for r in records] == bodies
        assert first_offsets == sorted(first_offsets) and first_offsets[0] == 0
        assert client.poll_deliver(timeout=0.3) is None
        client.store_offset("frametap-ref", stream, N - 1)
        assert client.query_offset("frametap-ref", stream) == N - 1  # ordered after Store
        client.unsubscribe(7)
        client.credit(7, 1)  # unknown subscription: the server answers with an error
        client.metadata(stream)  # a round trip, so the Credit response has arrived
        assert client.take_credit_errors() == [(7, C.SUBSCRIPTION_ID_DOES_NOT_EXIST)]

        # subscribe at an offset: the chunk containing it is delivered whole
        client.subscribe(8, stream, "offset", offset=150, credit=5)
        d = client.poll_deliver(timeout=10)
        assert d.chunk_first_offset <= 150 < d.chunk_first_offset + d.num_records
        client.unsubscribe(8)
        client.delete_publisher(3)


def test_sync_client_publisher_reference_dedup(rabbitmq_node):
    stream = _stream_name("dedup")
    with _client(rabbitmq_node) as client:
        client.create(stream)
        assert client.declare_publisher(0, stream, reference="frametap-p") == 0
        ids = client.publish_batch(0, [b"a", b"b", b"c"])
        assert client.wait_confirms(0, ids, timeout=10).complete
        client.delete_publisher(0)
        assert client.declare_publisher(0, stream, reference="frametap-p") == 3
        assert client.publish_batch(0, [b"d"]) == [4]
        assert client.wait_confirms(0, [4], timeout=10).confirmed == [4]


def test_publish_error_for_unknown_publisher(rabbitmq_node):
    with _client(rabbitmq_node) as client:
        client._sequences[9] = 0  # publish without DeclarePublisher
        ids = client.publish_batch(9, [b"x", b"y"])
        confirms = client.wait_confirms(9, ids, timeout=10)
        assert confirms.confirmed == [] and confirms.missing == []
        assert confirms.errored == {1: C.PUBLISHER_DOES_NOT_EXIST, 2: C.PUBLISHER_DOES_NOT_EXIST}


def test_rstream_reads_what_the_sync_client_published(rabbitmq_node):
    stream = _stream_name("interop")
    bodies = [b"to-rstream-%03d" % i for i in range(N)]
    with _client(rabbitmq_node) as client:
        client.create(stream)
        client.declare_publisher(0, stream)
        ids = client.publish_batch(0, [amqp_data(b) for b in bodies])
        assert client.wait_confirms(0, ids, timeout=15).complete
    received, _ = asyncio.run(_rstream_consume(rabbitmq_node, stream, N,
                                               decoder=rstream.amqp_decoder))
    assert [bytes(m.body) if not isinstance(m.body, list) else b"".join(m.body)
            for m in received] == bodies


def test_sync_client_reads_what_rstream_published(rabbitmq_node):
    stream = _stream_name("interop")
    bodies = [b"from-rstream-%03d" % i for i in range(N)]
    msgs = [rstream.AMQPMessage(body=b) for b in bodies[:100]] + bodies[100:]
    confirmed, errors = asyncio.run(_rstream_publish(rabbitmq_node, stream, msgs))
    assert len(confirmed) == N and errors == []
    with _client(rabbitmq_node) as client:
        client.subscribe(0, stream, C.OFFSET_FIRST, credit=100)
        records = []
        while len(records) < N:
            d = client.poll_deliver(timeout=10)
            assert d is not None
            records += d.records
    assert [amqp_body(r) for r in records] == bodies
    assert records[100:] == bodies[100:]  # raw bytes pass through untouched


def test_bad_credentials_and_vhost(rabbitmq_node):
    with pytest.raises(StreamServerError) as info:
        _client(rabbitmq_node, password="wrong")
    assert info.value.command == "SaslAuthenticate"
    assert info.value.status == "AUTHENTICATION_FAILURE"
    with pytest.raises((StreamServerError, StreamConnectionClosed)) as info:
        _client(rabbitmq_node, vhost="/no-such-vhost")
    assert info.value.command == "Open"


# ---------------------------------------------------------------- scripted server
# What the real node can't be made to do on demand: send a Heartbeat, then its own Close.

def _scripted_server(script_done):
    import socket
    import struct
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    seen = []

    def read_frame(conn):
        head = b""
        while len(head) < 4:
            head += conn.recv(4 - len(head))
        size = struct.unpack(">I", head)[0]
        body = b""
        while len(body) < size:
            body += conn.recv(size - len(body))
        return struct.unpack_from(">H", body)[0], body[4:]

    def send(conn, key, body):
        conn.sendall(struct.pack(">IHH", len(body) + 4, key, 1) + body)

    def serve():
        conn, _ = listener.accept()
        with conn:
            for _ in range(3):  # PeerProperties, SaslHandshake, SaslAuthenticate
                key, body = read_frame(conn)
                seen.append(key)
                extra = {C.PEER_PROPERTIES: b"\0\0\0\0",
                         C.SASL_HANDSHAKE: b"\0\0\0\1\0\5PLAIN"}.get(key, b"")
                send(conn, key | 0x8000, body[:4] + b"\0\1" + extra)
            send(conn, C.TUNE, struct.pack(">II", 1048576, 7))
            seen.append(read_frame(conn))                 # the client's Tune
            key, body = read_frame(conn)                  # Open
            seen.append(key)
            send(conn, C.OPEN | 0x8000, body[:4] + b"\0\1\0\0\0\0")
            script_done.wait(10)                          # client is open
            send(conn, C.HEARTBEAT, b"")
            seen.append(read_frame(conn))                 # heartbeat answered
            send(conn, C.CLOSE, struct.pack(">IH", 77, C.INTERNAL_ERROR) + b"\0\x0bmaintenance")
            seen.append(read_frame(conn))                 # CloseResponse

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread, seen


def test_heartbeat_answered_and_server_close_handled():
    import threading
    opened = threading.Event()
    listener, thread, seen = _scripted_server(opened)
    with listener:
        client = StreamClient("127.0.0.1", listener.getsockname()[1], timeout=5)
        assert (client.frame_max, client.heartbeat) == (1048576, 7)
        opened.set()
        with pytest.raises(StreamConnectionClosed) as info:
            client.poll_deliver(timeout=5)
        thread.join(5)
    assert info.value.code == C.INTERNAL_ERROR and info.value.reason == "maintenance"
    assert client.closed
    assert seen[:3] == [C.PEER_PROPERTIES, C.SASL_HANDSHAKE, C.SASL_AUTHENTICATE]
    assert seen[3] == (C.TUNE, b"\x00\x10\x00\x00\x00\x00\x00\x07")  # echoed
    assert seen[4] == C.OPEN
    assert seen[5] == (C.HEARTBEAT, b"")
    assert seen[6] == (C.CLOSE | 0x8000, b"\x00\x00\x00\x4d\x00\x01")  # corr 77, OK
    with pytest.raises(ConnectionError):
        client.metadata("s")
