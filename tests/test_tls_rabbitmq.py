"""A REAL RabbitMQ node with its stream TLS listener (``stream.listeners.ssl.1``,
certificates made by the test) behind a ``both`` route: rstream (``ssl_context``) and
rbfly (``rabbitmq-stream+tls://``) publish, get every confirm and consume exactly, and
every connection they open crosses the proxy.

The node advertises a TLS port nothing listens on (``stream.advertised_tls_port``): a
client that followed Metadata's advertised address past the proxy would fail to connect,
so a passing run shows that the Metadata rewriting covered the TLS endpoint. The
clients' own connection counts are compared with the proxy's accepted connections.
"""

import asyncio
import os
import ssl
import uuid

import pytest

from proxy.app import ProxyApp
from proxy.config import config_from_dict
from tests._support.ports import free_port
from tests.conftest import LoopThread
from tests.rabbitmq_node import (NOT_INSTALLED, RabbitMQNode, RabbitMQNodeError,
                                 rabbitmq_available)
from tests.support import sample
from tests.tls_certs import certs  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
N = 300


@pytest.fixture(scope="module")
def tls_node(certs):
    if not rabbitmq_available():
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(NOT_INSTALLED, pytrace=False)
        pytest.skip(NOT_INSTALLED)
    node = RabbitMQNode(tls={"ca": certs.ca, "cert": certs.cert, "key": certs.key})
    node.advertised_tls_port = free_port()       # nothing listens there
    try:
        node.start()
    except RabbitMQNodeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield node
    node.stop()


class TLSStreamProxy:
    def __init__(self, node, certs, options=None):
        self.lt = LoopThread()
        route = {"name": "stream", "protocol": "rabbitmq-stream", "listen": "127.0.0.1:0",
                 "upstream": f"127.0.0.1:{node.tls_port}",
                 "tls": {"mode": "both", "listen": {"cert": certs.cert, "key": certs.key},
                         "upstream": {"ca": certs.ca}}}
        if options:
            route["options"] = options
        self.app = ProxyApp(config_from_dict({"routes": [route]}))
        self.lt.run(self.app.start())
        self.port = self.app.routes[0].address[1]

    def value(self, name, **labels):
        labels.setdefault("route", "stream")
        return self.lt.call(lambda: sample(self.app, name, **labels)) or 0

    def wait_idle(self, timeout=10):
        import time
        deadline = time.time() + timeout
        while self.lt.call(lambda: len(self.app.routes[0].connections)) and \
                time.time() < deadline:
            time.sleep(0.05)

    def close(self):
        self.lt.run(self.app.shutdown(0))
        self.lt.stop()


def _ctx(certs):
    return ssl.create_default_context(cafile=certs.ca)


async def rstream_roundtrip(port, ctx, stream, n):
    from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType,
                         Producer, amqp_decoder)
    confirmed, done = [], asyncio.Event()

    def on_confirm(status):
        if status.is_confirmed:
            confirmed.append(status.message_id)
        if len(confirmed) >= n:
            done.set()

    bodies = [b"tls-%06d" % i for i in range(n)]
    async with Producer("127.0.0.1", port, username="guest", password="guest",
                        ssl_context=ctx) as producer:
        await producer.create_stream(stream, exists_ok=True)
        for i in range(0, n, 50):
            await producer.send_batch(stream, [AMQPMessage(body=b) for b in bodies[i:i + 50]],
                                      on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 30)
    got, enough = [], asyncio.Event()

    async def on_message(msg, ctx_):
        got.append(msg.body if isinstance(msg.body, bytes) else b"".join(msg.body))
        if len(got) >= n:
            enough.set()

    async with Consumer("127.0.0.1", port, username="guest", password="guest",
                        ssl_context=ctx) as consumer:
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST))
        await asyncio.wait_for(enough.wait(), 30)
        await asyncio.sleep(0.3)
    return sorted(confirmed), got, bodies


