"""frametap in front of the REAL RabbitMQ server (private node, stream plugin) and in
front of the reference broker: rstream and the Locust users, with exact accounting."""

import asyncio
import uuid

import pytest

from loadgen.rabbitmq_stream.server import StreamBrokerThread
from tests.rabbitmq_node import rabbitmq_node  # noqa: F401  (session fixture)
from tests.stream_check import StreamProxy, assert_exact_accounting, publish_and_consume
from tests.test_locust_rabbitmq_stream import _run_locust, _stats

pytest.importorskip("rstream")
pytestmark = pytest.mark.slow
N = 500


def test_rstream_through_proxy_to_real_rabbitmq(rabbitmq_node):
    proxy = StreamProxy(rabbitmq_node.stream_address)
    try:
        stream = "frametap-e2e-" + uuid.uuid4().hex[:8]
        confirmed, got, bodies = asyncio.run(
            publish_and_consume("127.0.0.1", proxy.port, stream, N))
        proxy.wait_idle()
        assert sorted(confirmed) == list(range(1, N + 1))
        assert got == bodies
        assert_exact_accounting(proxy, N)
        # the real server's handshake was seen and correlated both ways
        for op in ("PeerProperties", "SaslHandshake", "SaslAuthenticate", "Open", "Tune"):
            assert proxy.value("frametap_responses_total", opcode=op, status="OK") >= 2, op
        assert proxy.value("frametap_requests_in_flight") == 0
    finally:
        proxy.close()


def _locust_through(proxy, extra):
    proc = _run_locust(None, extra, users=4, duration="4s",
                       host=f"rabbitmq-stream://127.0.0.1:{proxy.port}")
    stats = _stats(proc)
    proxy.wait_idle()
    return stats


def _check_locust_accounting(proxy, stats):
    assert stats["Publish"]["num_requests"] > 0
    assert sum(e["num_failures"] for e in stats.values()) == 0, stats
    published = proxy.value("frametap_messages_total", direction="c2s", opcode="Publish")
    confirmed = proxy.value("frametap_responses_total", opcode="Publish", status="OK")
    assert published > 0 and confirmed > 0
    # every confirm the proxy saw matched a publish it saw; Locust stopped its users
    # while a window of batches could still be unconfirmed (counted as timeouts)
    timeouts = proxy.value("frametap_request_timeouts_total", opcode="Publish")
    assert confirmed + timeouts == published
    assert proxy.value("frametap_messages_total", direction="s2c", opcode="Deliver") > 0
    assert proxy.value("frametap_unmatched_responses_total") == 0
    errors = proxy.lt.call(lambda: proxy.app.routes[0].stats.snapshot()["errors"])
    assert errors == {}, errors


def test_locust_users_through_proxy_to_real_rabbitmq(rabbitmq_node):
    proxy = StreamProxy(rabbitmq_node.stream_address)
    try:
        stats = _locust_through(proxy, {
            "FRAMETAP_STREAM_NAME": "frametap-locust-" + uuid.uuid4().hex[:8],
            "FRAMETAP_STREAM_OFFSET": "first"})
        _check_locust_accounting(proxy, stats)
    finally:
        proxy.close()


def test_locust_users_through_proxy_to_reference_broker():
    with StreamBrokerThread() as broker:
        proxy = StreamProxy(broker.address)
        try:
            stats = _locust_through(proxy, {"FRAMETAP_STREAM_OFFSET": "first"})
            _check_locust_accounting(proxy, stats)
        finally:
            proxy.close()
