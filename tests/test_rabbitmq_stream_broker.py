"""Reference RabbitMQ Stream broker driven by the real ``rstream`` client and raw sockets."""

import asyncio
import socket
import struct

import pytest

rstream = pytest.importorskip("rstream")

from rstream import (  # noqa: E402
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    RawMessage,
    amqp_decoder,
    exceptions,
)

from loadgen.rabbitmq_stream.server import StreamBrokerThread, main  # noqa: E402
from proxy.protocols.rabbitmq_stream import constants as C  # noqa: E402
from proxy.protocols.rabbitmq_stream.codec import (  # noqa: E402
    CommandVersion,
    decode_body,
    decode_frame,
    encode_command,
    encode_frame,
)

N = 500


@pytest.fixture
def broker():
    with StreamBrokerThread(users={"guest": "guest", "alice": "wonderland"},
                            vhosts=("/", "staging")) as b:
        yield b


def run(coro, timeout=60):
    async def guarded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(guarded())


def _body(msg) -> bytes:
    body = msg.body
    return body if isinstance(body, bytes) else b"".join(body)


async def _consume(port, stream, spec, expect, **kw):
    """Subscribe and collect ``(offset, body)`` until ``expect`` arrived (then 0.3 s more)."""
    got = []
    enough = asyncio.Event()

    async def on_message(msg, ctx):
        got.append((ctx.offset, _body(msg)))
        if len(got) >= expect:
            enough.set()

    async with Consumer("127.0.0.1", port, username="guest", password="guest", **kw) as c:
        await c.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=spec)
        await asyncio.wait_for(enough.wait(), 15)
        await asyncio.sleep(0.3)  # anything extra would show up here
    return got


