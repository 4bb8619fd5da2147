"""Real headless Locust runs of the packaged locustfile against a private RabbitMQ node."""

import subprocess
import uuid

import pytest

from loadgen.rabbitmq_stream.client import StreamClient, amqp_body
from tests._support.locust import LOCUST, locust_env, run_locust
from tests._support.processes import ROOT
from tests.rabbitmq_node import rabbitmq_node  # noqa: F401  (pytest fixture)

# Locust is only ever imported in subprocesses: importing it here would gevent-patch the
# pytest process (and every test after this one).

pytestmark = pytest.mark.slow


def _run_locust(node, extra_env=None, users=4, duration="4s", host=None):
    host = host or f"rabbitmq-stream://{node.host}:{node.stream_port}"
    return run_locust("rabbitmq-stream", host, ["StreamPublisher", "StreamConsumer"],
                      users=users, duration=duration, env=extra_env)


def _stats(run):
    """{name: entry} from Locust's --json summary (final, unlike the lagging CSV)."""
    stats = run.stats
    assert {e["method"] for e in stats.values()} <= {"rabbitmq-stream"}
    return stats


def test_headless_run_publishes_and_consumes_without_failures(rabbitmq_node):
    node = rabbitmq_node
    stream = f"locust-{uuid.uuid4().hex[:8]}"
    ref = f"locust-consumer-{uuid.uuid4().hex[:6]}-"
    proc = _run_locust(node, {"FRAMETAP_STREAM_NAME": stream,
                              "FRAMETAP_STREAM_CONSUMER_REFERENCE": ref,
                              "FRAMETAP_STREAM_MESSAGE_SIZE": "200",
                              "FRAMETAP_STREAM_BATCH": "5",
                              "FRAMETAP_STREAM_OFFSET": "first",
                              "FRAMETAP_STREAM_METADATA_EVERY": "10"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = _stats(proc)
    failures = {name: e["num_failures"] for name, e in stats.items() if e["num_failures"]}
    assert failures == {}, proc.stderr[-3000:]
    publish = stats["Publish"]
    assert publish["num_requests"] > 0
    # response_length of a Publish = message bytes: 5 AMQP-wrapped 200-byte bodies
    assert publish["total_content_length"] == publish["num_requests"] * 5 * (200 + 3 + 2)
    assert stats["Deliver"]["num_requests"] > 0
    assert stats["Deliver"]["total_content_length"] > 0
    for name in ("Create", "DeclarePublisher", "Subscribe", "Metadata", "StoreOffset"):
        assert stats[name]["num_requests"] > 0, name
    assert stats["Subscribe"]["num_requests"] == 2

    # What the users did is in the stream: every confirmed batch; the consumers'
    # stored offsets say that they read it.
    with StreamClient(node.host, node.stream_port) as client:
        stored = [client.query_offset(f"{ref}{i}", stream) for i in range(2)]
        assert all(o is not None and o > 0 for o in stored), stored
        client.subscribe(0, stream, "first", credit=20)
        records = []
        end_offset = 0
        while True:
            d = client.poll_deliver(timeout=1.0)
            if d is None:
                break
            records += d.records
            end_offset = d.chunk_first_offset + d.num_records
            client.credit(0, 1)  # credit counts chunks: one more per chunk received
    assert len(records) >= publish["num_requests"] * 5
    # (offsets also count the tracking entries StoreOffset writes into the stream)
    assert max(stored) < end_offset
    bodies = [amqp_body(r) for r in records]
    assert {len(b) for b in bodies} == {200}
    assert all(b.startswith(b'{"seq":') and b.endswith(b'"}') for b in bodies)


def test_bad_credentials_are_reported_as_failures(rabbitmq_node):
    proc = _run_locust(rabbitmq_node, {"FRAMETAP_STREAM_PASSWORD": "wrong",
                                       "FRAMETAP_STREAM_NAME": "never-created"},
                       users=2, duration="2s")
    assert proc.returncode != 0  # Locust exits 1 when there were failures
    stats = _stats(proc)
    auth = stats["SaslAuthenticate"]
    assert auth["num_failures"] == auth["num_requests"] > 0
    assert "Publish" not in stats or stats["Publish"]["num_requests"] == 0


def test_unreachable_host_is_reported_under_peer_properties(tmp_path):
    import socket
    with socket.socket() as s:  # a port nobody listens on: bound (held) but not listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        proc = _run_locust(None, users=2, duration="2s", host=f"127.0.0.1:{port}")
    assert proc.returncode != 0
    stats = _stats(proc)
    assert stats["PeerProperties"]["num_failures"] > 0
    assert sum(e["num_requests"] - e["num_failures"] for e in stats.values()) == 0


def test_locustfile_offers_the_stream_users():
    proc = subprocess.run(LOCUST + ["--list"], cwd=ROOT, env=locust_env("rabbitmq-stream"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "StreamPublisher" in proc.stdout and "StreamConsumer" in proc.stdout
    assert "StreamUser" not in proc.stdout
