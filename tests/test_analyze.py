"""frametap analyze: known frame logs in, exact tables out (docs/analysis.md).

The frame logs are written here (pyarrow with proxy.framelog.SCHEMA; Parquet in several
files and row groups, and JSON Lines), and every expected number is computed in Python
from the same rows by ``Oracle``, which applies docs/design.md's counting rules on its
own.  Counts must match exactly; percentiles must be a logged latency whose rank is
within the stated accuracy (RANK_ERROR) of the exact percentile's rank.

One local SparkSession (local[2]) serves the whole module.  Without Java the tests skip,
or fail when FRAMETAP_CI is set.
"""

import csv
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.analysis import RANK_ERROR, AnalysisError
from loadgen.analysis.session import java_problem
from proxy.framelog import SCHEMA
from tests._support.processes import FRAMETAP, ROOT

#: 2026-11-18T19:33:20.250Z: runs start a quarter second into a second, so per-second
#: groups are cut mid-run
T0 = 1_795_030_400_250_000_000
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def need(reason):
    """A missing service: fail in CI (FRAMETAP_CI), skip on a laptop."""
    if os.environ.get("FRAMETAP_CI"):
        pytest.fail(reason + " (FRAMETAP_CI is set: CI must have it)")
    pytest.skip(reason)


def require_java():
    problem = java_problem()
    if problem:
        need(f"no Java for Spark: {problem}")


# ---- the frame logs ----------------------------------------------------------------

def row(**kw):
    out = {name: None for name in SCHEMA.names}
    out.update(kw)
    return out


def proxy_pair(rows, ts, route, protocol, conn, peer, op, corr, latency, *, answer=None,
               status="OK", outcome="ok", req_bytes=100, resp_bytes=40, messages=1,
               run_id="run-a"):
    """A request row and its matched response row (latency ns; answer: the response's
    own opcode name, e.g. ERROR or PublishConfirm)."""
    base = dict(source="proxy", run_id=run_id, route=route, protocol=protocol, conn_id=conn,
                peer=peer, correlation_id=corr)
    rows.append(row(ts_ns=ts, direction="c2s", opcode=1, opcode_name=op, kind="request",
                    frame_bytes=req_bytes, header_bytes=8, payload_bytes=req_bytes - 8,
                    messages=messages, **base))
    rows.append(row(ts_ns=ts + latency, direction="s2c", opcode=1, opcode_name=answer or op,
                    kind="response", status=status, outcome=outcome, frame_bytes=resp_bytes,
                    header_bytes=8, payload_bytes=resp_bytes - 8, messages=messages,
                    latency_ns=latency, request_opcode_name=op, **base))


def event(ts, route, protocol, conn, peer, op, corr, status, direction="c2s", latency=None,
          run_id="run-a"):
    """A proxy event row: a request that timed out (``status="timeout"``) or whose
    connection closed before its answer (``status="closed"``: a cut-off)."""
    return row(ts_ns=ts, source="proxy", run_id=run_id, route=route, protocol=protocol,
               conn_id=conn, peer=peer, direction=direction, opcode=1, opcode_name=op,
               kind="event", correlation_id=corr, status=status, request_opcode_name=op,
               frame_bytes=0, messages=0, latency_ns=latency)


