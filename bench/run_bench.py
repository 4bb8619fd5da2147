"""frametap FlyMQ benchmark: the proxy against a pass-through baseline, same run.

Builds ``bench/flyload.c`` (FlyMQ backend + load client), starts the backend
pinned to cpu 1, then for every scenario runs each proxy in turn (pinned to
cpu 0) with the load client on cpu 1, repeating and alternating the order so
drift on a noisy machine hits both sides alike:

  a  64 B payloads, 16 conns x 32 deep   throughput   frametap/pass-through rps >= 0.95
  d  1 KiB payloads, 16 conns x 16 deep  throughput   frametap/pass-through rps >= 0.95
  b  16 KiB payloads, 8 conns x 8 deep   throughput   frametap/pass-through rps >= 0.95
  e  1 MiB payloads, 4 conns x 2 deep    throughput   frametap/pass-through rps >= 0.95
  c  64 B payloads, 1 conn x 1 deep      latency      frametap/pass-through p50, p99 <= 1.10

After every frametap run it scrapes the admin /metrics endpoint and checks that
``frametap_frames_total{direction="c2s",opcode="PRODUCE"}`` is at least the
number of requests the client completed: the parser saw every frame.  It also
reads the proxy's CPU seconds (/proc/PID/stat) over the load plus a 1.5 s settle
(so the frame-log writer's backlog counts) and reports CPU ns per relayed request;
the frame-log ratios are printed both by rps (the target) and by that CPU cost,
which other work on the machine disturbs far less.

Scenario a also runs four variants of frametap against plain frametap: ``framelog``
and ``framelog1pct`` (a frame log of every / 1% of connections), ``framelog0`` (every
frame recorded, the writer discarding the rows: bench/discard_writer.py; it splits the
frame log's cost into the loop's own recording and what the writer's work costs the
loop on a shared core) and ``armed`` (one fault rule armed on an opcode the load never
sends: the cost of checking every frame's opcode, issue 22's target >= 0.90).

Each target is judged on the ratio of the two sides' medians. Beside it, as
information, the median of the per-repeat ratios ("paired by repeat"): the two rounds
of a repeat run back to back, so a machine that drifts between speeds moves both
alike; when the two figures disagree, the machine drifted during the run.

Results go to bench/results/latest.json (and a bar chart PNG when matplotlib
is importable).  Also runs bench/parser_bench.py unless --skip-parser.

    python bench/run_bench.py                 # 3 repeats x 5 s per run
    python bench/run_bench.py --quick         # 1 repeat x 2 s, for a smoke check
    python bench/run_bench.py --proxies passthrough --scenarios a,c
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from discard_writer import discarded

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

PROXY_CPU = "0"
LOAD_CPU = "1"  # flyload server and client share the other core

PASSTHROUGH = "passthrough"
FRAMETAP = "frametap"
PREVIOUS = "previous"      # frametap from another checkout (--previous DIR), the before build
PREVIOUS_TOLERANCE = 0.03  # a change to the hot path may cost at most 3% against it
FRAMELOG = "framelog"      # frametap writing a Parquet frame log of every connection
FRAMELOG_SAMPLED = "framelog1pct"   # ... of 1% of connections ([framelog] sample = 0.01)
FRAMELOG_DISCARD = "framelog0"      # ... of every connection, its writer discarding the rows
ARMED = "armed"            # frametap with one fault rule armed that never fires (issue 22)
ARMED_TARGET = 0.90        # ... at >= 0.90x plain frametap's rps (scenario "a" only)
SETTLE_S = 1.5             # after the load: the frame-log writer's flush interval is 1 s
#: frame-log variants: (sample, min rps ratio against plain frametap, scenario "a" only)
#: full logging on one core (the proxy pinned to one cpu, writer and loop sharing it) is
#: reported and must not fall below 0.5; its figure with a second core is FRAMELOG_TWO_CORE
FRAMELOG_TARGETS = {FRAMELOG: (1.0, 0.50), FRAMELOG_SAMPLED: (0.01, 0.95)}
#: the event loop's CPU per request without / with full logging (the writer on its own core)
FRAMELOG_TWO_CORE = {FRAMELOG: 0.85}
#: the variants measured in scenario "a" only, against plain frametap
A_ONLY = {*FRAMELOG_TARGETS, FRAMELOG_DISCARD, ARMED}


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    conns: int
    depth: int
    size: int
    kind: str  # "throughput" (compare rps) or "latency" (compare p50/p99)
    target: float  # throughput: min ratio; latency: max ratio


SCENARIOS = [
    Scenario("a", "64 B, 16 conns x 32 deep", 16, 32, 64, "throughput", 0.95),
    Scenario("d", "1 KiB, 16 conns x 16 deep", 16, 16, 1024, "throughput", 0.95),
    Scenario("b", "16 KiB, 8 conns x 8 deep", 8, 8, 16 * 1024, "throughput", 0.95),
    Scenario("e", "1 MiB, 4 conns x 2 deep", 4, 2, 1024 * 1024, "throughput", 0.95),
    Scenario("c", "64 B, 1 conn x 1 deep", 1, 1, 64, "latency", 1.10),
]


class BenchError(RuntimeError):
    """Setup failed: say what and how to fix it, then stop."""


# --------------------------------------------------------------------------- helpers


def log(msg: str = "") -> None:
    print(msg, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cpu: str, argv: list[str]) -> list[str]:
    if shutil.which("taskset") is None:
        return argv
    return ["taskset", "-c", cpu, *argv]


def wait_port(port: int, proc: subprocess.Popen, timeout: float, what: str, logfile: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with code {proc.returncode} before listening on "
                             f"127.0.0.1:{port}\n{tail(logfile)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"{what} did not accept on 127.0.0.1:{port} within {timeout:.0f}s\n{tail(logfile)}")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def wait_ready(url: str, proc: subprocess.Popen, timeout: float, logfile: Path) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"frametap exited with code {proc.returncode}\n{tail(logfile)}")
        try:
            status, _ = http_get(url, timeout=1.0)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise BenchError(f"{url} not 200 within {timeout:.0f}s (last: {last})\n{tail(logfile)}")


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    | " + line for line in text[-lines:])


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proc_cpu_seconds(pid: int) -> float | None:
    """utime+stime of a process from /proc (None when unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def thread_cpu_seconds(pid: int) -> dict:
    """{tid: utime+stime} of every thread of a process (empty when unavailable)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return out


def split_cpu(pid: int, before: dict, after: dict) -> tuple[float, float]:
    """(event-loop thread, every other thread) CPU seconds between two readings: in
    frametap the other threads are the frame-log writer (libuv's workers stay idle)."""
    loop = after.get(pid, 0.0) - before.get(pid, 0.0)
    rest = sum(v - before.get(tid, 0.0) for tid, v in after.items() if tid != pid)
    return loop, rest


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_sum(text: str, name: str, **labels: str) -> float | None:
    """Sum of samples of ``name`` whose labels include ``labels`` (None if none)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        have = dict(_LABEL.findall(m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
            found = True
    return total if found else None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --------------------------------------------------------------------------- setup


def build_flyload(workdir: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BenchError("no C compiler (gcc) on PATH: apt-get install gcc")
    exe = workdir / "flyload"
    res = subprocess.run([gcc, "-O2", "-std=c99", "-Wall", "-o", str(exe), str(BENCH_DIR / "flyload.c")],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise BenchError(f"building flyload failed:\n{res.stderr}")
    return exe


def frametap_env() -> dict:
    """The environment for frametap: never the pure-Python switch."""
    env = dict(os.environ)
    env.pop("FRAMETAP_NO_EXTENSIONS", None)
    return env


def locate_frametap() -> tuple[Path, str]:
    """Find a working directory from which ``python -m proxy`` imports frametap.

    Prefers an installed frametap (run from a neutral directory, so the source
    tree cannot shadow a compiled install); falls back to the repo root for an
    in-place build.  Returns (cwd, where the framing core and FlyMQ parser come from).
    """
    probe = ("import sys, proxy.framing as f, proxy.protocols.flymq as p; "
             "print(sys.modules[f.RouteStats.__module__].__file__, "
             "sys.modules[p.FlyMQParser.__module__].__file__)")
    errors = []
    for cwd in (Path(tempfile.gettempdir()), REPO_DIR):
        res = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True,
                             env=frametap_env())
        if res.returncode == 0:
            return cwd, res.stdout.strip()
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "?"
        errors.append(f"  from {cwd}: {last}")
    raise BenchError(
        "frametap is not importable with " + sys.executable + ":\n" + "\n".join(errors) + "\n"
        "Build/install it first (e.g. `pip install -e .` in the repo), run this script with that "
        "environment's python (e.g. .venv/bin/python), or pass --proxies passthrough to measure "
        "the baseline only."
    )


# --------------------------------------------------------------------------- one run


@dataclass
class Env:
    flyload: Path
    server_port: int
    server_pid: int
    seconds: float
    warmup: float
    logdir: Path
    frametap_cwd: Path | None
    previous_dir: Path | None = None
    proxy_cpus: str = PROXY_CPU
    framelog_format: str = "parquet"


def start_proxy(env: Env, which: str, run_id: str) -> tuple[subprocess.Popen, int, int | None, Path]:
    listen = free_port()
    logfile = env.logdir / f"{run_id}-{which}.log"
    out = open(logfile, "wb")
    admin = None
    if which == PASSTHROUGH:
        argv = [sys.executable, str(BENCH_DIR / "passthrough.py"),
                "--listen", f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{env.server_port}"]
        cwd = BENCH_DIR
    elif which == ARMED or which in FRAMELOG_TARGETS or which == FRAMELOG_DISCARD:
        admin = free_port()
        before, after = "", ""
        if which == ARMED:
            # a delay rule on CONSUME, which the load never sends: the direction is armed
            # (every frame's opcode is checked at its header) and nothing fires
            after = ('[[routes.faults]]\nname = "never"\nmatch = {opcode = ["CONSUME"]}\n'
                     'action = {type = "delay", ms = 10}\n')
        else:
            logs = env.logdir / f"{run_id}-{which}-framelogs"
            before = (f'[framelog]\ndir = "{logs}"\nformat = "{env.framelog_format}"\n'
                      f'sample = {FRAMELOG_TARGETS.get(which, (1.0,))[0]}\n')
        cfg = env.logdir / f"{run_id}-{which}.toml"
        cfg.write_text(f'[admin]\nlisten = "127.0.0.1:{admin}"\n{before}[[routes]]\n'
                       f'name = "flymq"\nprotocol = "flymq"\nlisten = "127.0.0.1:{listen}"\n'
                       f'upstream = "127.0.0.1:{env.server_port}"\n{after}')
        argv = [sys.executable, "-m", "proxy", "proxy", "-c", str(cfg)]
        if which == FRAMELOG_DISCARD:
            argv[1:3] = [str(BENCH_DIR / "discard_writer.py")]
        cwd = env.frametap_cwd
    else:
        admin = free_port()
        argv = [sys.executable, "-m", "proxy", "proxy", "--protocol", "flymq",
                "--listen", f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{env.server_port}",
                "--admin", f"127.0.0.1:{admin}"]
        cwd = env.frametap_cwd
    penv = frametap_env()
    if which == PREVIOUS:
        cwd = env.previous_dir
        penv["PYTHONPATH"] = str(env.previous_dir)
    proc = subprocess.Popen(pinned(env.proxy_cpus, argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                            env=penv)
    out.close()
    try:
        wait_port(listen, proc, 20, which, logfile)
        if admin is not None:
            wait_ready(f"http://127.0.0.1:{admin}/readyz", proc, 20, logfile)
    except BaseException:
        stop(proc)
        raise
    return proc, listen, admin, logfile


def run_client(env: Env, sc: Scenario, port: int) -> dict:
    argv = [str(env.flyload), "client", "--host", "127.0.0.1", "--port", str(port),
            "--conns", str(sc.conns), "--depth", str(sc.depth), "--size", str(sc.size),
            "--seconds", str(env.seconds), "--warmup", str(env.warmup)]
    try:
        res = subprocess.run(pinned(LOAD_CPU, argv), capture_output=True, text=True,
                             timeout=env.seconds + env.warmup + 60)
    except subprocess.TimeoutExpired:
        raise BenchError(f"flyload client did not finish (scenario {sc.key})") from None
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise BenchError(f"flyload client printed no result (exit {res.returncode}):\n{res.stderr}")
    result = json.loads(lines[-1])
    if res.returncode != 0 or result.get("errors"):
        result["client_stderr"] = res.stderr.strip()[-2000:]
    return result


def one_run(env: Env, sc: Scenario, which: str, rep: int) -> dict:
    run_id = f"{sc.key}{rep}"
    proc, port, admin, logfile = start_proxy(env, which, run_id)
    try:
        threads0 = thread_cpu_seconds(proc.pid)
        cpu0, scpu0, t0 = proc_cpu_seconds(proc.pid), proc_cpu_seconds(env.server_pid), time.monotonic()
        result = run_client(env, sc, port)
        cpu1, scpu1, t1 = proc_cpu_seconds(proc.pid), proc_cpu_seconds(env.server_pid), time.monotonic()
        # over the whole client run, warmup included
        if cpu0 is not None and cpu1 is not None:
            result["proxy_cpu_pct"] = round(100.0 * (cpu1 - cpu0) / (t1 - t0), 1)
            if result.get("completed_total"):
                # every proxy alike (the pass-through too): CPU over the client's run per
                # request it completed, warm-up included; on a machine whose other core is
                # busy this moves far less than rps does
                result["run_cpu_ns_per_req"] = round(
                    (cpu1 - cpu0) / result["completed_total"] * 1e9, 1)
        if scpu0 is not None and scpu1 is not None:
            result["server_cpu_pct"] = round(100.0 * (scpu1 - scpu0) / (t1 - t0), 1)
        if proc.poll() is not None:
            raise BenchError(f"{which} died during the run (exit {proc.returncode})\n{tail(logfile)}")
        if admin is not None:
            # CPU per relayed request, the writer's backlog included: give the frame-log
            # writer time to empty its buffer (an idle proxy costs next to nothing), then
            # count the proxy's CPU over the load and the wait.  Unlike rps this hardly
            # moves when other work shares the proxy's core.
            time.sleep(SETTLE_S)
            cpu2 = proc_cpu_seconds(proc.pid)
            loop_s, other_s = split_cpu(proc.pid, threads0, thread_cpu_seconds(proc.pid))
            result.update(check_metrics(admin, result))
            if cpu0 is not None and cpu2 is not None and result.get("frames_c2s_produce"):
                result["proxy_cpu_s"] = round(cpu2 - cpu0, 3)
                result["proxy_cpu_ns_per_req"] = round(
                    (cpu2 - cpu0) / result["frames_c2s_produce"] * 1e9, 1)
                # where it went: the event loop (relay, parsers, the log's append) and the
                # other threads (the frame-log writer)
                result["loop_cpu_ns_per_req"] = round(loop_s / result["frames_c2s_produce"] * 1e9, 1)
                result["writer_cpu_s"] = round(other_s, 3)
    finally:
        stop(proc)
    if which == FRAMELOG_DISCARD:
        result["framelog_discarded"] = discarded(logfile.read_bytes()) or 0
        if not result["framelog_discarded"]:   # the loop did not record: no figure
            result["metrics_ok"] = False
            result["metrics_note"] = f"framelog0 recorded no rows (see {logfile})"
    if which in FRAMELOG_TARGETS:
        result.update(framelog_counts(env.logdir / f"{run_id}-{which}-framelogs", t1 - t0))
        if result.get("framelog_rows") and "writer_cpu_s" in result:
            result["writer_cpu_ns_per_row"] = round(
                result["writer_cpu_s"] / result["framelog_rows"] * 1e9, 1)
    result.update(proxy=which, scenario=sc.key, repeat=rep)
    return result


def framelog_counts(directory: Path, seconds: float) -> dict:
    """Rows the proxy wrote (read from the finished files after its SIGTERM flush)."""
    import pyarrow.parquet as pq
    files = sorted(directory.glob("*.parquet"))
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    for f in sorted(directory.glob("*.jsonl")):      # [framelog] format = "jsonl"
        with open(f, "rb") as fh:
            rows += sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 20), b""))
        files.append(f)
    size = sum(f.stat().st_size for f in files)
    shutil.rmtree(directory, ignore_errors=True)
    return {"framelog_rows": rows, "framelog_rows_per_s": round(rows / seconds),
            "framelog_mib": round(size / 2**20, 1)}


def check_metrics(admin: int, result: dict) -> dict:
    """The parser must have counted every request the client saw answered."""
    try:
        status, text = http_get(f"http://127.0.0.1:{admin}/metrics")
    except OSError as exc:
        return {"metrics_ok": False, "metrics_note": f"/metrics failed: {exc}"}
    if status != 200:
        return {"metrics_ok": False, "metrics_note": f"/metrics answered HTTP {status}"}
    frames = metric_sum(text, "frametap_frames_total", direction="c2s", opcode="PRODUCE")
    if frames is None:
        return {"metrics_ok": False,
                "metrics_note": 'no frametap_frames_total{direction="c2s",opcode="PRODUCE"} sample'}
    ok = frames >= result["requests"] and frames >= result.get("completed_total", 0)
    dropped = metric_sum(text, "frametap_framelog_dropped_total") or 0
    return {"frames_c2s_produce": int(frames), "metrics_ok": ok,
            "framelog_dropped": int(dropped)}


def progress_line(sc: Scenario, rep: int, repeats: int, r: dict) -> str:
    parts = [f"[{sc.key} {rep + 1}/{repeats}] {r['proxy']:<11}",
             f"rps={r['rps']:>11,.0f}", f"p50={r['p50_us']:>6}us", f"p99={r['p99_us']:>6}us",
             f"client_cpu={r['client_cpu_pct']:5.1f}%"]
    if "max_us" in r:
        parts.append(f"max={r['max_us'] / 1000:.1f}ms")
    if "proxy_cpu_pct" in r:
        parts.append(f"proxy_cpu={r['proxy_cpu_pct']:5.1f}%")
    if "proxy_cpu_ns_per_req" in r:
        parts.append(f"cpu/req={r['proxy_cpu_ns_per_req']:.0f}ns")
    if "framelog_rows" in r:
        parts.append(f"log={r['framelog_rows_per_s']:,}/s dropped={r.get('framelog_dropped', 0)}")
    if "server_cpu_pct" in r:
        parts.append(f"server_cpu={r['server_cpu_pct']:5.1f}%")
    if "frames_c2s_produce" in r:
        verdict = "ok" if r["metrics_ok"] else "TOO FEW"
        parts.append(f"frames_c2s={r['frames_c2s_produce']:,} (client {r['requests']:,}: {verdict})")
    elif "metrics_note" in r:
        parts.append(f"METRICS CHECK FAILED: {r['metrics_note']}")
    if r.get("errors"):
        parts.append(f"CLIENT ERRORS={r['errors']}")
    return "  ".join(parts)


# --------------------------------------------------------------------------- summary


def spread(p: dict, key: str, runs: list[dict] | None = None, name: str = "") -> tuple:
    """(min, max) of one figure over a proxy's runs."""
    vals = ([r.get(key) for r in runs if r["proxy"] == name] if runs is not None
            else p.get(key, []))
    vals = [v for v in vals if v]
    return (min(vals), max(vals)) if vals else (None, None)


def paired(runs: list[dict], top: str, bottom: str, key: str = "rps") -> list[float]:
    """top/bottom per repeat: the two rounds of a repeat run back to back (ABBA order),
    so the machine's slow drifts (this one switches between two speeds for seconds at a
    time) cancel in each pair, where a ratio of medians may set a fast round of one
    against a slow round of the other."""
    by = {(r["proxy"], r.get("repeat")): r.get(key) for r in runs}
    return [t / b for k in sorted({r.get("repeat") for r in runs if r["proxy"] == top},
                                   key=lambda v: (v is None, v))
            if (t := by.get((top, k))) and (b := by.get((bottom, k)))]


def summarize(sc: Scenario, runs: list[dict], proxies: list[str]) -> dict:
    out: dict = {"scenario": sc.key, "title": sc.title, "kind": sc.kind, "target": sc.target,
                 "conns": sc.conns, "depth": sc.depth, "size": sc.size, "proxies": {}}
    for which in proxies:
        mine = [r for r in runs if r["proxy"] == which]
        out["proxies"][which] = {
            "runs": len(mine),
            "rps": [r["rps"] for r in mine],
            "p50_us": [r["p50_us"] for r in mine],
            "p99_us": [r["p99_us"] for r in mine],
            "client_cpu_pct": [r["client_cpu_pct"] for r in mine],
            "proxy_cpu_pct": [r.get("proxy_cpu_pct") for r in mine],
            "server_cpu_pct": [r.get("server_cpu_pct") for r in mine],
            "median_rps": median([r["rps"] for r in mine]),
            "median_p50_us": median([r["p50_us"] for r in mine]),
            "median_p99_us": median([r["p99_us"] for r in mine]),
            "max_us": [r.get("max_us") for r in mine],
            "median_max_us": median([r["max_us"] for r in mine if r.get("max_us") is not None]
                                    or [0]),
            "median_client_cpu_pct": median([r["client_cpu_pct"] for r in mine]),
            "cpu_ns_per_req": [r.get("proxy_cpu_ns_per_req") for r in mine],
            "run_cpu_ns_per_req": [r.get("run_cpu_ns_per_req") for r in mine],
            "median_run_cpu_ns_per_req": median([r["run_cpu_ns_per_req"] for r in mine
                                                 if r.get("run_cpu_ns_per_req")] or [0]),
            "median_cpu_ns_per_req": median([r["proxy_cpu_ns_per_req"] for r in mine
                                             if r.get("proxy_cpu_ns_per_req")]),
            "metrics_ok": all(r.get("metrics_ok", True) for r in mine),
            "client_errors": sum(r.get("errors", 0) for r in mine),
        }
    if PASSTHROUGH in out["proxies"] and FRAMETAP in out["proxies"]:
        base, ft = out["proxies"][PASSTHROUGH], out["proxies"][FRAMETAP]
        checks = {}
        if sc.kind == "throughput":
            ratio = ft["median_rps"] / base["median_rps"] if base["median_rps"] else float("nan")
            checks["rps"] = {"ratio": ratio, "target": f">= {sc.target}", "pass": ratio >= sc.target,
                             "paired": paired(runs, FRAMETAP, PASSTHROUGH)}
        else:
            for key in ("p50_us", "p99_us"):
                b = base["median_" + key]
                ratio = ft["median_" + key] / b if b else float("nan")
                checks[key] = {"ratio": ratio, "target": f"<= {sc.target}", "pass": ratio <= sc.target,
                               "paired": paired(runs, FRAMETAP, PASSTHROUGH, key)}
        if sc.kind == "throughput" and ft["median_run_cpu_ns_per_req"] and \
                base["median_run_cpu_ns_per_req"]:
            checks["cpu"] = {
                "ratio": base["median_run_cpu_ns_per_req"] / ft["median_run_cpu_ns_per_req"],
                "pass": True, "spread": (spread(base, "run_cpu_ns_per_req"),
                                         spread(ft, "run_cpu_ns_per_req")),
                "target": "information: pass-through/frametap proxy CPU per request"}
        checks["metrics"] = {"pass": ft["metrics_ok"]}
        out["checks"] = checks
    for which, (_sample, target) in FRAMELOG_TARGETS.items():
        if which not in out["proxies"] or FRAMETAP not in out["proxies"] or sc.key != "a":
            continue
        fl, ft = out["proxies"][which], out["proxies"][FRAMETAP]
        mine = [r for r in runs if r["proxy"] == which]
        fl["median_framelog_rows_per_s"] = median([r.get("framelog_rows_per_s", 0) for r in mine])
        fl["framelog_dropped"] = sum(r.get("framelog_dropped", 0) for r in mine)
        fl["median_proxy_cpu_pct"] = median([r.get("proxy_cpu_pct") or 0 for r in mine])
        ratio = fl["median_rps"] / ft["median_rps"] if ft["median_rps"] else float("nan")
        out.setdefault("checks", {})[which + "_rps"] = {
            "ratio": ratio, "target": f">= {target}", "pass": ratio >= target,
            "spread": (min(fl["rps"]), max(fl["rps"]))}
        # the same comparison by CPU per request: on a saturated core rps goes as its
        # inverse, and it is far less at the mercy of whatever else runs on the machine
        if ft.get("median_cpu_ns_per_req") and fl.get("median_cpu_ns_per_req"):
            fl["cpu_ratio"] = ft["median_cpu_ns_per_req"] / fl["median_cpu_ns_per_req"]
        rows_cpu = [r["framelog_rows"] / r["proxy_cpu_s"] for r in mine
                    if r.get("proxy_cpu_s") and r.get("framelog_rows")]
        fl["median_rows_per_cpu_s"] = median(rows_cpu) if rows_cpu else 0
        for who, name, key in ((fl, which, "loop_cpu_ns_per_req"),
                               (ft, FRAMETAP, "loop_cpu_ns_per_req"),
                               (fl, which, "writer_cpu_ns_per_row")):
            vals = [r[key] for r in runs if r["proxy"] == name and r.get(key)]
            who["median_" + key] = median(vals) if vals else None
        # The two-core figure: the writer thread is built to run beside the event loop
        # (pyarrow releases the GIL), so with a second core the loop's throughput goes as
        # the inverse of its own CPU per request (docs/design.md, "Performance principles")
        two_core = FRAMELOG_TWO_CORE.get(which)
        if two_core and fl.get("median_loop_cpu_ns_per_req") and \
                ft.get("median_loop_cpu_ns_per_req"):
            r2 = ft["median_loop_cpu_ns_per_req"] / fl["median_loop_cpu_ns_per_req"]
            out["checks"][which + "_two_core"] = {
                "ratio": r2, "target": f">= {two_core}", "pass": r2 >= two_core,
                "spread": (spread(ft, "loop_cpu_ns_per_req", runs, FRAMETAP),
                           spread(fl, "loop_cpu_ns_per_req", runs, which))}
    if FRAMELOG_DISCARD in out["proxies"] and FRAMETAP in out["proxies"] and sc.key == "a":
        # the frame log's cost split three ways: the loop's own recording (framelog0 against
        # frametap), what the writer's work costs the loop on its core (framelog against
        # framelog0: caches), and the writer's own CPU (framelog's writer thread)
        loops = {w: median(v) if (v := [r["loop_cpu_ns_per_req"] for r in runs
                                        if r["proxy"] == w and r.get("loop_cpu_ns_per_req")])
                 else None for w in (FRAMETAP, FRAMELOG_DISCARD, FRAMELOG)}
        if loops[FRAMETAP] and loops[FRAMELOG_DISCARD]:
            out.setdefault("checks", {})["framelog0_loop"] = {
                "ratio": loops[FRAMETAP] / loops[FRAMELOG_DISCARD], "pass": True,
                "target": "information: the event loop's own recording cost",
                "loop_ns": loops, "spread": spread(out["proxies"][FRAMELOG_DISCARD],
                                                   "loop_cpu_ns_per_req", runs, FRAMELOG_DISCARD)}
    if ARMED in out["proxies"] and FRAMETAP in out["proxies"] and sc.key == "a":
        ar, ft = out["proxies"][ARMED], out["proxies"][FRAMETAP]
        ratio = ar["median_rps"] / ft["median_rps"] if ft["median_rps"] else float("nan")
        cpu = (ft["median_cpu_ns_per_req"] / ar["median_cpu_ns_per_req"]
               if ft.get("median_cpu_ns_per_req") and ar.get("median_cpu_ns_per_req") else None)
        out.setdefault("checks", {})["armed_rps"] = {
            "ratio": ratio, "target": f">= {ARMED_TARGET}", "pass": ratio >= ARMED_TARGET,
            "spread": (min(ar["rps"]), max(ar["rps"])), "cpu_ratio": cpu}
    if PREVIOUS in out["proxies"] and FRAMETAP in out["proxies"]:
        prev, ft = out["proxies"][PREVIOUS], out["proxies"][FRAMETAP]
        checks = out.setdefault("checks", {})
        key = "rps" if sc.kind == "throughput" else "p50_us"
        ratio = ft["median_" + key] / prev["median_" + key] if prev["median_" + key] else float("nan")
        ok = ratio >= 1 - PREVIOUS_TOLERANCE if key == "rps" else ratio <= 1 + PREVIOUS_TOLERANCE
        spreads = {w: (min(p[key]), max(p[key])) for w, p in ((PREVIOUS, prev), (FRAMETAP, ft))}
        if prev.get("median_cpu_ns_per_req") and ft.get("median_cpu_ns_per_req"):
            checks["vs_previous_cpu"] = {
                "ratio": prev["median_cpu_ns_per_req"] / ft["median_cpu_ns_per_req"],
                "pass": True, "target": "information: previous/frametap CPU per request"}
        checks["vs_previous_" + key] = {
            "ratio": ratio, "pass": ok, "spread": spreads, "paired": paired(runs, FRAMETAP, PREVIOUS, key),
            "target": (f">= {1 - PREVIOUS_TOLERANCE:.2f}" if key == "rps"
                       else f"<= {1 + PREVIOUS_TOLERANCE:.2f}")}
    return out


def paired_text(check: dict) -> str:
    """The paired figure beside a gated ratio of medians: information, never a verdict."""
    pairs = check.get("paired") or []
    if len(pairs) < 2:
        return ""
    op, line = check["target"].split()
    below = sum(1 for v in pairs if (v < float(line) if op == ">=" else v > float(line)))
    return (f"; paired by repeat {median(pairs):.3f} [{min(pairs):.3f}-{max(pairs):.3f}], "
            f"{below} of {len(pairs)} pairs past the target (information)")


def cpus(p: dict) -> str:
    return ", ".join("-" if v is None else f"{v:.0f}" for v in p.get("cpu_ns_per_req", []))


def print_summary(summaries: list[dict]) -> list[str]:
    failed = []
    log("")
    log("=" * 78)
    log("Summary (medians over repeats; per-run values in brackets)")
    log("=" * 78)
    for s in summaries:
        log(f"({s['scenario']}) {s['title']}")
        for which, p in s["proxies"].items():
            runs = lambda key, fmt: ", ".join(fmt.format(v) for v in p[key])  # noqa: E731
            log(f"    {which:<11} rps {p['median_rps']:>11,.0f} [{runs('rps', '{:,.0f}')}]")
            log(f"    {'':<11} p50 {p['median_p50_us']:>8.0f} us [{runs('p50_us', '{}')}]"
                f"   p99 {p['median_p99_us']:>8.0f} us [{runs('p99_us', '{}')}]")
            cpu = lambda key: ", ".join("-" if v is None else f"{v:.0f}%" for v in p[key])  # noqa: E731
            log(f"    {'':<11} client cpu {p['median_client_cpu_pct']:.1f}% "
                f"[{runs('client_cpu_pct', '{:.1f}%')}]   proxy cpu [{cpu('proxy_cpu_pct')}]"
                f"   server cpu [{cpu('server_cpu_pct')}]")
        for name, c in s.get("checks", {}).items():
            verdict = "PASS" if c["pass"] else "FAIL"
            if not c["pass"]:
                failed.append(f"{s['scenario']}:{name}")
            if name == "metrics":
                log(f"    frametap metrics saw every request: {verdict}")
            elif name == "cpu":
                (b0, b1), (f0, f1) = c["spread"]
                log(f"    frametap/passthrough proxy CPU per request ratio {c['ratio']:.3f} "
                    f"(information; pass-through {b0:.0f}-{b1:.0f} ns, frametap "
                    f"{f0:.0f}-{f1:.0f} ns)")
            elif name == "armed_rps":
                cpu = ("" if c["cpu_ratio"] is None
                       else f", by CPU per request {c['cpu_ratio']:.3f}")
                log(f"    armed/frametap (one fault rule armed, never firing) rps ratio "
                    f"{c['ratio']:.3f} (target {c['target']}): {verdict}{cpu}")
            elif name == "framelog0_loop":
                ns, (a0, a1) = c["loop_ns"], c["spread"]
                shared = ("" if not ns.get(FRAMELOG) else
                          f"; the writer's work on the shared core: "
                          f"{ns[FRAMELOG] - ns[FRAMELOG_DISCARD]:+.0f} ns for the loop "
                          f"(framelog's loop {ns[FRAMELOG]:.0f} ns)")
                log(f"    framelog0/frametap (every frame recorded, the writer discarding the "
                    f"rows) event loop CPU per request ratio {c['ratio']:.3f} (information): "
                    f"{ns[FRAMETAP]:.0f} -> {ns[FRAMELOG_DISCARD]:.0f} ns [{a0:.0f}-{a1:.0f}], "
                    f"the loop's own recording {ns[FRAMELOG_DISCARD] - ns[FRAMETAP]:+.0f} ns"
                    + shared)
            elif name.endswith("_two_core"):
                (a0, a1), (b0, b1) = c["spread"]
                log(f"    {name[:-9]}/frametap with a second core (event loop CPU per request "
                    f"{a0:.0f}-{a1:.0f} ns without the log, {b0:.0f}-{b1:.0f} ns with it): "
                    f"ratio {c['ratio']:.3f} (target {c['target']}): {verdict}")
            elif name.endswith("_rps") and name[:-4] in FRAMELOG_TARGETS:
                p = s["proxies"][name[:-4]]
                log(f"    {name[:-4]}/frametap rps ratio {c['ratio']:.3f} (target {c['target']}): "
                    f"{verdict}; {p['median_framelog_rows_per_s']:,.0f} rows/s written, "
                    f"{p['framelog_dropped']} dropped, proxy cpu {p['median_proxy_cpu_pct']:.0f}%")
                ft_cpu = s["proxies"][FRAMETAP].get("proxy_cpu_pct") or []
                busy = median([v for v in ft_cpu if v is not None])
                if busy < 90:
                    log(f"    {'':<11} NOTE: frametap used a median {busy:.0f}% of its core: it "
                        "was not the bottleneck (other work on the machine was), so this rps "
                        "ratio says little about the frame log's cost; see CPU per request")
                if "cpu_ratio" in p:
                    ft = s["proxies"][FRAMETAP]
                    log(f"    {'':<11} by proxy CPU per request: frametap "
                        f"{ft['median_cpu_ns_per_req']:.0f} ns [{cpus(ft)}], {name[:-4]} "
                        f"{p['median_cpu_ns_per_req']:.0f} ns [{cpus(p)}]: ratio "
                        f"{p['cpu_ratio']:.3f}; {p['median_rows_per_cpu_s']:,.0f} rows written "
                        f"per proxy cpu-second")
                    if p.get("median_loop_cpu_ns_per_req") and ft.get("median_loop_cpu_ns_per_req"):
                        writer = p.get("median_writer_cpu_ns_per_row")
                        log(f"    {'':<11} split by thread: event loop {ft['median_loop_cpu_ns_per_req']:.0f}"
                            f" ns per request in frametap, {p['median_loop_cpu_ns_per_req']:.0f} in "
                            f"{name[:-4]}; frame-log writer thread "
                            + ("-" if not writer else f"{writer:.0f} ns per row written"))
            elif name.startswith("vs_previous"):
                log(f"    frametap/previous build {name[12:]} ratio {c['ratio']:.3f} "
                    f"(target {c['target']}): {verdict}{paired_text(c)}")
            else:
                log(f"    frametap/passthrough {name} ratio {c['ratio']:.3f} (target {c['target']}): "
                    f"{verdict}{paired_text(c)}")
    return failed


def write_chart(summaries: list[dict], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "matplotlib not importable: chart skipped (pip install matplotlib)"
    panels = []
    for s in summaries:
        if s["kind"] == "throughput":
            panels.append((s, "rps", "requests/s"))
        else:
            panels.append((s, "p50_us", "p50 latency (us)"))
            panels.append((s, "p99_us", "p99 latency (us)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.8), squeeze=False)
    colors = {PASSTHROUGH: "#8c8c8c", FRAMETAP: "#1f77b4", PREVIOUS: "#aec7e8",
              FRAMELOG: "#ff7f0e", FRAMELOG_SAMPLED: "#ffbb78"}
    for ax, (s, key, label) in zip(axes[0], panels):
        names = list(s["proxies"])
        meds = [s["proxies"][n]["median_" + key] for n in names]
        lo = [m - min(s["proxies"][n][key]) for n, m in zip(names, meds)]
        hi = [max(s["proxies"][n][key]) - m for n, m in zip(names, meds)]
        ax.bar(names, meds, yerr=[lo, hi], capsize=4, color=[colors.get(n, "#ff7f0e") for n in names])
        title = f"({s['scenario']}) {s['title']}"
        check = s.get("checks", {}).get(key if key != "rps" else "rps")
        if check:
            title += f"\nratio {check['ratio']:.2f} {'PASS' if check['pass'] else 'FAIL'}"
        ax.set_title(title, fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
        ax.tick_params(labelsize=8)
    fig.suptitle("frametap vs pass-through (median, whiskers = min/max of repeats)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart: {path}"


def run_parser_bench(quick: bool) -> dict | None:
    log("")
    log("Parser microbenchmark (bench/parser_bench.py)")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        json_path = Path(tmp.name)
    argv = [sys.executable, str(BENCH_DIR / "parser_bench.py"), "--json-out", str(json_path)]
    if quick:
        argv.append("--quick")
    res = subprocess.run(argv, text=True, capture_output=True)
    for line in res.stdout.splitlines():
        log("    " + line)
    if res.returncode != 0 and res.stderr.strip():
        log("    " + res.stderr.strip().replace("\n", "\n    "))
    try:
        data = json.loads(json_path.read_text())
    except (OSError, ValueError):
        data = {"error": f"parser_bench exited {res.returncode} without results"}
    finally:
        json_path.unlink(missing_ok=True)
    return data


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, help="runs per scenario and proxy (default 3)")
    ap.add_argument("--seconds", type=float, help="measured seconds per run (default 5)")
    ap.add_argument("--warmup", type=float, help="unmeasured seconds before each run (default 1)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke check: defaults become 1 repeat x 2 s, 0.5 s warmup")
    ap.add_argument("--scenarios", default="a,d,b,e,c",
                    help="comma list of scenarios to run (default a,d,b,e,c)")
    ap.add_argument("--proxies",
                    default=f"{PASSTHROUGH},{FRAMETAP},{FRAMELOG},{FRAMELOG_SAMPLED},"
                            f"{FRAMELOG_DISCARD},{ARMED}",
                    help="comma list from passthrough,frametap,framelog,framelog1pct,framelog0,"
                         "armed (default all; the framelog variants are frametap "
                         "writing a frame log of every / 1%% of connections, framelog0 records "
                         "every frame but its writer discards the rows (the loop's own share), "
                         "armed is frametap with one fault rule armed that never fires; those "
                         "four run in scenario a only)")
    ap.add_argument("--framelog-format", choices=["parquet", "jsonl"], default="parquet",
                    help="[framelog] format of the framelog variants (default parquet)")
    ap.add_argument("--previous", type=Path, metavar="DIR",
                    help="also run frametap from this checkout (built in place: `python setup.py "
                         "build_ext --inplace`), interleaved: the before build of a hot-path change")
    ap.add_argument("--proxy-cpus", default=PROXY_CPU, metavar="LIST",
                    help=f"taskset cpu list for the proxies (default {PROXY_CPU}; the targets are "
                         "defined with the proxy on one core: e.g. 0,1 is an extra figure "
                         "where the frame-log writer thread may use the load generator's core)")
    ap.add_argument("--skip-parser", action="store_true", help="do not run bench/parser_bench.py")
    ap.add_argument("--strict", action="store_true", help="exit 1 when any target FAILs")
    ap.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json", help="results JSON path")
    args = ap.parse_args(argv)
    defaults = (1, 2.0, 0.5) if args.quick else (3, 5.0, 1.0)
    for name, value in zip(("repeat", "seconds", "warmup"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)

    proxies = [p.strip() for p in args.proxies.split(",") if p.strip()]
    if args.previous is not None:
        if not (args.previous / "proxy" / "__main__.py").is_file():
            ap.error(f"--previous {args.previous}: not a frametap checkout")
        args.previous = args.previous.resolve()
        proxies.append(PREVIOUS)
    bad = set(proxies) - {PASSTHROUGH, FRAMETAP, PREVIOUS, *A_ONLY}
    if bad or not proxies:
        ap.error(f"--proxies: unknown {sorted(bad)}; choose from passthrough,frametap,"
                 f"{','.join(FRAMELOG_TARGETS)},{FRAMELOG_DISCARD},{ARMED}")
    keys = [k.strip() for k in args.scenarios.split(",") if k.strip()]
    scenarios = [s for s in SCENARIOS if s.key in keys]
    if len(scenarios) != len(keys):
        ap.error(f"--scenarios: choose from {','.join(s.key for s in SCENARIOS)}")
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", args.proxy_cpus):
        ap.error(f"--proxy-cpus: a cpu list such as 0 or 0,1, not {args.proxy_cpus!r}")
    if args.repeat < 1 or args.seconds <= 0 or args.warmup < 0:
        ap.error("--repeat must be >= 1, --seconds > 0, --warmup >= 0")

    try:
        return run(args, proxies, scenarios)
    except BenchError as exc:
        log(f"\nrun_bench: {exc}")
        return 2
    except KeyboardInterrupt:
        log("\nrun_bench: interrupted")
        return 130


def run(args: argparse.Namespace, proxies: list[str], scenarios: list[Scenario]) -> int:
    frametap_cwd, framing_file = None, None
    if set(proxies) & {FRAMETAP, *A_ONLY}:
        frametap_cwd, framing_file = locate_frametap()
    if PASSTHROUGH in proxies:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            raise BenchError(f"uvloop is not installed for {sys.executable}: pip install uvloop") from None
    if shutil.which("taskset") is None:
        log("warning: taskset not found; processes will not be pinned to cpus")
    if (os.cpu_count() or 1) < 2:
        log("warning: fewer than 2 cpus; pinning to cpu 1 will fail")

    workdir = Path(tempfile.mkdtemp(prefix="frametap-bench-"))
    flyload = build_flyload(workdir)
    server_port = free_port()
    server_log = workdir / "flyload-server.log"
    with open(server_log, "wb") as out:
        server = subprocess.Popen(pinned(LOAD_CPU, [str(flyload), "server", "--host", "127.0.0.1",
                                                    "--port", str(server_port)]),
                                  stdout=out, stderr=subprocess.STDOUT)
    started = time.time()
    runs: list[dict] = []
    try:
        wait_port(server_port, server, 10, "flyload server", server_log)
        env = Env(flyload, server_port, server.pid, args.seconds, args.warmup, workdir, frametap_cwd,
                  args.previous, args.proxy_cpus, args.framelog_format)
        log(f"python {platform.python_version()} ({sys.executable}); flyload in {workdir}")
        if framing_file:
            kind = "PURE-PYTHON (not compiled!)" if ".py " in framing_file + " " else "compiled"
            log(f"frametap ({kind}): {framing_file}")
        log(f"{args.repeat} repeat(s) x {args.seconds:g} s (+{args.warmup:g} s warmup); "
            f"proxy on cpu {args.proxy_cpus}, flyload server+client on cpu {LOAD_CPU}; "
            f"loadavg {os.getloadavg()[0]:.2f}")
        log("")
        for sc in scenarios:
            log(f"({sc.key}) {sc.title}")
            for rep in range(args.repeat):
                # alternate who goes first so slow drift hits both sides alike
                mine = [p for p in proxies if sc.key == "a" or p not in A_ONLY]
                order = mine if rep % 2 == 0 else list(reversed(mine))
                for which in order:
                    r = one_run(env, sc, which, rep)
                    runs.append(r)
                    log("  " + progress_line(sc, rep, args.repeat, r))
    finally:
        stop(server)

    summaries = [summarize(sc, [r for r in runs if r["scenario"] == sc.key],
                           [p for p in proxies if sc.key == "a" or p not in A_ONLY])
                 for sc in scenarios]
    failed = print_summary(summaries)

    parser = None if args.skip_parser else run_parser_bench(args.quick)
    if parser and parser.get("pass") is False:
        failed.append("parser")

    args.output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "config": {"repeat": args.repeat, "seconds": args.seconds, "warmup": args.warmup,
                   "proxies": proxies, "scenarios": [sc.key for sc in scenarios],
                   "proxy_cpu": args.proxy_cpus, "load_cpu": LOAD_CPU},
        "environment": {"python": sys.version.split()[0], "executable": sys.executable,
                        "platform": platform.platform(), "cpus": os.cpu_count(),
                        "loadavg": os.getloadavg(), "frametap_framing": framing_file},
        "summary": summaries,
        "runs": runs,
        "parser_bench": parser,
        "failed": failed,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    log("")
    log(f"results: {args.output}")
    log(write_chart(summaries, args.output.parent / "latest.png"))
    shutil.rmtree(workdir, ignore_errors=True)
    log("")
    log("OVERALL: " + ("PASS" if not failed else "FAIL (" + ", ".join(failed) + ")"))
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
