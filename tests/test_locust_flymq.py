"""A real headless Locust run of the packaged locustfile against the reference server."""

import subprocess

import pytest

from loadgen.flymq.server import FlyMQServerThread
from tests._support.locust import FRAMETAP_LOAD, LOCUST, csv_stats, locust_env, run_locust
from tests._support.processes import ROOT

# Locust is only ever imported in subprocesses: importing it here would gevent-patch the
# pytest process (and every test after this one).

pytestmark = pytest.mark.slow          # Locust runs: seconds each (make test-fast skips them)


def _run_locust(port, csv_prefix, extra_env=None, users=4, duration="3s"):
    return run_locust("flymq", f"127.0.0.1:{port}", users=users, duration=duration,
                      env=extra_env, json_out=False, csv=csv_prefix)


def _stats(csv_prefix):
    return csv_stats(csv_prefix)


def test_headless_locust_run_produces_and_fetches_without_failures(tmp_path):
    with FlyMQServerThread() as srv:
        proc = _run_locust(srv.port, tmp_path / "run",
                           {"FRAMETAP_FLYMQ_MESSAGE_SIZE": "300", "FRAMETAP_FLYMQ_TOPICS": "a,b"})
        topics = sorted(srv.server.topics)
        stored = sum(p.high_watermark for t in srv.server.topics.values()
                     for p in t.partitions)
        value_sizes = {len(value) for t in srv.server.topics.values()
                       for p in t.partitions for _key, value, _ts in p.records}
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = _stats(tmp_path / "run")
    produce = stats[("flymq", "PRODUCE")]
    fetch = stats[("flymq", "FETCH")]
    assert int(produce["Request Count"]) > 0
    assert int(fetch["Request Count"]) > 0
    total = stats[("", "Aggregated")]
    assert int(total["Failure Count"]) == 0
    assert int(total["Request Count"]) >= int(produce["Request Count"]) + int(fetch["Request Count"])
    # the PRODUCEs reached the server, with the configured topics and size (Locust's
    # CSV can be a second behind the end of the run, so it is a lower bound)
    assert topics == ["a", "b"]
    assert stored >= int(produce["Request Count"])
    assert value_sizes == {300}
    # consumers really read records (an empty FETCH response is 8 + 4 + 8 = 20 bytes)
    assert float(fetch["Average Content Size"]) > 20
    assert float(produce["Average Content Size"]) == 8 + 2 + 1 + 4 + 8 + 8 + 4 + 4


def test_failures_are_reported_through_exception(tmp_path):
    # A server that demands AUTH: every request fails with ERROR, and Locust must count
    # those as failures (not successes) under the opcode name.
    with FlyMQServerThread(users={"u": "p"}, require_auth=True) as srv:
        proc = _run_locust(srv.port, tmp_path / "fail", users=2, duration="4s")
    assert proc.returncode != 0
    stats = _stats(tmp_path / "fail")
    assert int(stats[("", "Aggregated")]["Failure Count"]) > 0
    assert int(stats[("flymq", "PRODUCE")]["Failure Count"]) == int(
        stats[("flymq", "PRODUCE")]["Request Count"]) > 0
    with open(tmp_path / "fail_failures.csv", newline="") as f:
        assert "authentication required" in f.read()


def test_frametap_load_json_with_processes_prints_one_document():
    """``frametap load --json --processes 2``: the forked workers send their numbers to the
    parent and print nothing of their own, so stdout is exactly one JSON document (Locust
    prints ``--json`` in every process: each worker added its own ``[]``) and it holds
    the workers' requests."""
    with FlyMQServerThread() as srv:
        run = run_locust("flymq", f"127.0.0.1:{srv.port}", ["FlyMQProducer"], users=2,
                         duration="3s", processes=2, entry=FRAMETAP_LOAD)
        stored = sum(p.high_watermark for t in srv.server.topics.values()
                     for p in t.partitions)
    assert run.returncode == 0, run.stderr[-3000:]
    # run.entries parsed the whole of stdout as one document (json.loads, not a scan)
    assert run.stdout.lstrip().startswith("[") and run.stdout.count("\n]") == 1, run.stdout[:500]
    produce = run.stats["PRODUCE"]
    assert produce["num_requests"] > 0 and produce["num_failures"] == 0
    # both workers' PRODUCEs are in it: the server stored at least as many records
    assert stored >= produce["num_requests"]


def _list_users(protocols):
    return subprocess.run(LOCUST + ["--list"], cwd=ROOT, env=locust_env(protocols),
                          capture_output=True, text=True, timeout=60)


def test_locustfile_protocol_selection():
    default = _list_users("")
    assert default.returncode == 0, default.stderr
    assert "FlyMQProducer" in default.stdout and "FlyMQConsumer" in default.stdout
    assert "FlyMQUser" not in default.stdout  # abstract base is not offered
    assert "FlyMQProducer" in _list_users(" FlyMQ ").stdout
    bad = _list_users("flymq,kafka")
    assert bad.returncode != 0
    assert "unknown protocol 'kafka'" in bad.stdout + bad.stderr
