"""The proxy in front of the reference FlyMQ server, driven by the sync client: the
proxy's per-opcode view matches what the client did, request by request."""

import pytest

from loadgen.flymq.client import FlyMQClient, FlyMQServerError
from loadgen.flymq.server import FlyMQServerThread
from proxy.config import config_from_dict
from tests.conftest import LoopThread

R = {"route": "fly", "protocol": "flymq"}


@pytest.fixture
def stack():
    srv = FlyMQServerThread(users={"alice": "secret"}).start()
    lt = LoopThread()
    from proxy.app import ProxyApp
    app = ProxyApp(config_from_dict({"routes": [{
        "name": "fly", "protocol": "flymq", "listen": "127.0.0.1:0",
        "upstream": srv.address}]}))
    lt.run(app.start())
    yield app, lt, app.routes[0].address[1]
    lt.run(app.shutdown(0))
    lt.stop()
    srv.stop()


def value(app, lt, name, **labels):
    from tests.support import sample
    return lt.call(lambda: sample(app, name, **labels))


def test_every_opcode_through_the_proxy(stack):
    app, lt, port = stack
    c = FlyMQClient("127.0.0.1", port)
    assert c.auth("alice", "secret").success
    c.create_topic("orders", 2)
    metas = [c.produce("orders", b"v%d" % i, key=b"k%d" % i, partition=0) for i in range(5)]
    assert [m.offset for m in metas] == [0, 1, 2, 3, 4]
    assert c.consume("orders", 0, 3).value == b"v3"
    fetched = c.fetch("orders", 0, 1, max_messages=3)
    assert [m.value for m in fetched.messages] == [b"v1", b"v2", b"v3"]
    assert c.metadata("orders").partitions == 2
    assert c.subscribe("orders", "g1", 0, "earliest") == 0
    assert c.commit("orders", "g1", 0, 4)
    assert "orders" in c.list_topics()
    op, _, text = c.request(0x5A, b"")                  # unknown opcode -> ERROR
    assert op == 0xFF and text == b"unknown opcode: 90"   # the real server's plain text
    with pytest.raises(FlyMQServerError):
        c.consume("orders", 0, 999)                       # missing offset -> ERROR
    c.delete_topic("orders")
    c.close()
    lt.run(_settle(app))

    def frames(d, op):
        return value(app, lt, "frametap_frames_total", direction=d, opcode=op, **R)
    for op, n in [("AUTH", 1), ("CREATE_TOPIC", 1), ("PRODUCE", 5), ("CONSUME", 2),
                  ("FETCH", 1), ("METADATA", 1), ("SUBSCRIBE", 1), ("COMMIT", 1),
                  ("LIST_TOPICS", 1), ("DELETE_TOPIC", 1), ("unknown_90", 1)]:
        assert frames("c2s", op) == n, op
    assert frames("s2c", "ERROR") == 2
    assert frames("s2c", "AUTH_RESPONSE") == 1           # AUTH's answer, as the real server's
    assert value(app, lt, "frametap_responses_total", opcode="AUTH", status="OK", **R) == 1
    assert value(app, lt, "frametap_protocol_errors_total", direction="s2c",
                 reason="response_mismatch", **R) is None
    assert value(app, lt, "frametap_messages_total", direction="c2s", opcode="PRODUCE",
                 **R) == 5
    assert value(app, lt, "frametap_messages_total", direction="s2c", opcode="FETCH", **R) == 3
    assert value(app, lt, "frametap_messages_total", direction="s2c", opcode="CONSUME",
                 **R) == 1                                # the ERROR answer carries none
    assert value(app, lt, "frametap_responses_total", opcode="CONSUME", status="ERROR",
                 **R) == 1
    assert value(app, lt, "frametap_responses_total", opcode="unknown_90", status="ERROR",
                 **R) == 1
    assert value(app, lt, "frametap_request_duration_seconds_count", opcode="PRODUCE",
                 outcome="ok", **R) == 5
    assert value(app, lt, "frametap_request_duration_seconds_count", opcode="CONSUME",
                 outcome="error", **R) == 1
    assert value(app, lt, "frametap_unmatched_responses_total", **R) == 0
    assert value(app, lt, "frametap_requests_in_flight", **R) == 0
    assert value(app, lt, "frametap_protocol_errors_total", direction="c2s",
                 reason="bad_magic", **R) is None


async def _settle(app):
    import asyncio
    for _ in range(200):
        if not app.routes[0].connections:
            return
        await asyncio.sleep(0.01)
