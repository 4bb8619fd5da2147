"""The fault engine in front of the REAL RabbitMQ (private node, stream plugin), driven by
rstream: a delay rule on Publish and a latency toxic on the server's stream slow the
confirms down by what they say, and every message is still confirmed and delivered."""

import asyncio
import time
import uuid

import pytest

from proxy.app import ProxyApp
from proxy.config import config_from_dict
from tests.conftest import LoopThread
from tests._support.faults import FaultSet, Rule, Toxic
from tests.rabbitmq_node import rabbitmq_node  # noqa: F401  (session fixture)
from tests.stream_check import publish_and_consume
from tests.support import sample

pytest.importorskip("rstream")
pytestmark = pytest.mark.slow
N = 200


def test_rstream_publish_delayed_and_downstream_latency(rabbitmq_node):
    lt = LoopThread()
    config = config_from_dict({"routes": [{
        "name": "stream", "protocol": "rabbitmq-stream", "listen": "127.0.0.1:0",
        "upstream": rabbitmq_node.stream_address}]})
    fs = FaultSet(protocol="rabbitmq-stream")
    config.routes[0].faults = fs
    config.seed = 1
    app = ProxyApp(config)
    lt.run(app.start())
    port = app.routes[0].address[1]

    def value(name, **labels):
        labels.update(route="stream", protocol="rabbitmq-stream")
        return lt.call(lambda: sample(app, name, **labels)) or 0
    try:
        stream = "frametap-faults-" + uuid.uuid4().hex[:8]
        t0 = time.monotonic()
        asyncio.run(publish_and_consume("127.0.0.1", port, stream, N))
        base = time.monotonic() - t0
        lt.call(lambda: fs.set(rules=[Rule("slow-publish", "delay", opcodes=["Publish"],
                                           delay_ms=50)],
                               toxics=[Toxic("lat", "latency", stream="downstream",
                                             latency=20)]))
        stream = "frametap-faults-" + uuid.uuid4().hex[:8]
        t0 = time.monotonic()
        confirmed, got, bodies = asyncio.run(publish_and_consume("127.0.0.1", port,
                                                                 stream, N))
        slow = time.monotonic() - t0
        assert sorted(confirmed) == list(range(1, N + 1))
        assert got == bodies
        publishes = value("frametap_frames_total", direction="c2s", opcode="Publish")
        delayed = value("frametap_faults_injected_total", opcode="Publish",
                        fault="slow-publish", action="delay")
        print(f"\nrstream {N} messages: {base:.2f} s clean, {slow:.2f} s with a 50 ms "
              f"Publish delay and a 20 ms downstream latency ({delayed} Publish delayed)")
        assert delayed >= N // 50 and delayed <= publishes
        assert slow >= base + 0.05
        assert value("frametap_faults_injected_total", opcode="", fault="lat",
                     action="latency") >= 2
        assert value("frametap_unmatched_responses_total") == 0

        # error: the proxy answers Create itself with STREAM_NOT_AVAILABLE; rstream
        # raises the ServerError subclass for that code
        from rstream import Producer
        from rstream.exceptions import ServerError, StreamNotAvailable
        lt.call(lambda: fs.set(rules=[Rule("no-stream", "error", opcodes=["Create"],
                                           status="STREAM_NOT_AVAILABLE", trigger="once")],
                               toxics=[]))

        async def create():
            async with Producer("127.0.0.1", port, username="guest",
                                password="guest") as producer:
                with pytest.raises(ServerError) as info:
                    await producer.create_stream("frametap-faults-" + uuid.uuid4().hex[:8])
                return info.value
        err = asyncio.run(create())
        print(f"rstream: {type(err).__name__}: {err}")
        assert isinstance(err, StreamNotAvailable)
        assert value("frametap_responses_total", opcode="Create",
                     status="STREAM_NOT_AVAILABLE") == 1
    finally:
        lt.run(app.shutdown(0))
        lt.stop()
