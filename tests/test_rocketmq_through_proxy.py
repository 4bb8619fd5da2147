"""Apache's real RocketMQ client (C++ librocketmq via PyPI `rocketmq`) through frametap to
the reference name server and broker, with route-data rewriting: every route lookup and
every send is accounted for, broker traffic included."""

import os
import uuid

import pytest

from loadgen.rocketmq.server import RocketMQServerThread
from proxy.app import ProxyApp
from proxy.config import config_from_dict
from tests.conftest import LoopThread
from tests.rocketmq_real_client import real_client_skip_reason, run_producer, run_pull_consumer
from tests.support import sample

pytestmark = pytest.mark.slow
N = 20


@pytest.fixture(scope="module")
def real_client():
    reason = real_client_skip_reason()
    if reason:
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(f"the real RocketMQ client must run in CI: {reason}")
        pytest.skip(reason)


class RocketMQProxy:
    """Two routes: name server (with route-data rewriting) and broker.

    The broker route starts first, on port 0, in its own ProxyApp: the name server
    route's rewriting names the port it got (no port picked in advance)."""

    def __init__(self, server, rewrite=True):
        self.lt = LoopThread()
        self.apps = {}
        try:
            self._start("broker", {"name": "broker", "protocol": "rocketmq",
                                   "listen": "127.0.0.1:0",
                                   "upstream": server.broker_address})
            broker_port = self.apps["broker"].routes[0].address[1]
            ns_route = {"name": "namesrv", "protocol": "rocketmq", "listen": "127.0.0.1:0",
                        "upstream": server.namesrv_address}
            if rewrite:
                ns_route["options"] = {"advertise": {
                    server.broker_address: f"127.0.0.1:{broker_port}"}}
            self._start("namesrv", ns_route)
        except BaseException:
            self.close()
            raise
        self.namesrv = "127.0.0.1:%d" % self.apps["namesrv"].routes[0].address[1]

    def _start(self, name, route):
        app = ProxyApp(config_from_dict({"routes": [route]}))
        self.apps[name] = app
        self.lt.run(app.start())

    def value(self, route, name, **labels):
        labels = {"route": route, "protocol": "rocketmq", **labels}
        return self.lt.call(lambda: sample(self.apps[route], name, **labels)) or 0

    def errors(self):
        return self.lt.call(lambda: {name: app.routes[0].stats.snapshot()["errors"]
                                     for name, app in self.apps.items()})

    def close(self):
        for app in self.apps.values():
            self.lt.run(app.shutdown(0))
        self.lt.stop()


@pytest.fixture
def server():
    with RocketMQServerThread(queues=4) as s:
        yield s


def test_real_producer_through_proxy(real_client, server):
    proxy = RocketMQProxy(server)
    try:
        topic = "FrametapReal" + uuid.uuid4().hex[:6]
        result = run_producer(proxy.namesrv, topic, n=N, timeout=90)
        assert result["sent"] == N, result
        assert [status for status, _, _ in result["results"]] == ["OK"] * N
        assert len({msg_id for _, msg_id, _ in result["results"]}) == N
        assert result["errors"] == []
        # the name server route saw the route lookups ...
        lookups = proxy.value("namesrv", "frametap_responses_total",
                              opcode="GET_ROUTEINFO_BY_TOPIC", status="SUCCESS")
        assert lookups >= 1
        assert proxy.value("namesrv", "frametap_request_duration_seconds_count",
                           opcode="GET_ROUTEINFO_BY_TOPIC", outcome="ok") == lookups
        # ... and, thanks to rewriting, the broker route saw every send
        assert proxy.value("broker", "frametap_messages_total", direction="c2s",
                           opcode="SEND_MESSAGE") == N
        assert proxy.value("broker", "frametap_responses_total", opcode="SEND_MESSAGE",
                           status="SUCCESS") == N
        assert proxy.value("broker", "frametap_request_duration_seconds_count",
                           opcode="SEND_MESSAGE", outcome="ok") == N
        for route in ("namesrv", "broker"):
            assert proxy.value(route, "frametap_unmatched_responses_total") == 0
        assert proxy.errors() == {"namesrv": {}, "broker": {}}
        # the broker stored them: a real pull consumer reads them back through the proxy
        pulled = run_pull_consumer(proxy.namesrv, topic, limit=N, timeout=90)
        assert pulled["received"] == N, pulled
        assert proxy.value("broker", "frametap_messages_total", direction="s2c",
                           opcode="PULL_MESSAGE") == N
    finally:
        proxy.close()


def test_without_rewriting_the_broker_traffic_bypasses_the_proxy(real_client, server):
    proxy = RocketMQProxy(server, rewrite=False)
    try:
        topic = "FrametapBypass" + uuid.uuid4().hex[:6]
        result = run_producer(proxy.namesrv, topic, n=5, timeout=90)
        assert result["sent"] == 5, result
        assert proxy.value("namesrv", "frametap_responses_total",
                           opcode="GET_ROUTEINFO_BY_TOPIC", status="SUCCESS") >= 1
        assert proxy.value("broker", "frametap_messages_total", direction="c2s",
                           opcode="SEND_MESSAGE") == 0
    finally:
        proxy.close()


@pytest.mark.parametrize("serialize", ["json", "rocketmq"])
def test_locust_users_through_proxy(server, serialize):
    """Locust producers and pull consumers, both header serializations, through both routes."""
    from tests.test_locust_rocketmq import _run_locust, _stats
    proxy = RocketMQProxy(server)
    try:
        stats = _stats(_run_locust(f"rocketmq://{proxy.namesrv}",
                                   {"FRAMETAP_ROCKETMQ_SERIALIZE": serialize}))
        assert sum(e["num_failures"] for e in stats.values()) == 0, stats
        sends = stats["SEND_MESSAGE_V2"]["num_requests"]
        pulls = stats["PULL_MESSAGE"]["num_requests"]
        assert sends > 0 and pulls > 0
        sent = proxy.value("broker", "frametap_messages_total", direction="c2s",
                           opcode="SEND_MESSAGE_V2")
        ok = proxy.value("broker", "frametap_responses_total", opcode="SEND_MESSAGE_V2",
                         status="SUCCESS")
        # Locust may stop a user between the proxy seeing a send and Locust recording it
        assert sends <= sent <= sends + 8 and ok >= sends
        assert proxy.value("broker", "frametap_messages_total", direction="s2c",
                           opcode="PULL_MESSAGE") > 0
        assert proxy.value("namesrv", "frametap_responses_total",
                           opcode="GET_ROUTEINFO_BY_TOPIC", status="SUCCESS") > 0
        assert proxy.errors() == {"namesrv": {}, "broker": {}}
    finally:
        proxy.close()
