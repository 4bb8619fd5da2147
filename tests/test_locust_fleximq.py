"""A real headless Locust run of the packaged locustfile against the reference fleximq
broker, over TCP and over a Unix socket: requesters, responders and pub/sub users."""

import pytest

from loadgen.fleximq.server import FlexiMQBrokerThread
from tests._support.locust import csv_stats, run_locust

# Locust is only ever imported in subprocesses (it gevent-patches the importing process).

pytestmark = pytest.mark.slow          # Locust runs: seconds each (make test-fast skips them)


def _run_locust(host, csv_prefix, users=6, duration="4s", extra_env=None):
    return run_locust("fleximq", host, users=users, duration=duration, env=extra_env,
                      json_out=False, csv=csv_prefix)


def _stats(csv_prefix):
    return csv_stats(csv_prefix)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_headless_run_requests_pings_and_publishes(tmp_path, transport):
    sock = tmp_path / "b" / "broker.sock"
    with FlexiMQBrokerThread(listen=["127.0.0.1:0", "unix:%s" % sock],
                             tokens=["tok"]) as b:
        host = b.addresses[0] if transport == "tcp" else "ipc://%s" % sock
        proc = _run_locust(host, tmp_path / "run", extra_env={
            "FRAMETAP_FLEXIMQ_TOKEN": "tok", "FRAMETAP_FLEXIMQ_PAYLOAD_SIZE": "300"})
        joined = b.server.next_id - 1000
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = _stats(tmp_path / "run")
    for name in ("JOIN", "REQ", "PING", "PUB"):
        assert int(stats[("fleximq", name)]["Request Count"]) > 0, name
    assert int(stats[("", "Aggregated")]["Failure Count"]) == 0
    assert joined == 6                          # every user joined once, with the token
    # a REP carries {"ok": true, "n": 300} from a responder or {"ok": true} from oneself
    assert float(stats[("fleximq", "REQ")]["Average Content Size"]) > 0


def test_wrong_token_is_a_reported_failure(tmp_path):
    with FlexiMQBrokerThread(tokens=["tok"]) as b:
        proc = _run_locust(b.address, tmp_path / "run", users=2, duration="4s",
                           extra_env={"FRAMETAP_FLEXIMQ_TOKEN": "nope"})
    assert proc.returncode == 1, proc.stderr[-2000:]   # Locust: 1 when requests failed
    stats = _stats(tmp_path / "run")
    join = stats[("fleximq", "JOIN")]
    assert int(join["Failure Count"]) > 0 and int(join["Failure Count"]) == \
        int(join["Request Count"])
