"""Publish sub-entry batches (rstream ``send_sub_entry``, uncompressed and gzip) through
frametap to the REAL RabbitMQ server and to the reference broker: every batch is one
publishing id with one confirm, carries its records, and the proxy counts frames,
messages and confirms exactly; consuming the stream back counts the Deliver records."""

import asyncio
import uuid

import pytest

from loadgen.rabbitmq_stream.server import StreamBrokerThread
from tests.rabbitmq_node import rabbitmq_node  # noqa: F401  (session fixture)
from tests.stream_check import StreamProxy

pytest.importorskip("rstream")
pytestmark = pytest.mark.slow

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


def test_rstream_sub_entries_through_proxy_to_reference_broker():
    with StreamBrokerThread() as broker:
        proxy = StreamProxy(broker.address)
        try:
            _check(proxy, "reference broker")
        finally:
            proxy.close()
