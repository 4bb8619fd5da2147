"""Publish sub-entry batches (rstream ``send_sub_entry``, uncompressed and gzip) through
frametap to the REAL RabbitMQ server and to the reference broker: every batch is one
publishing id with one confirm, carries its records, and the proxy counts frames,
messages and confirms exactly; consuming the stream back counts the Deliver records.
Then the reference broker on raw sockets: batches mixed with simple messages, named
publisher deduplication, and a v2 batch (which the real server does not take)."""

import asyncio
import uuid

import pytest

from loadgen.rabbitmq_stream.server import StreamBrokerThread
from proxy.protocols.rabbitmq_stream import constants as C
from proxy.protocols.rabbitmq_stream.codec import PublishedMessage
from proxy.protocols.rabbitmq_stream.conformance import sub_batch
from tests.rabbitmq_node import rabbitmq_node  # noqa: F401  (session fixture)
from tests.stream_check import StreamProxy

pytest.importorskip("rstream")

#: records per batch: 1 (a batch of one), a few, and rstream's u16 Count near its top
SIZES = [1, 2, 3, 5, 8, 13, 21, 34, 55, 100, 1000, 60000]


async def publish_sub_entries(host, port, stream):
    """Send one batch per SIZES entry (odd ones gzip), wait for every confirm, then
    consume the stream from its start. Returns (confirm statuses, records read, sent)."""
    from rstream import (CompressionType, Consumer, ConsumerOffsetSpecification,
                         OffsetType, Producer)
    statuses, done = [], asyncio.Event()

    def on_confirm(status):
        statuses.append(status)
        if len(statuses) >= len(SIZES):
            done.set()

    sent = []
    async with Producer(host, port, username="guest", password="guest") as producer:
        await producer.create_stream(stream, exists_ok=True)
        for b, n in enumerate(SIZES):
            records = [b"b%02d-r%05d" % (b, r) for r in range(n)]
            sent.extend(records)
            await producer.send_sub_entry(
                stream, records,
                compression_type=CompressionType.Gzip if b % 2 else CompressionType.No,
                on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.sleep(0.2)                 # a duplicate confirm would show up here
    got, enough = [], asyncio.Event()

    async def on_message(msg, ctx):
        got.append(bytes(msg))
        if len(got) >= len(sent):
            enough.set()

    async with Consumer(host, port, username="guest", password="guest") as consumer:
        await consumer.subscribe(stream, on_message, offset_specification=(
            ConsumerOffsetSpecification(OffsetType.FIRST)))
        await asyncio.wait_for(enough.wait(), 30)
        await asyncio.sleep(0.3)                 # anything extra would show up here
    return statuses, got, sent


def _check(proxy, upstream):
    stream = "frametap-subentry-" + uuid.uuid4().hex[:8]
    statuses, got, sent = asyncio.run(publish_sub_entries("127.0.0.1", proxy.port, stream))
    proxy.wait_idle()
    assert len(statuses) == len(SIZES), upstream
    assert all(s.is_confirmed for s in statuses)
    assert len({s.message_id for s in statuses}) == len(SIZES)
    assert got == sent
    v = proxy.value
    # rstream sends each batch in a Publish frame of its own: one id, Count messages
    assert v("frametap_frames_total", direction="c2s", opcode="Publish") == len(SIZES)
    assert v("frametap_messages_total", direction="c2s", opcode="Publish") == sum(SIZES)
    assert v("frametap_responses_total", opcode="Publish", status="OK") == len(SIZES)
    assert v("frametap_request_duration_seconds_count", opcode="Publish",
             outcome="ok") == len(SIZES)
    assert v("frametap_request_timeouts_total", opcode="Publish") == 0
    assert v("frametap_messages_total", direction="s2c", opcode="Deliver") == sum(SIZES)
    assert v("frametap_unmatched_responses_total") == 0
    assert v("frametap_requests_in_flight") == 0
    errors = proxy.lt.call(lambda: proxy.app.routes[0].stats.snapshot()["errors"])
    assert errors == {}, errors


def test_rstream_sub_entries_through_proxy_to_real_rabbitmq(rabbitmq_node):
    proxy = StreamProxy(rabbitmq_node.stream_address)
    try:
        _check(proxy, "rabbitmq")
    finally:
        proxy.close()


@pytest.mark.slow
def test_rstream_sub_entries_through_proxy_to_reference_broker():
    with StreamBrokerThread() as broker:
        proxy = StreamProxy(broker.address)
        try:
            _check(proxy, "reference broker")
        finally:
            proxy.close()


# ---- the reference broker, raw sockets -----------------------------------------------

@pytest.fixture
def raw():
    from tests.test_rabbitmq_stream_broker import RawClient
    with StreamBrokerThread() as broker:
        c = RawClient(broker.port)
        assert c.request(C.CREATE, stream="s", arguments={}).code == C.OK
        yield c
        c.close()


def test_broker_confirms_batches_and_stores_their_records(raw):
    assert raw.request(C.DECLARE_PUBLISHER, publisher_id=0, reference="",
                       stream="s").code == C.OK
    raw.send(C.PUBLISH, publisher_id=0, messages=[
        PublishedMessage(1, b"a"), PublishedMessage(2, sub_batch(3, size=2)),
        PublishedMessage(3, sub_batch(2, size=1, gzipped=True)), PublishedMessage(4, b"b")])
    confirm = raw.read()
    assert (confirm.key, confirm.publishing_ids) == (C.PUBLISH_CONFIRM, [1, 2, 3, 4])
    raw.send(C.PUBLISH, publisher_id=0, messages=[PublishedMessage(5, b"c")])
    assert raw.read().publishing_ids == [5]
    assert raw.request(C.SUBSCRIBE, subscription_id=1, stream="s",
                       offset_type=C.OFFSET_FIRST, offset=None, credit=2,
                       properties={}).code == C.OK
    d1, d2 = raw.read(), raw.read()
    assert (d1.chunk.num_entries, d1.chunk.num_records) == (4, 7)
    assert d1.chunk.records() == [b"a", b"ss", b"ss", b"ss", b"s", b"s", b"b"]
    assert (d2.chunk.first_offset, d2.chunk.records()) == (7, [b"c"])


def test_broker_deduplicates_batches_of_a_named_publisher(raw):
    assert raw.request(C.DECLARE_PUBLISHER, publisher_id=0, reference="app",
                       stream="s").code == C.OK
    for _ in range(2):                         # the second time: confirmed, not stored
        raw.send(C.PUBLISH, publisher_id=0, messages=[PublishedMessage(5, sub_batch(4))])
        assert raw.read().publishing_ids == [5]
    assert raw.request(C.QUERY_PUBLISHER_SEQUENCE, reference="app",
                       stream="s").sequence == 5
    assert raw.request(C.STREAM_STATS, stream="s").stats["committed_chunk_id"] == 0
    assert raw.request(C.SUBSCRIBE, subscription_id=1, stream="s",
                       offset_type=C.OFFSET_FIRST, offset=None, credit=5,
                       properties={}).code == C.OK
    assert raw.read().chunk.num_records == 4
    raw.send(C.PUBLISH, publisher_id=0, messages=[PublishedMessage(6, b"next")])
    frames = [raw.read(), raw.read()]          # confirm + Deliver, in some order
    assert [f.chunk.first_offset for f in frames if f.key == C.DELIVER] == [4]


def test_broker_closes_on_a_v2_batch(raw):
    """The real server reads a v2 entry as filter value + simple message only; its reader
    dies on a batch and the connection drops. The broker closes with UNKNOWN_FRAME."""
    from proxy.protocols.rabbitmq_stream.codec import encode_command
    assert raw.request(C.DECLARE_PUBLISHER, publisher_id=0, reference="",
                       stream="s").code == C.OK
    raw.send(C.PUBLISH, version=2, publisher_id=0,
             messages=[PublishedMessage(1, b"simple", "f")])
    assert raw.read().publishing_ids == [1]    # a v2 simple message is fine
    raw.send(C.PUBLISH, version=2, publisher_id=0,
             messages=[PublishedMessage(2, sub_batch(2), "f")])
    close = raw.read()
    assert (close.key, close.response, close.code) == (C.CLOSE, False, C.UNKNOWN_FRAME)
    assert "sub-entry batch in Publish v2" in close.reason
    raw.sock.sendall(encode_command(C.CLOSE, response=True,
                                    correlation_id=close.correlation_id, code=C.OK))
    assert raw.closed_by_peer()