def test_rstream_through_both_route_to_real_rabbitmq_tls(tls_node, certs, monkeypatch):
    pytest.importorskip("rstream")
    from rstream import connection
    opened = []
    original = connection.Connection.open

    async def counting_open(self):
        opened.append((self.host, self.port))
        return await original(self)

    monkeypatch.setattr(connection.Connection, "open", counting_open)
    proxy = TLSStreamProxy(tls_node, certs)
    try:
        stream = "frametap-tls-" + uuid.uuid4().hex[:8]
        confirmed, got, bodies = asyncio.run(
            rstream_roundtrip(proxy.port, _ctx(certs), stream, N))
        proxy.wait_idle()
        assert confirmed == list(range(1, N + 1))
        assert got == bodies
        # every connection rstream opened went to the proxy, and the proxy accepted each
        assert opened and set(opened) == {("127.0.0.1", proxy.port)}, opened
        assert len(opened) >= 3          # locator, producer leader, consumer (Metadata)
        assert proxy.value("frametap_connections_total") == len(opened)
        hs = {side: proxy.value("frametap_tls_handshakes_total", side=side, outcome="ok")
              for side in ("listen", "upstream")}
        assert hs == {"listen": len(opened), "upstream": len(opened)}
        p = {"protocol": "rabbitmq-stream"}
        assert proxy.value("frametap_messages_total", direction="c2s", opcode="Publish",
                           **p) == N
        assert proxy.value("frametap_responses_total", opcode="Publish", status="OK", **p) == N
        assert proxy.value("frametap_messages_total", direction="s2c", opcode="Deliver",
                           **p) == N
        assert proxy.value("frametap_responses_total", opcode="Metadata", status="OK", **p) >= 1
        assert proxy.value("frametap_unmatched_responses_total", **p) == 0
        errors = proxy.lt.call(lambda: proxy.app.routes[0].stats.snapshot()["errors"])
        assert errors == {}, errors
        print(f"\nrstream over TLS through frametap: {len(opened)} connections opened by the "
              f"client, {len(opened)} accepted by the proxy; {N} published, confirmed, "
              f"consumed")
    finally:
        proxy.close()


def test_rbfly_through_both_route_to_real_rabbitmq_tls(tls_node, certs, monkeypatch):
    pytest.importorskip("rbfly")
    import rbfly.streams as rbs
    from rbfly.streams import client as rbclient
    made = []
    original = rbclient.StreamsClient._create_protocol

    async def counting(self):
        made.append((self._cinfo.host, self._cinfo.port))
        return await original(self)

    monkeypatch.setattr(rbclient.StreamsClient, "_create_protocol", counting)
    proxy = TLSStreamProxy(tls_node, certs)
    n = 50

    async def run():
        client = rbs.streams_client(
            f"rabbitmq-stream+tls://guest:guest@127.0.0.1:{proxy.port}/", ssl=_ctx(certs))
        stream = "frametap-rbfly-" + uuid.uuid4().hex[:8]
        try:
            await client.create_stream(stream)
            async with client.publisher(stream) as publisher:
                for i in range(n):
                    await publisher.send(b"rbfly-%04d" % i)      # waits for its confirm
            got = []
            async for msg in client.subscribe(stream, offset=rbs.Offset.FIRST, timeout=10):
                got.append(msg)
                if len(got) == n:
                    break
            return got
        finally:
            await client.disconnect()

    try:
        got = asyncio.run(run())
        proxy.wait_idle()
        assert got == [b"rbfly-%04d" % i for i in range(n)]
        assert made and set(made) == {("127.0.0.1", proxy.port)}
        assert proxy.value("frametap_connections_total") == len(made)
        assert proxy.value("frametap_tls_handshakes_total", side="upstream",
                           outcome="ok") == len(made)
        p = {"protocol": "rabbitmq-stream"}
        assert proxy.value("frametap_messages_total", direction="c2s", opcode="Publish",
                           **p) == n
        assert proxy.value("frametap_responses_total", opcode="Publish", status="OK", **p) == n
        assert proxy.value("frametap_messages_total", direction="s2c", opcode="Deliver",
                           **p) >= n
        assert proxy.value("frametap_unmatched_responses_total", **p) == 0
    finally:
        proxy.close()


def test_without_rewriting_rstream_follows_the_advertised_tls_port(tls_node, certs,
                                                                   monkeypatch):
    """The control: with Metadata left alone the producer's leader connection goes to the
    TLS port the node advertises (nothing listens there), past the proxy, and fails: the
    passing runs above owe their connection counts to the rewriting."""
    pytest.importorskip("rstream")
    from rstream import connection
    opened = []
    original = connection.Connection.open

    async def counting_open(self):
        opened.append((self.host, self.port))
        return await original(self)

    monkeypatch.setattr(connection.Connection, "open", counting_open)
    proxy = TLSStreamProxy(tls_node, certs, options={"rewrite_metadata": False})
    try:
        stream = "frametap-norewrite-" + uuid.uuid4().hex[:8]
        with pytest.raises((OSError, ConnectionError, asyncio.TimeoutError)):
            asyncio.run(asyncio.wait_for(
                rstream_roundtrip(proxy.port, _ctx(certs), stream, 10), 60))
        assert ("127.0.0.1", tls_node.advertised_tls_port) in opened, opened
    finally:
        proxy.close()
