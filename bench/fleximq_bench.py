"""fleximq through the proxy against the pass-through baseline, same run.

Builds ``bench/fxload.c`` (a fleximq backend that answers every REQ with a REP, and a
pipelined load client), pins the backend and the client to cpu 1 and each proxy in turn
to cpu 0, alternating the order between repeats so drift hits both alike:

    16 connections x 32 REQs in flight, ~100-byte MessagePack headers, 256-byte payloads
    target: frametap (route protocol fleximq) / pass-through requests per second >= 0.85

After every frametap run the admin /metrics must show at least as many c2s REQ frames and
REQ responses as the client completed (the parser saw every frame).  Results go to
bench/results/fleximq.json.

    python bench/fleximq_bench.py            # 3 repeats x 5 s
    python bench/fleximq_bench.py --quick    # 1 repeat x 2 s
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import run_bench as rb  # noqa: E402  (the shared helpers: pinning, ports, metrics)

TARGET = 0.85
CONNS, DEPTH, SIZE = 16, 32, 256


def build(workdir: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise rb.BenchError("no C compiler (gcc) to build bench/fxload.c")
    exe = workdir / "fxload"
    res = subprocess.run([gcc, "-O2", "-std=gnu99", "-Wall", "-o", str(exe),
                          str(BENCH_DIR / "fxload.c")], capture_output=True, text=True)
    if res.returncode:
        raise rb.BenchError("building fxload failed:\n" + res.stderr)
    return exe


def start_proxy(which: str, upstream: int, logdir: Path):
    listen = rb.free_port()
    admin = None
    if which == rb.PASSTHROUGH:
        argv = [sys.executable, str(BENCH_DIR / "passthrough.py"), "--listen",
                f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{upstream}"]
    else:
        admin = rb.free_port()
        argv = [sys.executable, "-m", "proxy", "proxy", "--protocol", "fleximq", "--listen",
                f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{upstream}",
                "--admin", f"127.0.0.1:{admin}", "--log-level", "warning"]
    logfile = logdir / f"{which}-{listen}.log"
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(rb.pinned(rb.PROXY_CPU, argv), cwd=BENCH_DIR.parent,
                                stdout=out, stderr=subprocess.STDOUT, env=rb.frametap_env())
    rb.wait_port(listen, proc, 20, which, logfile)
    if admin is not None:
        rb.wait_ready(f"http://127.0.0.1:{admin}/readyz", proc, 20, logfile)
    return proc, listen, admin


def one_run(exe: Path, which: str, upstream: int, seconds: int, logdir: Path) -> dict:
    proc, port, admin = start_proxy(which, upstream, logdir)
    try:
        cpu0 = rb.proc_cpu_seconds(proc.pid)
        res = subprocess.run(rb.pinned(rb.LOAD_CPU, [
            str(exe), "client", "--port", str(port), "--conns", str(CONNS), "--depth",
            str(DEPTH), "--size", str(SIZE), "--seconds", str(seconds), "--warmup", "1"]),
            capture_output=True, text=True, timeout=seconds + 60)
        result = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
        cpu1 = rb.proc_cpu_seconds(proc.pid)
        if cpu0 is not None and cpu1 is not None and result["requests"]:
            # proxy CPU per request over the whole run (warmup included: an upper bound);
            # steadier than throughput on a shared machine
            total = result["requests"] * (seconds + 1) / seconds
            result["proxy_cpu_us_per_req"] = round(1e6 * (cpu1 - cpu0) / total, 3)
        if admin is not None:
            _, text = rb.http_get(f"http://127.0.0.1:{admin}/metrics")
            frames = rb.metric_sum(text, "frametap_frames_total", direction="c2s",
                                   opcode="REQ", protocol="fleximq") or 0
            answered = rb.metric_sum(text, "frametap_responses_total", opcode="REQ",
                                     status="200", protocol="fleximq") or 0
            errors = rb.metric_sum(text, "frametap_protocol_errors_total") or 0
            result.update(proxy_req_frames=frames, proxy_req_answered=answered,
                          proxy_errors=errors,
                          parser_saw_all=frames >= result["requests"] and errors == 0)
    finally:
        rb.stop(proc)
    result["proxy"] = which
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat x 2 s (smoke check)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    args = ap.parse_args(argv)
    repeats, seconds = (1, 2) if args.quick else (args.repeats, args.seconds)
    workdir = Path(tempfile.mkdtemp(prefix="fxbench-"))
    try:
        exe = build(workdir)
        port = rb.free_port()
        server = subprocess.Popen(rb.pinned(rb.LOAD_CPU, [str(exe), "server", "--port",
                                                          str(port)]))
        try:
            rb.wait_port(port, server, 10, "fxload server", workdir / "server.log")
            runs = []
            for rep in range(repeats):
                order = [rb.PASSTHROUGH, rb.FRAMETAP]
                if rep % 2:
                    order.reverse()
                for which in order:
                    r = one_run(exe, which, port, seconds, workdir)
                    runs.append(r)
                    print(f"[fleximq] rep {rep + 1}/{repeats} {which:12s} {r['rps']:>11,.0f} "
                          f"req/s  p50 {r['p50_us']} us  p99 {r['p99_us']} us  proxy cpu "
                          f"{r.get('proxy_cpu_us_per_req', 0):.2f} us/req", flush=True)
        finally:
            rb.stop(server)
    except rb.BenchError as exc:
        print(f"fleximq bench: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    pt = rb.median([r["rps"] for r in runs if r["proxy"] == rb.PASSTHROUGH])
    ft = rb.median([r["rps"] for r in runs if r["proxy"] == rb.FRAMETAP])
    ratio = ft / pt if pt else 0.0
    cpu = {w: rb.median([r["proxy_cpu_us_per_req"] for r in runs if r["proxy"] == w
                         and "proxy_cpu_us_per_req" in r] or [0.0])
           for w in (rb.PASSTHROUGH, rb.FRAMETAP)}
    saw_all = all(r.get("parser_saw_all") for r in runs if r["proxy"] == rb.FRAMETAP)
    ok = ratio >= TARGET and saw_all
    print(f"[fleximq] REQ/REP {CONNS} conns x {DEPTH} deep, {SIZE} B payloads: frametap "
          f"{ft:,.0f} req/s, pass-through {pt:,.0f} req/s, ratio {ratio:.3f} "
          f"(target >= {TARGET}): {'PASS' if ratio >= TARGET else 'FAIL'}; parser saw every "
          f"frame: {'yes' if saw_all else 'NO'}")
    print(f"[fleximq] proxy CPU per request: frametap {cpu[rb.FRAMETAP]:.2f} us, pass-through "
          f"{cpu[rb.PASSTHROUGH]:.2f} us (ratio "
          f"{cpu[rb.PASSTHROUGH] / cpu[rb.FRAMETAP] if cpu[rb.FRAMETAP] else 0:.3f})")
    rb.RESULTS_DIR.mkdir(exist_ok=True)
    (rb.RESULTS_DIR / "fleximq.json").write_text(json.dumps(
        {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ratio": ratio,
         "target": TARGET, "frametap_rps": ft, "passthrough_rps": pt,
         "proxy_cpu_us_per_req": cpu, "runs": runs},
        indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