def known_rows():
    """Proxy and client rows of one run over ~60 s, grouped by the file they go to."""
    files = {"fly": [], "fly_more": [], "stream": [], "bulk": [], "client_pq": [],
             "client_json": [], "flex": []}
    fly, more = files["fly"], files["fly_more"]
    produce = []        # (ts, conn, peer, corr, latency, error) of each fly PRODUCE
    for i in range(1000):                       # PRODUCE: 1000 over 10 s on 4 connections
        conn, seq = i % 4 + 1, i // 4 + 1
        peer, ts = f"127.0.0.1:{50000 + conn}", T0 + i * 10_000_000
        latency = ((i * 7919) % 1000 + 1) * 1000          # distinct, 1 us .. 1 ms
        error = i % 20 == 7
        target = fly if i < 600 else more
        proxy_pair(target, ts, "fly", "flymq", conn, peer, "PRODUCE", str(seq), latency,
                   answer="ERROR" if error else None, status="ERROR" if error else "OK",
                   outcome="error" if error else "ok")
        produce.append((ts, conn, peer, str(seq), latency, error))
    for i in range(200):                        # FETCH: 190 answered, 10 time out
        ts, peer = T0 + 2_000_000_000 + i * 20_000_000, "127.0.0.1:50005"
        if i % 20 == 3:
            fly.append(row(ts_ns=ts, source="proxy", run_id="run-a", route="fly",
                           protocol="flymq", conn_id=5, peer=peer, direction="c2s", opcode=2,
                           opcode_name="FETCH", kind="request", correlation_id=str(i + 1),
                           frame_bytes=60, messages=1))
            fly.append(row(ts_ns=ts + 30_000_000_000, source="proxy", run_id="run-a",
                           route="fly", protocol="flymq", conn_id=5, peer=peer,
                           direction="c2s", opcode=2, opcode_name="FETCH", kind="event",
                           correlation_id=str(i + 1), status="timeout",
                           request_opcode_name="FETCH", frame_bytes=0, messages=0))
        else:
            proxy_pair(fly, ts, "fly", "flymq", 5, peer, "FETCH", str(i + 1),
                       5_000_000 + i * 10_000 + 1, req_bytes=60, resp_bytes=900, messages=3)
    for i in range(4):                          # FETCHes cut off when the run stopped; two
        ts, peer = T0 + 2_500_000_000 + i, "127.0.0.1:50005"     # carry how long they
        fly.append(row(ts_ns=ts, source="proxy", run_id="run-a", route="fly",    # waited:
                       protocol="flymq", conn_id=5, peer=peer, direction="c2s", opcode=2,
                       opcode_name="FETCH", kind="request", correlation_id=str(300 + i),
                       frame_bytes=60, messages=1))      # never the slowest "answers"
        fly.append(event(ts + 400_000_000, "fly", "flymq", 5, peer, "FETCH", str(300 + i),
                         "closed", latency=99_000_000_000 if i < 2 else None))
    for i in range(3):                          # responses that answer nothing
        fly.append(row(ts_ns=T0 + 4_000_000_000 + i, source="proxy", run_id="run-a",
                       route="fly", protocol="flymq", conn_id=6, peer="127.0.0.1:50006",
                       direction="s2c", opcode=1, opcode_name="PRODUCE", kind="response",
                       status="OK", outcome="ok", frame_bytes=40, messages=1))
    stream = files["stream"]
    publish = []
    for i in range(300):                        # Publish -> PublishConfirm, per publishing id
        ts, peer = T0 + 500_000_000 + i * 15_000_000, "127.0.0.1:51001"
        latency = 2_000_000 + ((i * 37) % 300) * 1000
        proxy_pair(stream, ts, "stream", "rabbitmq-stream", 11, peer, "Publish",
                   f"1:{i + 1}", latency, answer="PublishConfirm", req_bytes=0 if i % 2 else 300,
                   resp_bytes=0 if i % 2 else 50)
        publish.append((ts, peer, f"1:{i + 1}", latency))
    for i in range(100):                        # Credit: oneway, never answered
        stream.append(row(ts_ns=T0 + 700_000_000 + i * 30_000_000, source="proxy",
                          run_id="run-a", route="stream", protocol="rabbitmq-stream",
                          conn_id=11, peer="127.0.0.1:51001", direction="c2s", opcode=9,
                          opcode_name="Credit", kind="oneway", frame_bytes=13, messages=0))
    for i in range(6):                          # Publishes cut off by the end of the run
        ts, peer = T0 + 9_500_000_000 + i * 1000, "127.0.0.1:51001"
        stream.append(row(ts_ns=ts, source="proxy", run_id="run-a", route="stream",
                          protocol="rabbitmq-stream", conn_id=11, peer=peer, direction="c2s",
                          opcode=2, opcode_name="Publish", kind="request",
                          correlation_id=f"1:{400 + i}", frame_bytes=300, messages=1))
        stream.append(event(ts + 5_000_000, "stream", "rabbitmq-stream", 11, peer, "Publish",
                            f"1:{400 + i}", "closed"))
    flex = files["flex"]            # fleximq REQ: requester -> broker -> responder and back
    for i in range(50):
        ts, corr = T0 + 3_000_000_000 + i * 40_000_000, f"req-{i}"
        inner = 1_000_000 + i * 1000              # the responder's time (broker leg)
        outer = inner + 300_000 + i * 10          # the requester's wait
        base = dict(source="proxy", run_id="run-a", route="flex", protocol="fleximq",
                    correlation_id=corr)
        req_side = dict(conn_id=31, peer="127.0.0.1:52001")
        resp_side = dict(conn_id=32, peer="127.0.0.1:52002")
        flex.append(row(ts_ns=ts, direction="c2s", opcode=3, opcode_name="REQ",
                        kind="request", frame_bytes=80, messages=1, **base, **req_side))
        flex.append(row(ts_ns=ts + 100_000, direction="s2c", opcode=3, opcode_name="REQ",
                        kind="request", frame_bytes=80, messages=1, **base, **resp_side))
        flex.append(row(ts_ns=ts + 100_000 + inner, direction="c2s", opcode=4,
                        opcode_name="REP", kind="response", status="200", outcome="ok",
                        frame_bytes=70, messages=1, latency_ns=inner,
                        request_opcode_name="REQ", **base, **resp_side))
        flex.append(row(ts_ns=ts + outer, direction="s2c", opcode=4, opcode_name="REP",
                        kind="response", status="600" if i % 25 == 24 else "200",
                        outcome="error" if i % 25 == 24 else "ok", frame_bytes=70,
                        messages=1, latency_ns=outer, request_opcode_name="REQ", **base,
                        **req_side))
        # the requester's client row: its route is the proxy listener it connected to
        files["client_pq"].append(row(
            ts_ns=ts - 30_000, source="client", run_id="run-a", route=FLEX_TARGET,
            protocol="fleximq", conn_id=4, peer="127.0.0.1:52001", direction="c2s",
            opcode=3, opcode_name="REQ", kind="request", correlation_id=corr,
            status="600" if i % 25 == 24 else "200",
            outcome="error" if i % 25 == 24 else "ok", frame_bytes=80, messages=1,
            latency_ns=outer + 200_003))
    rng = random.Random(20261118)
    bulk = files["bulk"]
    for i in range(60_000):                     # enough answers for the sketch to compress
        ts = T0 + 1_000_000_000 + i * 1_000_000
        latency = int(rng.lognormvariate(math.log(3e6), 0.6))
        proxy_pair(bulk, ts, "bulk", "rocketmq", 20 + i % 8, f"10.0.0.1:{40000 + i % 8}",
                   "SEND_MESSAGE_V2", str(i + 1), latency, answer="SEND_MESSAGE_V2",
                   status="SUCCESS", req_bytes=250, resp_bytes=120, run_id="run-b")
    # client side: the first 500 PRODUCEs and 100 Publishes as Locust saw them; route is
    # null on some rows and the protocol name on others (as the Locust users may write)
    for n, (ts, conn, peer, corr, latency, error) in enumerate(produce[:500]):
        target = files["client_pq"] if n % 2 else files["client_json"]
        target.append(row(ts_ns=ts - 50_000, source="client", run_id="run-a",
                          route=None if n % 2 else "flymq", protocol="flymq", conn_id=conn,
                          peer=peer, direction="c2s", opcode=1, opcode_name="PRODUCE",
                          kind="request", correlation_id=corr,
                          status="ERROR" if error else "OK",
                          outcome="error" if error else "ok", frame_bytes=100, messages=1,
                          latency_ns=2 * latency + 200_001))
    for ts, peer, corr, latency in publish[:100]:
        files["client_pq"].append(row(
            ts_ns=ts - 20_000, source="client", run_id="run-a", route="rabbitmq-stream",
            protocol="rabbitmq-stream", conn_id=1, peer=peer, direction="c2s", opcode=2,
            opcode_name="Publish", kind="request", correlation_id=corr, status="OK",
            outcome="ok", frame_bytes=300, messages=1, latency_ns=latency + 700_003))
    for i in range(5):                          # the client gave up on these
        files["client_json"].append(row(
            ts_ns=T0 + 9_000_000_000 + i, source="client", run_id="run-a", route=None,
            protocol="flymq", conn_id=9, peer="127.0.0.1:50009", direction="c2s", opcode=1,
            opcode_name="PRODUCE", kind="request", correlation_id=str(i + 1),
            status="timeout", outcome="error", frame_bytes=100, messages=1))
    return files


#: where the fleximq client rows say they went, and the proxy route listening there (on
#: every interface: the run file's listen address names the port only)
FLEX_TARGET = "127.0.0.1:7001"
RUN_FILES = {
    "run-proxy-h1-100-20261118T193320Z.json": {
        "format": "frametap-run/1", "source": "proxy", "run_id": "run-a", "host": "h1",
        "pid": 100, "started": "2026-11-18T19:33:20.000Z", "ended": "2026-11-18T19:34:20.000Z",
        "proxy": {"routes": [
            {"name": "fly", "protocol": "flymq", "listen": "127.0.0.1:19092",
             "upstream": "10.0.0.9:9092", "request_timeout": 30.0},
            {"name": "stream", "protocol": "rabbitmq-stream", "listen": "127.0.0.1:5553",
             "upstream": "10.0.0.9:5552", "request_timeout": 30.0},
            {"name": "flex", "protocol": "fleximq", "listen": "0.0.0.0:7001",
             "upstream": "10.0.0.9:7890", "request_timeout": 30.0}]}},
    "host2/run-client-h3-300-20261118T193320Z.json": {
        "format": "frametap-run/1", "source": "client", "run_id": "run-a", "host": "h3",
        "pid": 300, "started": "2026-11-18T19:33:20.000Z", "ended": "2026-11-18T19:34:20.000Z",
        "locust": {"host": "127.0.0.1:19092", "users": 12, "spawn_rate": 4, "run_time_s": 60,
                   "user_classes": ["FlyMQProducer"], "protocols": ["flymq"],
                   "stats": [{"type": "flymq", "name": "PRODUCE", "requests": 505,
                              "failures": 30, "p50_ms": 1, "p99_ms": 2}],
                   "errors": [{"type": "flymq", "name": "PRODUCE", "occurrences": 25,
                               "error": "FlyMQServerError('no such topic 12345')"}]}},
}


def client_routes(rows):
    """``rows`` with client rows' target addresses named as the analysis names them from
    the run files (RUN_FILES: the flex route listens on every interface, port 7001)."""
    out = []
    for r in rows:
        if r["source"] == "client" and r["route"] == FLEX_TARGET:
            r = dict(r, route="flex")
        out.append(r)
    return out


