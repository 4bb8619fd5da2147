"""rstream publish-then-consume check, shared by the reference-broker and real-RabbitMQ tests."""

import asyncio

from proxy.config import config_from_dict
from tests.conftest import LoopThread
from tests.support import sample


async def publish_and_consume(host, port, stream, n, batch=50):
    """Publish ``n`` messages with confirms, then consume them back from the first offset.

    Returns (confirmed publishing ids, consumed bodies).
    """
    from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType,
                         Producer, amqp_decoder)
    confirmed, done = [], asyncio.Event()

    def on_confirm(status):
        if status.is_confirmed:
            confirmed.append(status.message_id)
        if len(confirmed) >= n:
            done.set()

    bodies = [b"frametap-%06d" % i for i in range(n)]
    async with Producer(host, port, username="guest", password="guest") as producer:
        await producer.create_stream(stream, exists_ok=True)
        for i in range(0, n, batch):
            await producer.send_batch(stream, [AMQPMessage(body=b) for b in bodies[i:i + batch]],
                                      on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 30)
    got, enough = [], asyncio.Event()

    async def on_message(msg, ctx):
        body = msg.body if isinstance(msg.body, bytes) else b"".join(msg.body)
        got.append(body)
        if len(got) >= n:
            enough.set()

    async with Consumer(host, port, username="guest", password="guest") as consumer:
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST))
        await asyncio.wait_for(enough.wait(), 30)
        await asyncio.sleep(0.3)                 # anything extra would show up here
    return confirmed, got, bodies


class StreamProxy:
    """A frametap proxy with one rabbitmq-stream route, on its own uvloop thread."""

    def __init__(self, upstream, options=None):
        from proxy.app import ProxyApp
        self.lt = LoopThread()
        route = {"name": "stream", "protocol": "rabbitmq-stream", "listen": "127.0.0.1:0",
                 "upstream": upstream}
        if options is not None:
            route["options"] = options
        self.app = ProxyApp(config_from_dict({"routes": [route]}))
        self.lt.run(self.app.start())
        self.port = self.app.routes[0].address[1]

    def value(self, name, **labels):
        labels.setdefault("route", "stream")
        if name.startswith("frametap_") and "protocol" not in labels and name not in (
                "frametap_bytes_total", "frametap_connections_total",
                "frametap_connections_active"):
            labels["protocol"] = "rabbitmq-stream"
        return self.lt.call(lambda: sample(self.app, name, **labels)) or 0

    def wait_idle(self, timeout=10):
        import time
        deadline = time.time() + timeout
        while self.lt.call(lambda: len(self.app.routes[0].connections)) and time.time() < deadline:
            time.sleep(0.05)

    def close(self):
        self.lt.run(self.app.shutdown(0))
        self.lt.stop()


def assert_exact_accounting(proxy, n):
    """The proxy's counters account for every message: the DESIGN's end-to-end check."""
    assert proxy.value("frametap_messages_total", direction="c2s", opcode="Publish") == n
    assert proxy.value("frametap_responses_total", opcode="Publish", status="OK") == n
    assert proxy.value("frametap_request_duration_seconds_count", opcode="Publish",
                       outcome="ok") == n
    assert proxy.value("frametap_messages_total", direction="s2c", opcode="Deliver") == n
    assert proxy.value("frametap_unmatched_responses_total") == 0
    assert proxy.value("frametap_responses_total", opcode="Metadata", status="OK") >= 1
    errors = proxy.lt.call(lambda: proxy.app.routes[0].stats.snapshot()["errors"])
    assert errors == {}, errors