async def _publish_all(port, stream, bodies, publisher_name=None, ids=None, batches=1):
    """Publish ``bodies`` in ``batches`` send_batch calls (one Publish frame each) and wait
    for every confirmation."""
    confirmed = []
    done = asyncio.Event()

    def on_confirm(status):
        confirmed.append(status)
        if len(confirmed) >= len(bodies):
            done.set()

    if ids is None:
        messages = [AMQPMessage(body=b) for b in bodies]
    else:
        messages = [RawMessage(bytes(AMQPMessage(body=b)), publishing_id=i)
                    for b, i in zip(bodies, ids)]
    size = -(-len(messages) // batches)
    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.create_stream(stream, exists_ok=True)
        for start in range(0, len(messages), size):
            await p.send_batch(stream, messages[start:start + size],
                               publisher_name=publisher_name, on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 15)
    return confirmed


# --------------------------------------------------------------------------- rstream

@pytest.mark.slow
def test_publish_with_confirms_then_consume_first_and_offset(broker):
    bodies = [b"message-%d" % i for i in range(N)]

    async def scenario():
        confirmed = await _publish_all(broker.port, "orders", bodies)
        first = await _consume(broker.port, "orders",
                               ConsumerOffsetSpecification(OffsetType.FIRST), N)
        middle = await _consume(broker.port, "orders",
                                ConsumerOffsetSpecification(OffsetType.OFFSET, 250), N - 250)
        return confirmed, first, middle

    confirmed, first, middle = run(scenario())
    assert sorted(s.message_id for s in confirmed) == list(range(1, N + 1))
    assert all(s.is_confirmed for s in confirmed)
    assert first == list(enumerate(bodies))
    assert middle == [(i, bodies[i]) for i in range(250, N)]


@pytest.mark.slow
def test_many_small_batches_respect_credit_and_next_last(broker):
    async def scenario():
        # 30 chunks: more than rstream's initial credit of 10
        await _publish_all(broker.port, "ticks",
                           [b"t%d-%d" % (k, j) for k in range(30) for j in range(3)],
                           batches=30)
        everything = await _consume(broker.port, "ticks",
                                    ConsumerOffsetSpecification(OffsetType.FIRST), 90)
        last = await _consume(broker.port, "ticks",
                              ConsumerOffsetSpecification(OffsetType.LAST), 3)
        return everything, last

    everything, last = run(scenario())
    assert [o for o, _ in everything] == list(range(90))
    assert everything[-1] == (89, b"t29-2")
    assert last == [(87, b"t29-0"), (88, b"t29-1"), (89, b"t29-2")]  # the last chunk


@pytest.mark.slow
def test_named_producer_is_deduplicated(broker):
    async def scenario():
        await _publish_all(broker.port, "dedup", [b"a%d" % i for i in range(1, 11)],
                           publisher_name="app-1", ids=range(1, 11))
        # A restarted producer re-sends 6..15: 6..10 are confirmed but not stored again.
        confirmed = await _publish_all(broker.port, "dedup", [b"b%d" % i for i in range(6, 16)],
                                       publisher_name="app-1", ids=range(6, 16))
        async with Producer("127.0.0.1", broker.port, username="guest",
                            password="guest") as p:
            client = await p.default_client
            seq = await client.query_publisher_sequence("dedup", "app-1")
            unknown = await client.query_publisher_sequence("dedup", "nobody")
        got = await _consume(broker.port, "dedup",
                             ConsumerOffsetSpecification(OffsetType.FIRST), 15)
        return confirmed, seq, unknown, got

    confirmed, seq, unknown, got = run(scenario())
    assert sorted(s.message_id for s in confirmed) == list(range(6, 16))
    assert (seq, unknown) == (15, 0)
    assert [b for _, b in got] == [b"a%d" % i for i in range(1, 11)] + [
        b"b%d" % i for i in range(11, 16)]


def test_wrong_password_fails(broker):
    async def scenario():
        p = Producer("127.0.0.1", broker.port, username="guest", password="nope")
        await p.start()
    with pytest.raises(exceptions.AuthenticationFailure):
        run(scenario())


def test_unknown_vhost_fails_and_known_one_works(broker):
    async def connect(vhost):
        async with Producer("127.0.0.1", broker.port, vhost=vhost, username="alice",
                            password="wonderland") as p:
            await p.create_stream("in-" + vhost.strip("/"), exists_ok=True)

    run(connect("staging"))
    with pytest.raises(exceptions.VirtualHostAccessFailure):
        run(connect("production"))


def test_create_existing_stream_and_delete_missing_fail(broker):
    async def scenario():
        async with Producer("127.0.0.1", broker.port, username="guest",
                            password="guest") as p:
            await p.create_stream("dup")
            with pytest.raises(exceptions.StreamAlreadyExists):
                await p.create_stream("dup")
            assert await p.stream_exists("dup")
            await p.delete_stream("dup")
            assert not await p.stream_exists("dup")
            with pytest.raises(exceptions.StreamDoesNotExist):
                await p.delete_stream("dup")
    run(scenario())


def test_store_and_query_offset(broker):
    async def scenario():
        async with Consumer("127.0.0.1", broker.port, username="guest",
                            password="guest") as c:
            await c.create_stream("tracked")
            with pytest.raises(exceptions.OffsetNotFound):
                await c.query_offset("tracked", "reader-1")
            await c.store_offset("tracked", "reader-1", 42)
            first = await c.query_offset("tracked", "reader-1")
            await c.store_offset("tracked", "reader-1", 4242)
            second = await c.query_offset("tracked", "reader-1")
            with pytest.raises(exceptions.StreamDoesNotExist):
                await c.query_offset("no-such-stream", "reader-1")
            return first, second
    assert run(scenario()) == (42, 4242)


# --------------------------------------------------------------------------- raw socket

class RawClient:
    """Blocking client speaking frames through the codec, for exact wire assertions."""

    def __init__(self, port, open_connection=True, vhost="/"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = bytearray()
        self.corr = 0
        if open_connection:
            assert self.request(C.PEER_PROPERTIES, properties={}).code == C.OK
            assert self.request(C.SASL_HANDSHAKE).mechanisms == ["PLAIN"]
            assert self.request(C.SASL_AUTHENTICATE, mechanism="PLAIN",
                                data=b"\0guest\0guest").code == C.OK
            tune = self.read()
            assert (tune.key, tune.frame_max, tune.heartbeat) == (C.TUNE, 1048576, 60)
            self.send(C.TUNE, frame_max=tune.frame_max, heartbeat=0)
            self.open = self.request(C.OPEN, virtual_host=vhost)

    def send(self, key, **fields):
        self.sock.sendall(encode_command(key, **fields))

    def read(self):
        while (split := decode_frame(self.buf)) is None:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("broker closed the connection")
            self.buf += data
        key, version, body, size = split
        del self.buf[:size]
        return decode_body(key, version, body)

    def request(self, key, **fields):
        self.corr += 1
        self.send(key, correlation_id=self.corr, **fields)
        reply = self.read()
        assert reply.key == key and reply.response and reply.correlation_id == self.corr
        return reply

    def closed_by_peer(self):
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.sock.close()


def test_metadata_advertises_configured_address():
    with StreamBrokerThread(advertised_host="proxy.example", advertised_port=15552) as b:
        c = RawClient(b.port)
        assert c.open.properties == {"advertised_host": "proxy.example",
                                     "advertised_port": "15552"}
        assert c.request(C.CREATE, stream="s", arguments={}).code == C.OK
        meta = c.request(C.METADATA, streams=["s", "missing"])
        assert meta.brokers == [(0, "proxy.example", 15552)]
        assert [tuple(s) for s in meta.streams] == [("s", C.OK, 0, []),
                                                    ("missing", C.STREAM_DOES_NOT_EXIST,
                                                     0xFFFF, [])]
        assert c.request(C.METADATA, streams=["missing"]).brokers == []
        c.close()


def test_publisher_and_subscription_errors(broker):
    c = RawClient(broker.port)
    assert c.request(C.CREATE, stream="s", arguments={}).code == C.OK
    assert c.request(C.DECLARE_PUBLISHER, publisher_id=1, reference="",
                     stream="nope").code == C.STREAM_DOES_NOT_EXIST
    assert c.request(C.DECLARE_PUBLISHER, publisher_id=1, reference="r",
                     stream="s").code == C.OK
    assert c.request(C.DECLARE_PUBLISHER, publisher_id=1, reference="",
                     stream="s").code == C.PRECONDITION_FAILED
    # Publish with an undeclared publisher id -> PublishError per message.
    c.send(C.PUBLISH, publisher_id=9, messages=[(1, b"x"), (2, b"y")])
    err = c.read()
    assert (err.key, err.publisher_id) == (C.PUBLISH_ERROR, 9)
    assert [tuple(e) for e in err.errors] == [(1, C.PUBLISHER_DOES_NOT_EXIST),
                                              (2, C.PUBLISHER_DOES_NOT_EXIST)]
    c.send(C.PUBLISH, publisher_id=1, messages=[(1, b"x"), (2, b"y")])
    confirm = c.read()
    assert (confirm.key, confirm.publisher_id, confirm.publishing_ids) == (
        C.PUBLISH_CONFIRM, 1, [1, 2])
    # Credit for an unknown subscription: the only Credit that gets an answer.
    c.send(C.CREDIT, subscription_id=5, credit=1)
    reply = c.read()
    assert (reply.key, reply.response, reply.code, reply.subscription_id) == (
        C.CREDIT, True, C.SUBSCRIPTION_ID_DOES_NOT_EXIST, 5)
    assert c.request(C.UNSUBSCRIBE, subscription_id=5).code == C.SUBSCRIPTION_ID_DOES_NOT_EXIST
    assert c.request(C.DELETE_PUBLISHER, publisher_id=1).code == C.OK
    assert c.request(C.DELETE_PUBLISHER, publisher_id=1).code == C.PUBLISHER_DOES_NOT_EXIST
    stats = c.request(C.STREAM_STATS, stream="s")
    assert (stats.code, stats.stats) == (C.OK, {"first_chunk_id": 0, "committed_chunk_id": 0})
    assert c.request(C.STREAM_STATS, stream="nope").code == C.STREAM_DOES_NOT_EXIST
    c.close()


def test_subscribe_credit_and_deliver_v2_chunks(broker):
    c = RawClient(broker.port)
    versions = c.request(C.EXCHANGE_COMMAND_VERSIONS,
                         commands=[CommandVersion(C.DELIVER, 1, 2)])
    assert versions.code == C.OK
    assert [v.key for v in versions.commands] == sorted(C.COMMANDS)
    assert versions.commands[C.PUBLISH - 1] == (C.PUBLISH, 1, 2)  # rstream indexes key-1
    assert c.request(C.CREATE, stream="s", arguments={}).code == C.OK
    assert c.request(C.DECLARE_PUBLISHER, publisher_id=0, reference="",
                     stream="s").code == C.OK
    for batch in range(3):
        c.send(C.PUBLISH, publisher_id=0, messages=[(batch * 10 + i, b"m%d.%d" % (batch, i))
                                                    for i in range(2)])
        assert c.read().key == C.PUBLISH_CONFIRM
    assert c.request(C.SUBSCRIBE, subscription_id=3, stream="s", offset_type=C.OFFSET_FIRST,
                     offset=None, credit=2, properties={}).code == C.OK
    d1, d2 = c.read(), c.read()  # the answer comes first, then the chunks
    assert c.request(C.SUBSCRIBE, subscription_id=3, stream="s", offset_type=C.OFFSET_FIRST,
                     offset=None, credit=2,
                     properties={}).code == C.SUBSCRIPTION_ID_ALREADY_EXISTS
    assert (d1.key, d1.version, d1.subscription_id) == (C.DELIVER, 2, 3)
    assert d1.committed_chunk_id == 4
    assert [(d.chunk.first_offset, d.chunk.records()) for d in (d1, d2)] == [
        (0, [b"m0.0", b"m0.1"]), (2, [b"m1.0", b"m1.1"])]
    # Credit exhausted: the third chunk waits for Credit.
    assert c.request(C.QUERY_OFFSET, reference="x", stream="s").code == C.NO_OFFSET
    c.send(C.CREDIT, subscription_id=3, credit=1)
    d3 = c.read()
    assert (d3.chunk.first_offset, d3.chunk.num_records) == (4, 2)
    # Timestamp / next / offset beyond the end.
    assert c.request(C.SUBSCRIBE, subscription_id=4, stream="s",
                     offset_type=C.OFFSET_TIMESTAMP, offset=0, credit=1,
                     properties={}).code == C.OK
    assert c.read().chunk.first_offset == 0
    assert c.request(C.SUBSCRIBE, subscription_id=5, stream="s", offset_type=C.OFFSET_NEXT,
                     offset=None, credit=5, properties={}).code == C.OK
    c.send(C.PUBLISH, publisher_id=0, messages=[(99, b"late")])
    frames = [c.read(), c.read()]   # confirm + Deliver to subscription 5 (in some order)
    delivered = [f for f in frames if f.key == C.DELIVER]
    assert [(d.subscription_id, d.chunk.records()) for d in delivered] == [(5, [b"late"])]
    assert c.request(C.UNSUBSCRIBE, subscription_id=4).code == C.OK
    c.close()


def test_unknown_key_closes_with_unknown_frame(broker):
    c = RawClient(broker.port)
    c.sock.sendall(encode_frame(0x0063, 1, b"\x00\x00\x00\x01"))
    close = c.read()
    assert (close.key, close.response, close.code) == (C.CLOSE, False, C.UNKNOWN_FRAME)
    c.sock.sendall(encode_command(C.CLOSE, response=True, correlation_id=close.correlation_id,
                                  code=C.OK))
    assert c.closed_by_peer()
    c.close()


def test_frame_over_frame_max_closes_with_frame_too_large():
    with StreamBrokerThread(frame_max=4096) as b:
        c = RawClient(b.port, open_connection=False)
        c.sock.sendall(struct.pack(">I", 5000))  # only the size: refused before the body
        close = c.read()
        assert (close.key, close.code) == (C.CLOSE, C.FRAME_TOO_LARGE)
        assert "exceeds the limit 4096" in close.reason
        c.close()


def test_commands_before_open_are_refused(broker):
    c = RawClient(broker.port, open_connection=False)
    c.send(C.CREATE, correlation_id=1, stream="s", arguments={})
    close = c.read()
    assert (close.key, close.code) == (C.CLOSE, C.ACCESS_REFUSED)
    c.close()


def test_client_close_is_answered(broker):
    c = RawClient(broker.port)
    reply = c.request(C.CLOSE, code=C.OK, reason="done")
    assert reply.code == C.OK
    c.close()


def test_cli_help_and_bad_arguments(capsys):
    assert main(["--help"]) == 0
    assert "--advertise" in capsys.readouterr().out
    assert main(["--listen", "nowhere"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