def write_parquet(path, rows, row_group_size=None):
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(table, path, compression="zstd", row_group_size=row_group_size,
                   store_schema=False)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def write_known(directory, files, fmt=None):
    """The files under ``directory`` (nested, mixed formats), plus what must be skipped:
    a writer's hidden temporary file, Spark markers, other files, a hidden directory."""
    os.makedirs(os.path.join(directory, "host2", "deeper"), exist_ok=True)
    plan = [("fly", "proxy-h1-100-20261118T193320Z-000001", "parquet", 128),
            ("fly_more", "host2/deeper/proxy-h2-200-20261118T193320Z-000001", "parquet", None),
            ("stream", "proxy-h1-100-20261118T193320Z-000002", "jsonl", None),
            ("bulk", "host2/proxy-h2-200-20261118T193320Z-000002", "parquet", 8192),
            ("client_pq", "client-h3-300-20261118T193320Z-000001", "parquet", None),
            ("client_json", "client-h3-300-20261118T193320Z-000002", "jsonl", None),
            ("flex", "host2/proxy-h2-200-20261118T193320Z-000003", "parquet", None)]
    for key, stem, kind, groups in plan:
        if key not in files:
            continue
        kind = fmt or kind
        path = os.path.join(directory, f"{stem}.{kind}")
        if kind == "parquet":
            write_parquet(path, files[key], groups)
        else:
            write_jsonl(path, files[key])
    junk = b"PAR1 half written"
    with open(os.path.join(directory, ".proxy-h1-100-20261118T193320Z-000003.parquet.tmp"),
              "wb") as f:
        f.write(junk)
    with open(os.path.join(directory, "._hidden.parquet"), "wb") as f:
        f.write(junk)
    os.makedirs(os.path.join(directory, ".trash"), exist_ok=True)
    with open(os.path.join(directory, ".trash", "proxy-old.parquet"), "wb") as f:
        f.write(junk)
    for name in ("_SUCCESS", "README.txt"):
        with open(os.path.join(directory, name), "w") as f:
            f.write("not a frame log\n")
    for name, data in RUN_FILES.items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(data, f)


# ---- the oracle: docs/design.md's rules, applied in Python -------------------------------

