"""Run files (proxy/runinfo.py): what ran, written beside the frame logs by the proxy,
the Locust plugin and the demo, and read by ``frametap analyze`` for its headline."""

import glob
import json
import os
import time

from loadgen.analysis.runs import Runs
from proxy.runinfo import RunInfo, is_run_file
from tests._support import proxy_process


def test_written_atomically_then_finished(tmp_path):
    info = RunInfo(str(tmp_path / "logs"), "client", "run-1", locust={"users": 3})
    info.write()
    [name] = os.listdir(tmp_path / "logs")           # created the directory; no temp left
    assert is_run_file(name) and name.startswith(f"run-client-") and f"-{os.getpid()}-" in name
    data = json.loads((tmp_path / "logs" / name).read_text())
    assert data["format"] == "frametap-run/1" and data["run_id"] == "run-1"
    assert data["ended"] is None and data["locust"] == {"users": 3}
    info.update(locust={"stats": []})
    info.finish()
    data = json.loads((tmp_path / "logs" / name).read_text())
    assert data["ended"] and data["locust"] == {"users": 3, "stats": []}
    assert os.listdir(tmp_path / "logs") == [name]


def test_a_run_file_that_cannot_be_written_is_not_fatal(tmp_path, caplog):
    (tmp_path / "file").write_text("x")
    info = RunInfo(str(tmp_path / "file" / "logs"), "proxy", "r")
    info.write()
    info.finish()                                    # warned once, never raised
    assert sum("cannot write" in r.message for r in caplog.records) == 1


def test_the_proxy_writes_its_routes_and_when_it_stopped(tmp_path):
    logs = tmp_path / "logs"
    proc = proxy_process(tmp_path, ["--protocol", "flymq", "--listen", "127.0.0.1:0",
                                    "--upstream", "127.0.0.1:1", "--framelog", str(logs),
                                    "--run-id", "r9", "--request-timeout", "7"],
                         log_level="warning")
    port = proc.port()                     # the one port 0 became (its ready file)
    try:
        deadline = time.monotonic() + 30
        files = []
        while not files and time.monotonic() < deadline:
            files = glob.glob(str(logs / "run-proxy-*.json"))
            time.sleep(0.1)
        assert files, "no run file"
        started = json.loads(open(files[0]).read())
        assert started["ended"] is None
    finally:
        status = proc.stop(timeout=30)
    assert status == 0, proc.log_text()[-3000:]
    data = json.loads(open(files[0]).read())
    assert data["source"] == "proxy" and data["run_id"] == "r9" and data["ended"]
    assert data["proxy"]["routes"] == [{
        "name": "flymq", "protocol": "flymq", "listen": f"127.0.0.1:{port}",
        "upstream": "127.0.0.1:1", "request_timeout": 7.0, "connect_timeout": 5.0,
        "max_connections": 10000, "max_frame_bytes": None, "framelog": True}]
    # what the analysis reads from it
    runs = Runs([data])
    assert runs.route_by_address() == [(f"127.0.0.1:{port}", None, "flymq")]
    assert ("route flymq", f"flymq: 127.0.0.1:{port} → 127.0.0.1:1, request timeout 7.0 s") \
        in runs.settings()


def test_runs_name_a_client_target_by_the_route_listening_there():
    runs = Runs([{"source": "proxy", "proxy": {"routes": [
        {"name": "a", "listen": "127.0.0.1:19092"}, {"name": "b", "listen": "0.0.0.0:5553"},
        {"name": "c", "listen": "[::]:7001"}, {"name": "d", "listen": "unix:/run/x.sock"}]}},
        {"source": "proxy", "proxy": {"routes": [{"name": "a", "listen": "10.0.0.1:1"}]}},
        {"source": "client", "locust": {}}])
    assert runs.route_by_address() == [("127.0.0.1:19092", None, "a"), ("unix:/run/x.sock",
                                                                          None, "d"),
                                       (None, "5553", "b"), (None, "7001", "c")]


def test_locust_stats_and_errors_add_up_across_run_files():
    runs = Runs([
        {"source": "client", "locust": {
            "stats": [{"type": "flymq", "name": "PRODUCE", "requests": 10, "failures": 1,
                       "p50_ms": 2, "p99_ms": 9}],
            "errors": [{"type": "flymq", "name": "PRODUCE", "error": "E('id 1234')",
                        "occurrences": 1}]}},
        {"source": "client", "locust": {
            "stats": [{"type": "flymq", "name": "PRODUCE", "requests": 5, "failures": 0,
                       "p50_ms": 3, "p99_ms": 4}],
            "errors": [{"type": "flymq", "name": "PRODUCE", "error": "E('id 98765')",
                        "occurrences": 4}]}}])
    assert runs.locust_stats() == {("flymq", "PRODUCE"): {"requests": 15, "failures": 1,
                                                          "p50_ms": None, "p99_ms": None}}
    assert runs.locust_errors() == [{"type": "flymq", "name": "PRODUCE", "error": "E('id N')",
                                     "occurrences": 5}]
