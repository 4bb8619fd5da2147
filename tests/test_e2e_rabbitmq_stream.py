"""rstream through frametap to the reference broker: exact accounting, no bypass."""

import asyncio

import pytest

from loadgen.rabbitmq_stream.server import StreamBrokerThread
from tests.stream_check import StreamProxy, assert_exact_accounting, publish_and_consume

pytest.importorskip("rstream")
N = 300


@pytest.fixture
def broker():
    with StreamBrokerThread() as b:
        yield b


def test_rstream_through_proxy_to_reference_broker(broker):
    proxy = StreamProxy(broker.address)
    try:
        confirmed, got, bodies = asyncio.run(
            publish_and_consume("127.0.0.1", proxy.port, "orders", N))
        proxy.wait_idle()
        assert sorted(confirmed) == list(range(1, N + 1))
        assert got == bodies
        assert_exact_accounting(proxy, N)
        assert proxy.value("frametap_requests_in_flight") == 0
    finally:
        proxy.close()


@pytest.mark.slow
def test_without_rewriting_clients_bypass_the_proxy(broker):
    """The control experiment: rstream follows the broker's advertised address."""
    proxy = StreamProxy(broker.address, options={"rewrite_metadata": False})
    try:
        confirmed, got, bodies = asyncio.run(
            publish_and_consume("127.0.0.1", proxy.port, "orders", N))
        assert got == bodies
        assert proxy.value("frametap_messages_total", direction="c2s", opcode="Publish") == 0
    finally:
        proxy.close()