class Oracle:
    """Expected tables from the rows, by the rules of docs/design.md "Analysis"."""

    def __init__(self, rows):
        self.rows = rows

    @staticmethod
    def classify(r):
        kind, src = r["kind"], r["source"]
        is_req = kind in ("request", "oneway")
        client = src == "client" and kind == "request"
        timeout = (kind == "event" and r["status"] == "timeout") or (
            client and r["status"] == "timeout")
        cut = kind == "event" and r["status"] == "closed"
        unmatched = (kind == "response" and r["latency_ns"] is None
                     and r["request_opcode_name"] is None)
        answered = (kind == "response" and not unmatched) or (
            client and r["latency_ns"] is not None and not timeout)
        op = r["opcode_name"] if is_req else (r["request_opcode_name"] or r["opcode_name"])
        frame = kind != "event"
        if src == "client":
            leg = "c2s"
        elif kind == "response":
            leg = "c2s" if r["direction"] == "s2c" else "s2c"
        else:
            leg = r["direction"]
        return dict(op=op, is_req=is_req, answered=answered, timeout=timeout, cut=cut, leg=leg,
                    unmatched=unmatched, error=answered and r["outcome"] == "error",
                    lat=r["latency_ns"] if answered else None,
                    fb=(r["frame_bytes"] or 0) if frame else 0,
                    msgs=(r["messages"] or 0) if frame else 0)

    def summary(self):
        groups = {}
        for r in self.rows:
            c = self.classify(r)
            key = (r["source"], r["route"], r["protocol"], c["op"])
            g = groups.setdefault(key, dict(requests=0, responses=0, errors=0, timeouts=0,
                                            unmatched=0, ts=[], lats=[], frame_bytes=0,
                                            messages=0, cut_off=0))
            g["requests"] += c["is_req"]
            g["responses"] += c["answered"]
            g["errors"] += c["error"]
            g["timeouts"] += c["timeout"]
            g["cut_off"] += c["cut"]
            g["unmatched"] += c["unmatched"]
            if c["is_req"]:
                g["ts"].append(r["ts_ns"])
            if c["lat"] is not None:
                g["lats"].append(c["lat"])
            g["frame_bytes"] += c["fb"]
            g["messages"] += c["msgs"]
        for g in groups.values():
            g["lats"].sort()
            span = max((max(g["ts"]) - min(g["ts"])) / 1e9 if g["ts"] else 0.0, 1.0)
            g["rate_per_s"] = round(g["requests"] / span, 3)
            g["error_ratio"] = round(g["errors"] / g["responses"], 6) if g["responses"] else 0.0
        return groups

    def legs(self):
        """Per (source, protocol, opcode, leg): counts and sorted latencies."""
        groups = {}
        for r in self.rows:
            c = self.classify(r)
            g = groups.setdefault((r["source"], r["protocol"], c["op"], c["leg"]), dict(
                requests=0, responses=0, errors=0, timeouts=0, cut_off=0, lats=[]))
            g["requests"] += c["is_req"]
            g["responses"] += c["answered"]
            g["errors"] += c["error"]
            g["timeouts"] += c["timeout"]
            g["cut_off"] += c["cut"]
            if c["lat"] is not None:
                g["lats"].append(c["lat"])
        for g in groups.values():
            g["lats"].sort()
        return groups

    def errors(self):
        """{(source, route, protocol, opcode, status): error answers}."""
        out = {}
        for r in self.rows:
            c = self.classify(r)
            if c["error"]:
                key = (r["source"], r["route"], r["protocol"], c["op"], r["status"])
                out[key] = out.get(key, 0) + 1
        return out

    def timeline(self):
        groups = {}
        for r in self.rows:
            c = self.classify(r)
            key = (r["ts_ns"] // 1_000_000_000, r["source"], r["route"], c["op"])
            g = groups.setdefault(key, dict(requests=0, errors=0, lats=[]))
            g["requests"] += c["is_req"]
            g["errors"] += c["error"]
            if c["lat"] is not None:
                g["lats"].append(c["lat"])
        for g in groups.values():
            g["lats"].sort()
        return groups

    def answered(self):
        out = []
        for r in self.rows:
            c = self.classify(r)
            if c["lat"] is not None:
                out.append(dict(r, op=c["op"], lat=c["lat"]))
        return out

    def slowest(self, n):
        rows = sorted(self.answered(), key=lambda r: (-r["lat"], r["ts_ns"], r["source"],
                                                      r["conn_id"], r["correlation_id"]))
        return rows[:n]

    def decomposition(self):
        client = {}
        for r in self.answered():
            if r["source"] == "client" and r["kind"] == "request" and r["correlation_id"]:
                client.setdefault((r["protocol"], r["peer"], r["correlation_id"]),
                                  []).append(r["lat"])
        groups = {}
        for r in self.answered():
            if r["source"] != "proxy" or r["kind"] != "response" or not r["correlation_id"]:
                continue
            for c in client.get((r["protocol"], r["peer"], r["correlation_id"]), []):
                g = groups.setdefault((r["route"], r["protocol"], r["op"]),
                                      dict(client=[], server=[], outside=[]))
                g["client"].append(c)
                g["server"].append(r["lat"])
                g["outside"].append(c - r["lat"])
        for g in groups.values():
            for v in g.values():
                v.sort()
        return groups


def assert_rank_close(sorted_values, q, got_ms, what):
    """``got_ms`` is one of the values, and its rank is within RANK_ERROR * n of the
    exact q-percentile's rank (ceil(q * n), Spark's definition); one rank of slack for
    the rounding of q * n."""
    n = len(sorted_values)
    assert n, what
    got = round(got_ms * 1e6)
    assert got in set(sorted_values), f"{what}: {got} ns is not a logged latency"
    import bisect
    lo = bisect.bisect_left(sorted_values, got) + 1          # 1-based ranks of got
    hi = bisect.bisect_right(sorted_values, got)
    target = max(1, math.ceil(q * n))
    distance = 0 if lo <= target <= hi else min(abs(lo - target), abs(hi - target))
    assert distance <= RANK_ERROR * n + 1, (
        f"{what}: rank {lo}..{hi} of {n}, exact percentile rank {target} "
        f"(allowed {RANK_ERROR * n + 1:.1f})")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(text, kind=int):
    return None if text in ("", None) else kind(text)


def opt(text):
    return None if text == "" else text


# ---- fixtures --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark():
    """One local SparkSession for the module (started the way the command starts it)."""
    require_java()
    from loadgen.analysis.session import start_session, stop_session
    session, owned = start_session("local[2]", [])
    yield session
    stop_session(session, owned)


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """(logs dir, rows by file, all rows) of the known mixed-format run."""
    directory = tmp_path_factory.mktemp("known-logs")
    files = known_rows()
    write_known(str(directory), files)
    return str(directory), files, client_routes([r for rows in files.values() for r in rows])


@pytest.fixture(scope="module")
def analysed(spark, known, tmp_path_factory):
    """The known run analysed once (in this process): (out dir, Result, Oracle)."""
    from loadgen.analysis.job import analyze
    out = str(tmp_path_factory.mktemp("known-out"))
    result = analyze(spark, [known[0]], out, slowest=30)
    return out, result, Oracle(known[2])


# ---- the tables ------------------------------------------------------------------------

def test_outputs_exist_with_the_contract_columns(analysed):
    out, result, _ = analysed
    from loadgen.analysis.tables import (DECOMPOSITION_COLUMNS, SLOWEST_COLUMNS,
                                         SUMMARY_COLUMNS, TIMELINE_COLUMNS)
    from loadgen.analysis.tables import ERRORS_COLUMNS, LEGS_COLUMNS
    # the product design's summary columns, then cut_off at the end
    assert SUMMARY_COLUMNS[:18] == (
        "source", "route", "protocol", "opcode", "requests", "responses", "errors",
        "error_ratio", "timeouts", "unmatched", "rate_per_s", "p50_ms", "p90_ms", "p99_ms",
        "p999_ms", "max_ms", "frame_bytes", "messages") and SUMMARY_COLUMNS[18:] == ("cut_off",)
    for name, cols in (("summary", SUMMARY_COLUMNS), ("timeline", TIMELINE_COLUMNS),
                       ("slowest", SLOWEST_COLUMNS), ("decomposition", DECOMPOSITION_COLUMNS),
                       ("legs", LEGS_COLUMNS), ("errors", ERRORS_COLUMNS)):
        with open(os.path.join(out, name + ".csv")) as f:
            assert f.readline().rstrip("\n").split(",") == list(cols), name
        if name not in ("slowest", "legs", "errors"):
            table = pq.read_table(os.path.join(out, name))
            assert table.column_names == list(cols), name
    assert not os.path.exists(os.path.join(out, "slowest"))      # CSV only, as designed
    assert os.path.getsize(os.path.join(out, "report.html")) > 1_000_000
    leftovers = [n for n in os.listdir(out) if n.startswith(".")]
    assert leftovers == [], leftovers


def test_summary_counts_exact_and_percentiles_within_accuracy(analysed):
    out, result, oracle = analysed
    expected = oracle.summary()
    got = {(r["source"], opt(r["route"]), r["protocol"], r["opcode"]): r
           for r in read_csv(os.path.join(out, "summary.csv"))}
    assert set(got) == set(expected)
    # anchors: the oracle agrees with how the rows were made
    fly = expected[("proxy", "fly", "flymq", "PRODUCE")]
    assert (fly["requests"], fly["responses"], fly["errors"], fly["unmatched"]) == (
        1000, 1000, 50, 3)
    fetch = expected[("proxy", "fly", "flymq", "FETCH")]
    assert (fetch["timeouts"], fetch["cut_off"]) == (10, 4)     # cut-offs are no timeouts
    # 204 FETCHes sent over 3.98 s: their timeouts, 30 s later, do not dilute the rate
    assert fetch["rate_per_s"] == round(204 / 3.98, 3)
    assert expected[("proxy", "stream", "rabbitmq-stream", "Publish")]["cut_off"] == 6
    assert expected[("proxy", "flex", "fleximq", "REQ")]["requests"] == 100     # two legs
    assert expected[("client", "flex", "fleximq", "REQ")]["requests"] == 50
    assert expected[("client", None, "flymq", "PRODUCE")]["timeouts"] == 5
    assert expected[("proxy", "stream", "rabbitmq-stream", "Credit")]["responses"] == 0
    for key, e in expected.items():
        g = got[key]
        for col in ("requests", "responses", "errors", "timeouts", "unmatched", "frame_bytes",
                    "messages", "cut_off"):
            assert num(g[col]) == e[col], (key, col)
        assert float(g["rate_per_s"]) == pytest.approx(e["rate_per_s"], abs=1e-3), key
        assert float(g["error_ratio"]) == pytest.approx(e["error_ratio"], abs=1e-6), key
        if not e["lats"]:
            assert g["p50_ms"] == g["p99_ms"] == g["max_ms"] == "", key
            continue
        assert num(g["max_ms"], float) * 1e6 == pytest.approx(e["lats"][-1], abs=0.5), key
        for col, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99), ("p999_ms", 0.999)):
            assert_rank_close(e["lats"], q, float(g[col]), f"{key} {col}")
    # the Parquet table holds the same rows as the CSV
    table = pq.read_table(os.path.join(out, "summary")).to_pylist()
    assert len(table) == len(got)
    for r in table:
        g = got[(r["source"], r["route"], r["protocol"], r["opcode"])]
        assert r["requests"] == int(g["requests"]) and r["p99_ms"] == num(g["p99_ms"], float)
    # and the collected summary (what the terminal shows) is that table too
    assert len(result.summary) == len(got)


def test_bulk_percentiles_come_from_a_compressed_sketch(analysed):
    """60 000 answers in one group: more than Spark's sketch keeps exactly (its head
    buffer holds 50 000), so this checks the approximation, not an exact sort."""
    out, _, oracle = analysed
    e = oracle.summary()[("proxy", "bulk", "rocketmq", "SEND_MESSAGE_V2")]
    assert len(e["lats"]) == 60_000
    g = [r for r in read_csv(os.path.join(out, "summary.csv")) if r["route"] == "bulk"][0]
    for col, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99), ("p999_ms", 0.999)):
        assert_rank_close(e["lats"], q, float(g[col]), f"bulk {col}")


def test_timeline_exact_per_second(analysed):
    out, _, oracle = analysed
    expected = oracle.timeline()
    rows = read_csv(os.path.join(out, "timeline.csv"))
    assert len(rows) == len(expected)
    seen = []
    for r in rows:
        assert ISO_MS.match(r["second"]), r["second"]
        assert r["second"].endswith(".000Z")
        import datetime
        sec = int(datetime.datetime.strptime(r["second"], "%Y-%m-%dT%H:%M:%S.%fZ")
                  .replace(tzinfo=datetime.timezone.utc).timestamp())
        key = (sec, r["source"], opt(r["route"]), r["opcode"])
        seen.append(key)
        e = expected[key]
        assert (int(r["requests"]), int(r["errors"])) == (e["requests"], e["errors"]), key
        if e["lats"]:
            assert_rank_close(e["lats"], 0.99, float(r["p99_ms"]), f"timeline {key}")
        else:
            assert r["p99_ms"] == "", key
    assert len(set(seen)) == len(seen)
    # sorted by second first
    assert [k[0] for k in seen] == sorted(k[0] for k in seen)
    assert pq.read_table(os.path.join(out, "timeline")).num_rows == len(rows)


