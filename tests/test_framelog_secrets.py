"""Secrets never reach a frame log: every landed protocol, through the proxy, with the
credentials its clients send (FlyMQ AUTH, RabbitMQ Stream SASL PLAIN, RocketMQ ACL
AccessKey/Signature). Files are JSON Lines (greppable bytes) and Parquet (every string
value read back); the topics/streams the test used do appear as `resource`."""

import glob
import json
import os

import pyarrow.parquet as pq
import pytest

from loadgen.flymq.client import FlyMQClient
from loadgen.flymq.server import FlyMQServerThread
from loadgen.rabbitmq_stream.client import StreamClient
from loadgen.rabbitmq_stream.server import StreamBrokerThread
from loadgen.rocketmq.client import RocketMQClient
from loadgen.rocketmq.server import RocketMQServerThread
from proxy.app import ProxyApp
from proxy.config import config_from_dict
from tests.conftest import LoopThread

pytestmark = pytest.mark.slow

FLY_PASSWORD = "fly-Pa55word-7f3a"
STREAM_PASSWORD = "stream-Pa55word-91c2"
ACCESS_KEY = "AK-rocket-5e1d"
SIGNATURE = "SIG-rocket-b07c"
SECRETS = [FLY_PASSWORD, STREAM_PASSWORD, ACCESS_KEY, SIGNATURE]


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_no_secret_in_any_frame_log(tmp_path, fmt):
    fly = FlyMQServerThread(users={"alice": FLY_PASSWORD}).start()
    stream = StreamBrokerThread(users={"bob": STREAM_PASSWORD}).start()
    rocket = RocketMQServerThread().start()
    lt = LoopThread()
    app = ProxyApp(config_from_dict({
        "framelog": {"dir": str(tmp_path), "format": fmt},
        "routes": [
            {"name": "fly", "protocol": "flymq", "listen": "127.0.0.1:0",
             "upstream": fly.address},
            {"name": "stream", "protocol": "rabbitmq-stream", "listen": "127.0.0.1:0",
             "upstream": "127.0.0.1:%d" % stream.port},
            {"name": "broker", "protocol": "rocketmq", "listen": "127.0.0.1:0",
             "upstream": rocket.broker_address}]}))
    lt.run(app.start())
    try:
        ports = [r.address[1] for r in app.routes]
        c = FlyMQClient("127.0.0.1", ports[0])
        assert c.auth("alice", FLY_PASSWORD).success
        c.create_topic("fly-topic", 1)
        c.produce("fly-topic", b"v", partition=0)
        c.close()

        s = StreamClient("127.0.0.1", ports[1], user="bob", password=STREAM_PASSWORD)
        s.create("stream-one")
        s.declare_publisher(1, "stream-one")
        s.publish_batch(1, [b"a", b"b"])
        s.close()

        r = RocketMQClient("127.0.0.1", ports[2])
        r.request(310, {"a": "grp", "b": "rocket-topic", "c": "TBW102", "d": "4", "e": "0",
                        "f": "0", "g": "0", "h": "0", "i": "", "j": "0", "k": "false",
                        "AccessKey": ACCESS_KEY, "Signature": SIGNATURE}, body=b"x")
        r.request(11, {"consumerGroup": "g", "topic": "rocket-topic", "queueId": "0",
                       "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "0",
                       "commitOffset": "0", "suspendTimeoutMillis": "0",
                       "subscription": "*", "subVersion": "0",
                       "AccessKey": ACCESS_KEY, "Signature": SIGNATURE})
        r.close()
    finally:
        lt.run(app.shutdown(5))
        lt.stop()
        for srv in (fly, stream, rocket):
            srv.stop()

    files = [f for f in glob.glob(os.path.join(tmp_path, "*")) if not os.path.basename(
        f).startswith(".")]
    assert files and app.framelog.records and not app.framelog.dropped()
    rows = []
    for path in files:
        raw = open(path, "rb").read()
        for secret in SECRETS:
            assert secret.encode() not in raw, (secret, path)
        if os.path.basename(path).startswith("run-"):    # the run file (proxy/runinfo.py)
            continue
        if fmt == "jsonl":
            rows.extend(json.loads(line) for line in raw.decode().splitlines())
        else:
            rows.extend(pq.read_table(path).to_pylist())
    assert {r["route"] for r in rows} == {"fly", "stream", "broker"}
    values = {v for row in rows for v in strings(row)}
    for secret in SECRETS:
        assert not [v for v in values if secret in v], secret
    # the topics and streams the clients named are the rows' resources
    resources = {(r["route"], r["opcode_name"]): r["resource"] for r in rows
                 if r["resource"] is not None}
    assert resources[("fly", "PRODUCE")] == "fly-topic"
    assert resources[("stream", "Publish")] == "stream-one"
    assert resources[("stream", "DeclarePublisher")] == "stream-one"
    assert resources[("broker", "SEND_MESSAGE_V2")] == "rocket-topic"
    assert resources[("broker", "PULL_MESSAGE")] == "rocket-topic"
    # the handshakes were logged (so the absence above means something)
    names = {r["opcode_name"] for r in rows}
    assert {"AUTH", "SaslHandshake", "SaslAuthenticate", "SEND_MESSAGE_V2",
            "PULL_MESSAGE"} <= names, names
