"""`frametap demo --tls`: the reference servers, the proxy's routes and the Locust users
all speak TLS (a throwaway CA the demo makes with openssl); RocketMQ's route-data
rewriting keeps the broker connections on the proxy. Every handshake succeeds on both
sides, the counts match as without TLS, and the frame log's rows carry the TLS version."""

import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow


def test_demo_tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("the `openssl` program is not installed")
    r = subprocess.run([sys.executable, "-m", "proxy", "demo", "--tls", "--seconds", "6",
                        "--users", "2", "--protocols", "flymq,rocketmq", "--no-analysis",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "TLS on both sides of every route" in r.stdout
    assert "protocol errors: 0   unmatched responses: 0" in r.stdout
    hs = {}
    for fam in text_string_to_metric_families((tmp_path / "metrics.txt").read_text()):
        for s in fam.samples:
            if s.name == "frametap_tls_handshakes_total":
                hs[(s.labels["route"], s.labels["side"], s.labels["outcome"])] = s.value
    routes = {route for route, _, _ in hs}
    assert routes == {"flymq", "rocketmq-namesrv", "rocketmq-broker"}, hs
    for route in routes:
        for side in ("listen", "upstream"):
            assert hs[(route, side, "ok")] > 0, (route, side, hs)
            for bad in ("timeout", "verify_failed", "protocol_error"):
                assert hs[(route, side, bad)] == 0, (route, side, bad, hs)
    rows = pa.concat_tables([pq.read_table(f) for f in
                             (tmp_path / "framelogs").glob("proxy-*.parquet")]).to_pylist()
    assert rows and all(dict(r["attrs"] or {}).get("tls_version") == "TLSv1.3" for r in rows)
    assert {r["route"] for r in rows} == routes