def test_slowest_exact(analysed):
    out, result, oracle = analysed
    rows = read_csv(os.path.join(out, "slowest.csv"))
    expected = oracle.slowest(30)
    assert len(rows) == 30
    # cut-offs are not answers, whatever an event row carries: none is among the slowest
    assert max(float(r["latency_ms"]) for r in rows) < 1000
    import datetime
    for got, e in zip(rows, expected):
        ts = datetime.datetime.fromtimestamp(e["ts_ns"] // 1_000_000 / 1000,
                                             datetime.timezone.utc)
        want = ts.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (ts.microsecond // 1000)
        assert got["ts"] == want
        assert (got["source"], opt(got["route"]), got["protocol"], got["opcode"]) == (
            e["source"], e["route"], e["protocol"], e["op"])
        assert (int(got["conn_id"]), got["peer"], got["correlation_id"], got["status"]) == (
            e["conn_id"], e["peer"], e["correlation_id"], e["status"])
        assert float(got["latency_ms"]) * 1e6 == pytest.approx(e["lat"], abs=0.5)


def test_decomposition_pairs_and_percentiles(analysed):
    out, _, oracle = analysed
    expected = oracle.decomposition()
    assert {k: len(g["client"]) for k, g in expected.items()} == {
        ("fly", "flymq", "PRODUCE"): 500, ("stream", "rabbitmq-stream", "Publish"): 100,
        ("flex", "fleximq", "REQ"): 50}
    rows = read_csv(os.path.join(out, "decomposition.csv"))
    got = {(r["route"], r["protocol"], r["opcode"]): r for r in rows}
    assert set(got) == set(expected)
    for key, e in expected.items():
        g = got[key]
        assert int(g["pairs"]) == len(e["client"])
        for part in ("client", "server", "outside"):
            for q in (0.5, 0.99):
                col = f"{part}_p{int(q * 100)}_ms"
                assert_rank_close(e[part], q, float(g[col]), f"{key} {col}")
    assert pq.read_table(os.path.join(out, "decomposition")).num_rows == 3


def test_string_keys_give_the_same_tables(spark, known):
    """Percentile groups are keyed by 64-bit hashes unless two keys of the data share
    one; then by the strings.  Both ways must give the same tables."""
    from loadgen.analysis import inputs, tables
    rows = tables.classify(inputs.read_frames(spark, inputs.find_local([known[0]])))
    counted = tables.counts(rows)
    assert tables.hashes_are_unique(counted)
    got = {}
    for hashed in (True, False):
        latency = tables.latencies(rows, 5, hashed)
        got[hashed] = (
            sorted(map(tuple, tables.summary_of(counted, latency, hashed).collect()), key=str),
            sorted(map(tuple, tables.timeline_of(counted, latency, hashed).collect()), key=str),
            tables.series_of(counted, latency, 5, hashed).collect(),
            sorted(map(tuple, tables.decomposition(rows, counted, hashed).collect()), key=str),
            sorted(map(tuple, tables.legs_of(counted, latency, hashed).collect()), key=str),
            tables.op_series_of(counted, latency, 5, hashed).collect())
    assert got[True] == got[False]
    assert len(got[True][0]) == 10 and len(got[True][2]) > 10 and len(got[True][3]) == 3


def test_a_hash_collision_is_detected(spark, known):
    from pyspark.sql import functions as F

    from loadgen.analysis import inputs, tables
    logs = inputs.FrameLogs()
    logs.add("file://" + os.path.join(known[0], "proxy-h1-100-20261118T193320Z-000002.jsonl"))
    counted = tables.counts(tables.classify(inputs.read_frames(spark, logs)))
    assert tables.hashes_are_unique(counted)
    real = tables._hash
    try:
        tables._hash = lambda cols: F.lit(7)            # every key the same hash
        assert not tables.hashes_are_unique(counted)
    finally:
        tables._hash = real


def test_slowest_threshold_keeps_the_top_n():
    """The bound holds for any rank error within RANK_ERROR: at least n answers are at
    or above it; too few answers give no threshold."""
    from loadgen.analysis.tables import slowest_threshold
    row = dict(responses=100_000, p50_ms=1.0, p90_ms=2.0, p99_ms=3.0, p999_ms=4.0)
    assert slowest_threshold([row], 50) == 4_000_000 - 1       # 0.0009 * 1e5 = 90 >= 50
    assert slowest_threshold([row], 100) == 3_000_000 - 1      # 0.0099 * 1e5 = 990 >= 100
    assert slowest_threshold([dict(row, responses=150)], 100) is None
    assert slowest_threshold([dict(row, p999_ms=None, p99_ms=None, p90_ms=None,
                                   p50_ms=None)], 1) is None


def test_jsonl_and_parquet_read_the_same(spark, known, tmp_path):
    """The same rows as JSON Lines only and as Parquet only: the same frames reach the
    aggregations (the rest of the job does not know the format)."""
    from loadgen.analysis import inputs, tables
    files = {k: v for k, v in known[1].items() if k != "bulk"}      # keep it quick
    seen = {}
    for fmt in ("jsonl", "parquet"):
        logs = tmp_path / f"logs-{fmt}"
        write_known(str(logs), dict(files, bulk=[]), fmt=fmt)
        found = inputs.find_local([str(logs)])
        assert len(getattr(found, fmt)) == 7
        frames = tables.classify(inputs.read_frames(spark, found))
        seen[fmt] = sorted(map(tuple, frames.collect()), key=str)
    assert seen["jsonl"] == seen["parquet"]
    assert len(seen["jsonl"]) == sum(len(v) for v in files.values())


def test_proxy_only_logs_give_empty_decomposition_with_header(spark, known, tmp_path):
    from loadgen.analysis.job import analyze
    from loadgen.analysis.tables import DECOMPOSITION_COLUMNS
    logs = tmp_path / "logs"
    logs.mkdir()
    write_parquet(str(logs / "proxy-h-1-20261118T193320Z-000001.parquet"), known[1]["stream"])
    out = tmp_path / "out"
    result = analyze(spark, [str(logs)], str(out))
    assert (out / "decomposition.csv").read_text() == ",".join(DECOMPOSITION_COLUMNS) + "\n"
    table = pq.read_table(str(out / "decomposition"))
    assert table.num_rows == 0 and table.column_names == list(DECOMPOSITION_COLUMNS)
    assert result.meta["sources"] == ["proxy"]
    page = (out / "report.html").read_text()
    assert "there is no decomposition" in page
    assert ('"charts": ["opcode", "errors-by-status", "latency", "throughput", "p99", '
            '"errors", "problems"]') in page


def test_empty_files_write_every_output_with_header(spark, tmp_path):
    """Frame-log files without rows: every table empty, with its header; the report
    says so instead of drawing."""
    from loadgen.analysis.job import analyze
    from loadgen.analysis.tables import SLOWEST_COLUMNS, SUMMARY_COLUMNS, TIMELINE_COLUMNS
    logs = tmp_path / "logs"
    logs.mkdir()
    write_parquet(str(logs / "proxy-h-1-20261118T193320Z-000001.parquet"), [])
    (logs / "client-h-1-20261118T193320Z-000001.jsonl").write_text("")
    out = tmp_path / "out"
    result = analyze(spark, [str(logs)], str(out))
    for name, cols in (("summary.csv", SUMMARY_COLUMNS), ("timeline.csv", TIMELINE_COLUMNS),
                       ("slowest.csv", SLOWEST_COLUMNS)):
        assert (out / name).read_text() == ",".join(cols) + "\n"
    assert result.summary == [] and result.meta["records"] == 0
    assert '"charts": []' in (out / "report.html").read_text()


# ---- input errors: both ways of finding and checking files ---------------------------------

@pytest.fixture(params=["python", "hadoop"])
def find(request, spark):
    """Find and check frame logs the way ``prepare_local`` does (local paths, before
    Spark starts) or through Hadoop's FileSystem API (any URI): same rules, same
    messages.  Returns the files' local paths, sorted."""
    from loadgen.analysis import inputs

    def run(paths, out=None):
        if request.param == "python":
            logs = inputs.prepare_local([str(p) for p in paths], out and str(out))
            assert logs is not None
        else:
            logs = inputs.find_frame_logs(spark, ["file://" + str(p) for p in paths],
                                          exclude=out and "file://" + str(out))
            inputs.check_parquet(spark, logs.parquet)
        return sorted(inputs.local_name(f) for f in logs.parquet + logs.jsonl)
    return run


def test_both_ways_find_the_same_files(find, known):
    found = find([known[0]])
    names = [os.path.relpath(f, known[0]) for f in found]
    assert names == sorted([
        "client-h3-300-20261118T193320Z-000001.parquet",
        "client-h3-300-20261118T193320Z-000002.jsonl",
        "host2/deeper/proxy-h2-200-20261118T193320Z-000001.parquet",
        "host2/proxy-h2-200-20261118T193320Z-000002.parquet",
        "host2/proxy-h2-200-20261118T193320Z-000003.parquet",
        "proxy-h1-100-20261118T193320Z-000001.parquet",
        "proxy-h1-100-20261118T193320Z-000002.jsonl"])
    # a file given directly, twice, and a directory holding it: each file once
    one = os.path.join(known[0], "proxy-h1-100-20261118T193320Z-000001.parquet")
    assert len(find([one, one, known[0]])) == 7


def test_missing_path(find, tmp_path):
    with pytest.raises(AnalysisError, match=r"/nope: no such file or directory"):
        find([tmp_path / "nope"])


def test_dir_without_frame_logs(find, tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "notes.txt").write_text("x")
    (tmp_path / "logs" / ".proxy-h-1-x-000001.parquet.tmp").write_bytes(b"PAR1")
    with pytest.raises(AnalysisError, match=r"logs: no frame logs there"):
        find([tmp_path / "logs"])


def test_one_of_several_paths_without_frame_logs(find, known, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match=r"empty: no frame logs there"):
        find([known[0], tmp_path / "empty"])


def test_out_dir_is_skipped_or_refused(find, known, tmp_path):
    logs = tmp_path / "logs"
    (logs / "analysis" / "summary").mkdir(parents=True)
    write_parquet(str(logs / "proxy-h-1-20261118T193320Z-000001.parquet"), known[1]["stream"])
    pq.write_table(pa.table({"requests": [1]}),
                   str(logs / "analysis" / "summary" / "part-0.parquet"))
    assert [os.path.basename(f) for f in find([logs], logs / "analysis")] == [
        "proxy-h-1-20261118T193320Z-000001.parquet"]
    with pytest.raises(AnalysisError, match=r"is also --out"):
        find([logs], logs)


def test_foreign_parquet_is_named(find, known, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_parquet(str(logs / "proxy-h-1-20261118T193320Z-000001.parquet"), known[1]["stream"])
    foreign = logs / "sales.parquet"
    pq.write_table(pa.table({"region": ["north"], "amount": [3.5]}), str(foreign))
    with pytest.raises(AnalysisError) as info:
        find([logs])
    assert str(info.value) == (
        f"{foreign}: not a frame log (foreign Parquet schema: lacks columns ts_ns, source, "
        "run_id, route, protocol, ...)")


def test_mistyped_column_is_named(find, known, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    rows = known[1]["stream"][:10]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    table = table.set_column(SCHEMA.get_field_index("latency_ns"), "latency_ns",
                             pa.array([str(r["latency_ns"]) for r in rows]))
    bad = logs / "proxy-h-1-20261118T193320Z-000002.parquet"
    pq.write_table(table, str(bad))
    with pytest.raises(AnalysisError) as info:
        find([logs])
    assert str(info.value) == (f"{bad}: not a frame log (foreign Parquet schema: latency_ns "
                               "is BINARY, expected INT64)")


def test_unreadable_parquet_is_named(find, known, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    good = logs / "proxy-h-1-20261118T193320Z-000001.parquet"
    write_parquet(str(good), known[1]["stream"])
    broken = logs / "proxy-h-1-20261118T193320Z-000002.parquet"
    broken.write_bytes(good.read_bytes()[:-300])        # cut short: no footer
    with pytest.raises(AnalysisError, match=r"unreadable") as info:
        find([logs])
    assert str(info.value).startswith(f"{broken}: unreadable: ")
    assert "\n" not in str(info.value)


def test_permission_denied_is_named(known):
    """A file the user cannot read is named.  Root reads any file whatever its mode, so
    as root the check runs in a child process that drops to nobody's uid after its
    imports (a first pass over a readable directory loads whatever the check imports
    lazily): the checkout may sit in a directory nobody cannot enter (mktemp -d)."""
    import shutil
    import subprocess
    import sys
    import tempfile
    top = tempfile.mkdtemp(prefix="frametap-perm-")
    try:
        os.chmod(top, 0o755)
        logs, readable = os.path.join(top, "logs"), os.path.join(top, "readable")
        for d in (logs, readable):
            os.mkdir(d)
            os.chmod(d, 0o755)
        name = "proxy-h-1-20261118T193320Z-000001.parquet"
        locked = os.path.join(logs, name)
        write_parquet(locked, known[1]["stream"])
        write_parquet(os.path.join(readable, name), known[1]["stream"])
        os.chmod(locked, 0)
        code = ("import os, sys; from loadgen.analysis import inputs, AnalysisError\n"
                "inputs.prepare_local([sys.argv[2]], None)\n"
                "if os.geteuid() == 0:\n"
                "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
                "try:\n    inputs.prepare_local([sys.argv[1]], None)\n"
                "except AnalysisError as e:\n    print(e); sys.exit(2)\n")
        r = subprocess.run([sys.executable, "-c", code, logs, readable], capture_output=True,
                           text=True, cwd=top, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stdout.strip().startswith(f"{locked}: unreadable: "), r.stdout
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_out_must_be_a_directory(spark, known, tmp_path):
    from loadgen.analysis.job import analyze
    from loadgen.analysis.outputs import OutputDir
    (tmp_path / "file").write_text("x")
    with pytest.raises(AnalysisError, match=r"--out .*/file: exists and is not a directory"):
        analyze(spark, [known[0]], str(tmp_path / "file"))
    with pytest.raises(AnalysisError, match=r"--out .*/file: exists and is not a directory"):
        OutputDir(spark, "file://" + str(tmp_path / "file"))        # the Hadoop side


def test_malformed_json_lines_is_one_error(spark, known, tmp_path):
    from loadgen.analysis.job import analyze
    logs = tmp_path / "logs"
    logs.mkdir()
    bad = logs / "client-h-1-20261118T193320Z-000001.jsonl"
    write_jsonl(str(bad), known[1]["client_json"][:20])
    with open(bad, "a") as f:
        f.write('{"ts_ns": 12, "source": "client", "kind": \n')
    with pytest.raises(AnalysisError) as info:
        analyze(spark, [str(logs)], str(tmp_path / "out"))
    assert "JSON" in str(info.value) and "\n" not in str(info.value)


# ---- the command line ---------------------------------------------------------------------

def frametap(*args, env=None, timeout=240):
    return subprocess.run(FRAMETAP + list(args), capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_help():
    r = frametap("analyze", "--help")
    assert r.returncode == 0
    for text in ("--out DIR", "--master URL", "--slowest N", "report.html", "spark-submit"):
        assert text in r.stdout


def test_no_java_is_one_line_exit_2(tmp_path, known):
    env = dict(os.environ, JAVA_HOME=str(tmp_path / "no-java"),
               PATH=os.path.dirname(sys.executable))
    r = frametap("analyze", known[0], "--out", str(tmp_path / "out"), env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("frametap: error: JAVA_HOME=") and "Java 17" in lines[-1]
    assert "Traceback" not in r.stderr and len([l for l in lines if "error" in l]) == 1
    env.pop("JAVA_HOME")
    r = frametap("analyze", known[0], "--out", str(tmp_path / "out"), env=env, timeout=60)
    assert r.returncode == 2 and "no Java runtime" in r.stderr


def _cli_error(args, tmp_path):
    require_java()
    r = frametap("analyze", *args, "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if not line.startswith("analyze: ")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith("frametap: error: ")
    assert "Traceback" not in r.stderr
    return errors[0]


def test_cli_empty_dir(tmp_path):
    (tmp_path / "logs").mkdir()
    line = _cli_error([str(tmp_path / "logs")], tmp_path)
    assert "no frame logs there" in line


def test_cli_unreadable_and_foreign_files(tmp_path, known):
    """Local paths are checked before Spark starts: these fail in a moment."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "proxy-h-1-20261118T193320Z-000001.parquet").write_bytes(b"not parquet at all")
    line = _cli_error([str(logs)], tmp_path)
    assert "proxy-h-1-20261118T193320Z-000001.parquet: unreadable" in line
    shutil.rmtree(logs)
    logs.mkdir()
    pq.write_table(pa.table({"a": [1]}), str(logs / "other.parquet"))
    line = _cli_error([str(logs)], tmp_path)
    assert "other.parquet: not a frame log" in line


@pytest.mark.slow
def test_cli_error_found_through_hadoop(tmp_path):
    """A glob goes through Hadoop's file system API with Spark running: still one line."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "notes.txt").write_text("x")
    line = _cli_error([f"file://{tmp_path}/lo*s"], tmp_path)
    assert line.endswith("/lo*s: no frame logs there (files named *.parquet or *.jsonl; "
                         "names starting with '.' are unfinished and skipped)")


def test_cli_bad_arguments_exit_2():
    r = frametap("analyze", "/tmp", "--out", "/tmp/x", "--slowest", "0")
    assert r.returncode == 2 and "--slowest" in r.stderr
    r = frametap("analyze", "/tmp", "--out", "/tmp/x", "--conf", "novalue")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr and "Traceback" not in r.stderr
    r = frametap("analyze", "/tmp")
    assert r.returncode == 2 and "--out" in r.stderr


# ---- the report in a browser --------------------------------------------------------------

def test_report_renders_in_chromium(analysed, tmp_path):
    """Every chart the page lists is drawn with data, nothing is fetched from the
    network, and the console stays clean; the screenshot is kept as an artifact."""
    from tests.test_analyze_report import check_report_in_chromium
    out, result, _ = analysed
    shot = check_report_in_chromium(os.path.join(out, "report.html"), tmp_path,
                                    expect_charts=["opcode", "errors-by-status", "latency",
                                                   "throughput", "p99", "errors", "problems",
                                                   "decomposition"])
    assert os.path.getsize(shot) > 50_000


# ---- cut-offs, legs, errors, run files (issue 20) -------------------------------------------

def test_cut_offs_are_counted_apart_from_timeouts(analysed):
    """A request whose connection closed first (event status "closed") is a cut-off:
    in summary.csv's last column, never in ``timeouts``, never an answer."""
    out, result, oracle = analysed
    got = {(r["source"], opt(r["route"]), r["opcode"]): r
           for r in read_csv(os.path.join(out, "summary.csv"))}
    fetch, publish = got[("proxy", "fly", "FETCH")], got[("proxy", "stream", "Publish")]
    assert (int(fetch["timeouts"]), int(fetch["cut_off"])) == (10, 4)
    assert (int(publish["timeouts"]), int(publish["cut_off"])) == (0, 6)
    assert int(fetch["responses"]) == 190 and int(fetch["requests"]) == 204
    assert all(int(r["cut_off"]) == 0 for k, r in got.items()
               if k not in (("proxy", "fly", "FETCH"), ("proxy", "stream", "Publish")))
    totals = {(t["source"], t["protocol"], t["leg"]): t for t in result.tables["totals"]}
    assert totals[("proxy", None, "c2s")]["cut_off"] == 10
    assert totals[("proxy", None, "c2s")]["timeouts"] == 10
    assert totals[("proxy", "flymq", "c2s")]["cut_off"] == 4


def test_legs_count_each_direction_of_a_request_apart(analysed):
    """A fleximq REQ crosses the proxy twice (requester -> broker, broker -> responder):
    the summary counts both, legs.csv each leg with its own latencies."""
    out, result, oracle = analysed
    expected = oracle.legs()
    rows = {(r["source"], r["protocol"], r["opcode"], r["leg"]): r
            for r in read_csv(os.path.join(out, "legs.csv"))}
    assert set(rows) == set(expected)
    c2s, s2c = rows[("proxy", "fleximq", "REQ", "c2s")], rows[("proxy", "fleximq", "REQ", "s2c")]
    assert (int(c2s["requests"]), int(c2s["responses"]), int(c2s["errors"])) == (50, 50, 2)
    assert (int(s2c["requests"]), int(s2c["responses"]), int(s2c["errors"])) == (50, 50, 0)
    client = rows[("client", "fleximq", "REQ", "c2s")]
    assert int(client["requests"]) == 50
    for key, e in expected.items():
        r = rows[key]
        for col in ("requests", "responses", "errors", "timeouts", "cut_off"):
            assert int(r[col]) == e[col], (key, col)
        if e["lats"]:
            assert_rank_close(e["lats"], 0.5, float(r["p50_ms"]), f"{key} p50")
            assert_rank_close(e["lats"], 0.99, float(r["p99_ms"]), f"{key} p99")
        else:
            assert r["p50_ms"] == "", key
    # the requester's leg waited for the responder's: its p50 is the longer one
    assert float(c2s["p50_ms"]) > float(s2c["p50_ms"])


def test_errors_by_status(analysed):
    out, result, oracle = analysed
    rows = read_csv(os.path.join(out, "errors.csv"))
    got = {(r["source"], opt(r["route"]), r["protocol"], r["opcode"], r["status"]):
           int(r["errors"]) for r in rows}
    assert got == oracle.errors()
    assert got[("proxy", "fly", "flymq", "PRODUCE", "ERROR")] == 50
    assert got[("proxy", "flex", "fleximq", "REQ", "600")] == 2
    assert got[("client", "flex", "fleximq", "REQ", "600")] == 2


def test_client_rows_are_named_by_the_proxys_route(analysed):
    """A client row's route is the address it connected to; the proxy's run file says
    which route listens there (0.0.0.0:7001 takes 127.0.0.1:7001)."""
    out, result, _ = analysed
    routes = {(r["source"], opt(r["route"]), r["opcode"])
              for r in read_csv(os.path.join(out, "summary.csv")) if r["protocol"] == "fleximq"}
    assert routes == {("proxy", "flex", "REQ"), ("client", "flex", "REQ")}
    series = {(r["source"], r["route"]) for r in result.tables["series"]}
    assert ("client", "flex") in series and ("client", FLEX_TARGET) not in series


def test_run_files_reach_the_report(analysed):
    out, result, _ = analysed
    assert result.meta["run_files"] == 2
    runs = result.tables["runs"]
    assert [r["name"] for r in runs.routes()] == ["fly", "stream", "flex"]
    assert runs.locust_stats()[("flymq", "PRODUCE")]["requests"] == 505
    # Locust's messages that differ in a number are one row
    assert runs.locust_errors()[0]["error"] == "FlyMQServerError('no such topic N')"
    page = open(os.path.join(out, "report.html")).read()
    assert "12 users, spawn rate 4/s, run time 60 s" in page
    assert "each REQ crosses the proxy twice" in page


def test_opcode_series_per_leg(analysed):
    out, result, oracle = analysed
    per = {}
    for r in result.tables["op_series"]:
        key = (r["source"], r["protocol"], r["opcode"], r["leg"])
        per[key] = per.get(key, 0) + r["requests"]
    expected = {k: g["requests"] for k, g in oracle.legs().items() if g["requests"]}
    assert {k: v for k, v in per.items() if v} == expected


def test_an_unreadable_run_file_is_skipped_with_a_line(spark, known, tmp_path):
    from loadgen.analysis.job import analyze
    logs = tmp_path / "logs"
    logs.mkdir()
    write_parquet(str(logs / "proxy-h-1-20261118T193320Z-000001.parquet"), known[1]["stream"])
    (logs / "run-proxy-h-1-20261118T193320Z.json").write_text('{"source": "proxy", "pro')
    said = []
    result = analyze(spark, [str(logs)], str(tmp_path / "out"), warn=said.append)
    assert result.meta["run_files"] == 0
    assert len(said) == 1 and said[0].startswith("analyze: run file ") and \
        "run-proxy-h-1-20261118T193320Z.json ignored" in said[0]


# ---- one line for every start-up and input failure --------------------------------------

def _one_line(r):
    """The command failed as a user error: exit 2 and exactly one line on stderr."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("frametap: error: "), r.stderr
    return lines[0]


def test_bad_master_is_one_line(tmp_path, known):
    r = frametap("analyze", known[0], "--out", str(tmp_path / "out"), "--master", "bogus://x",
                 "--quiet", timeout=60)
    assert _one_line(r) == ("frametap: error: --master bogus://x: expected local[*], local[N], "
                            "spark://HOST:PORT, yarn or k8s://https://HOST:PORT")


def test_unreachable_master_is_one_line_at_once(tmp_path, known):
    require_java()
    import time
    started = time.monotonic()
    r = frametap("analyze", known[0], "--out", str(tmp_path / "out"), "--master",
                 "spark://unreachable.invalid:7077", "--quiet", timeout=60)
    line = _one_line(r)
    assert line.startswith("frametap: error: --master spark://unreachable.invalid:7077: "
                           "cannot reach the Spark master: unreachable.invalid: unknown host")
    with socket.socket() as s:                     # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = frametap("analyze", known[0], "--out", str(tmp_path / "out"), "--master",
                 f"spark://127.0.0.1:{port}", "--quiet", timeout=60)
    assert _one_line(r) == (f"frametap: error: --master spark://127.0.0.1:{port}: cannot reach "
                            f"the Spark master: 127.0.0.1:{port}: connection refused")
    assert time.monotonic() - started < 30          # no JVM was started for either


def test_a_master_that_never_answers_is_given_up_on(tmp_path, known, java):
    """Something listens but is no Spark master (it takes the connection and says
    nothing): --connect-timeout bounds the wait, then one line."""
    import threading
    import time
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    try:
        started = time.monotonic()
        r = frametap("analyze", known[0], "--out", str(tmp_path / "out"), "--master",
                     f"spark://127.0.0.1:{port}", "--connect-timeout", "4", "--quiet",
                     timeout=120)
        took = time.monotonic() - started
    finally:
        stop.set()
        thread.join(5)
        for c in held:
            c.close()
        server.close()
    assert _one_line(r).startswith(
        f"frametap: error: --master spark://127.0.0.1:{port}: the master did not accept this "
        "application within 4 s (--connect-timeout)")
    assert took < 60                                # JVM start-up + 4 s, not Spark's minute


def test_connect_timeout_must_be_positive():
    r = frametap("analyze", "/tmp", "--out", "/tmp/x", "--connect-timeout", "0")
    assert r.returncode == 2 and "--connect-timeout" in r.stderr and "Traceback" not in r.stderr


def corrupt_pages(path, rows, seed):
    """A frame log whose footer is intact and whose data pages are not: 50 bytes of
    the data overwritten (the seeds used here break a page Spark reads, in a way whose
    error names no file)."""
    write_parquet(path, rows, 4000)
    data = bytearray(open(path, "rb").read())
    rng = random.Random(seed)
    end = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    i = rng.randrange(4, end - 50)
    data[i:i + 50] = rng.randbytes(50)
    with open(path, "wb") as f:
        f.write(bytes(data))
    pq.ParquetFile(path)                           # the footer still reads


@pytest.mark.parametrize("seed", [2, 10])
def test_corrupt_pages_behind_a_valid_footer_are_named(tmp_path, known, java, seed):
    """Spark fails deep in its Parquet reader (an index out of bounds, no file name):
    the command finds the file that does not decode and names it, in one line."""
    logs = tmp_path / "logs"
    logs.mkdir()
    bad = logs / "proxy-h-1-20261118T193320Z-000001.parquet"
    corrupt_pages(str(bad), known[1]["bulk"][:20000], seed)
    write_parquet(str(logs / "proxy-h-1-20261118T193320Z-000002.parquet"), known[1]["stream"])
    r = frametap("analyze", str(logs), "--out", str(tmp_path / "out"), "--quiet")
    line = _one_line(r)
    assert line.startswith(f"frametap: error: cannot read {bad}: ")
    assert "Traceback" not in r.stderr


def test_spark_failure_names_the_undecodable_file(spark, known, tmp_path):
    """The same rule without the CLI: a task failure that names no file."""
    from loadgen.analysis import inputs
    from loadgen.analysis.job import JobFailed, _spark_failure
    logs = tmp_path / "logs"
    logs.mkdir()
    good = logs / "proxy-h-1-20261118T193320Z-000002.parquet"
    write_parquet(str(good), known[1]["stream"])
    found = inputs.find_local([str(logs)])

    class Failure(Exception):
        pass
    text = ("An error occurred while calling o1.collectToPython.\n: org.apache.spark."
            "SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 "
            "times, most recent failure: Lost task 0.0 in stage 3.0 (TID 3) (10.0.0.1 executor "
            "driver): java.lang.ArrayIndexOutOfBoundsException: Index 4024 out of bounds for "
            "length 4000\n\tat org.apache.spark.sql...")
    assert isinstance(_spark_failure(Failure(text), spark, found), JobFailed)   # all fine
    bad = logs / "proxy-h-1-20261118T193320Z-000001.parquet"
    corrupt_pages(str(bad), known[1]["bulk"][:20000], 2)
    found = inputs.find_local([str(logs)])
    err = _spark_failure(Failure(text), spark, found)
    assert isinstance(err, AnalysisError) and str(err).startswith(f"cannot read {bad}: ")
    # out of memory is Spark's trouble, not the file's: no hunt for a culprit
    oom = text.replace("java.lang.ArrayIndexOutOfBoundsException", "java.lang.OutOfMemoryError")
    assert isinstance(_spark_failure(Failure(oom), spark, found), JobFailed)
