"""frametap Thrift (ttheader) proxy benchmark: pipelined TTHeader RPC load through frametap
against the pass-through uvloop proxy (bench/passthrough.py), same run.

Frames are the parser bench's (proxy/protocols/ttheader/samples.py): Kitex TTHeader calls
with 3 info headers and a ~200-byte binary payload, and their replies. A backend (pinned
to cpu 1) answers every call with its reply in order; a load client (cpu 1 too) keeps
``--depth`` calls in flight on each of ``--conns`` connections; each proxy in turn runs on
cpu 0, alternating over ``--repeats`` so drift hits both alike. Reported: calls/s per
proxy, the frametap / pass-through ratio (target >= 0.85), and the proxy's CPU seconds
per million calls. After each frametap run the admin /metrics must show at least as many
counted calls and replies as the client completed.

    python bench/ttheader_bench.py [--seconds 5] [--repeats 3] [--conns 8] [--depth 64]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(BENCH_DIR))

from run_bench import free_port, pinned, proc_cpu_seconds, stop, wait_port, wait_ready  # noqa: E402

N_FRAMES = 4096
TARGET = 0.85


def frames():
    from proxy.protocols.ttheader.samples import bench_frames
    _, calls, replies = bench_frames(N_FRAMES, 0)
    assert len({len(c) for c in calls}) == 1 and len({len(r) for r in replies}) == 1
    return calls, replies


# ---- backend and load client (child processes) -----------------------------------

class _Backend(asyncio.Protocol):
    def __init__(self, call_len, reply_blob, reply_len):
        self.call_len, self.blob, self.rlen = call_len, reply_blob, reply_len
        self.pending = 0
        self.i = 0

    def connection_made(self, transport):
        self.t = transport

    def data_received(self, data):
        self.pending += len(data)
        m, self.pending = divmod(self.pending, self.call_len)
        while m:
            k = min(m, N_FRAMES - self.i)
            self.t.write(self.blob[self.i * self.rlen:(self.i + k) * self.rlen])
            self.i = (self.i + k) % N_FRAMES
            m -= k


def run_backend(port):
    import uvloop
    calls, replies = frames()
    blob = b"".join(replies)

    async def main():
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(lambda: _Backend(len(calls[0]), blob, len(replies[0])),
                                       "127.0.0.1", port)
        await srv.serve_forever()
    uvloop.run(main())


class _Client(asyncio.Protocol):
    def __init__(self, blob, call_len, reply_len, depth, stats):
        self.blob, self.clen, self.rlen, self.depth, self.stats = blob, call_len, reply_len, \
            depth, stats
        self.i = 0
        self.pending = 0

    def _send(self, m):
        while m:
            k = min(m, N_FRAMES - self.i)
            self.t.write(self.blob[self.i * self.clen:(self.i + k) * self.clen])
            self.i = (self.i + k) % N_FRAMES
            m -= k

    def connection_made(self, transport):
        self.t = transport
        self._send(self.depth)

    def data_received(self, data):
        self.pending += len(data)
        m, self.pending = divmod(self.pending, self.rlen)
        self.stats[0] += m
        self._send(m)


def run_client(port, conns, depth, seconds, warmup):
    import uvloop
    calls, replies = frames()
    blob = b"".join(calls)
    stats = [0]

    async def main():
        loop = asyncio.get_running_loop()
        for _ in range(conns):
            await loop.create_connection(
                lambda: _Client(blob, len(calls[0]), len(replies[0]), depth, stats),
                "127.0.0.1", port)
        await asyncio.sleep(warmup)
        start, t0 = stats[0], time.perf_counter()
        await asyncio.sleep(seconds)
        done, dt = stats[0] - start, time.perf_counter() - t0
        print("RESULT %d %.6f %d" % (done, dt, stats[0]), flush=True)
    uvloop.run(main())


# ---- driver -----------------------------------------------------------------------

def one_run(which, backend_port, args, logdir):
    listen = free_port()
    admin = None
    logfile = logdir / f"{which}.log"
    if which == "passthrough":
        argv = [sys.executable, str(BENCH_DIR / "passthrough.py"), "--listen",
                f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{backend_port}"]
    else:
        admin = free_port()
        argv = [sys.executable, "-m", "proxy", "proxy", "--protocol", "ttheader",
                "--listen", f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{backend_port}",
                "--admin", f"127.0.0.1:{admin}"]
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(pinned("0", argv), cwd=REPO_DIR, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_port(listen, proc, 20, which, logfile)
        if admin:
            wait_ready(f"http://127.0.0.1:{admin}/readyz", proc, 20, logfile)
        cpu0 = proc_cpu_seconds(proc.pid)
        r = subprocess.run(pinned("1", [sys.executable, __file__, "--client", str(listen),
                                        str(args.conns), str(args.depth), str(args.seconds),
                                        "1.0"]), capture_output=True, text=True,
                           timeout=args.seconds + 60)
        cpu1 = proc_cpu_seconds(proc.pid)
        m = re.search(r"RESULT (\d+) ([\d.]+) (\d+)", r.stdout)
        if not m:
            raise RuntimeError(f"load client failed: {r.stderr[-2000:]}")
        done, dt, total = int(m.group(1)), float(m.group(2)), int(m.group(3))
        counted = None
        if admin:
            import urllib.request
            text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) \
                .read().decode()
            counted = sum(float(v) for v in re.findall(
                r'frametap_responses_total\{(?=[^}]*opcode="GetUser")(?=[^}]*status="OK")[^}]*\} '
                r'([\d.e+]+)',
                text))
            if counted < total:
                lines = [ln for ln in text.splitlines() if "ttheader" in ln and
                         ("responses" in ln or "frames_total" in ln or "errors" in ln)]
                raise RuntimeError(f"frametap counted {counted} replies, client got {total}:\n"
                                   + "\n".join(lines[:20]))
        cpu = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
        return {"rps": done / dt, "cpu_per_m": cpu / (total / 1e6) if cpu and total else None,
                "counted": counted}
    finally:
        stop(proc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--depth", type=int, default=64)
    args = ap.parse_args(argv)
    import tempfile
    logdir = Path(tempfile.mkdtemp(prefix="ttheader-bench-"))
    backend_port = free_port()
    backend = subprocess.Popen(pinned("1", [sys.executable, __file__, "--backend",
                                            str(backend_port)]), cwd=REPO_DIR)
    results = {"passthrough": [], "frametap": []}
    try:
        wait_port(backend_port, backend, 20, "backend", logdir / "backend.log")
        for rep in range(args.repeats):
            order = ["passthrough", "frametap"] if rep % 2 == 0 else ["frametap", "passthrough"]
            for which in order:
                r = one_run(which, backend_port, args, logdir)
                results[which].append(r)
                print(f"  rep {rep + 1} {which:12s} {r['rps']:>12,.0f} calls/s  "
                      f"proxy cpu {r['cpu_per_m'] or 0:.2f} s per M calls", flush=True)
    finally:
        stop(backend)
    pt = statistics.median(r["rps"] for r in results["passthrough"])
    ft = statistics.median(r["rps"] for r in results["frametap"])
    ratio = ft / pt
    print(f"ttheader pipelined RPC ({args.conns} conns x {args.depth} deep, Kitex TTHeader "
          f"calls + replies): pass-through {pt:,.0f} calls/s, frametap {ft:,.0f} calls/s, "
          f"ratio {ratio:.3f} (target >= {TARGET}): {'PASS' if ratio >= TARGET else 'FAIL'}")
    cpu_pt = statistics.median(r["cpu_per_m"] or 0 for r in results["passthrough"])
    cpu_ft = statistics.median(r["cpu_per_m"] or 0 for r in results["frametap"])
    print(f"proxy cpu per million calls: pass-through {cpu_pt:.2f} s, frametap {cpu_ft:.2f} s")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--backend":
        run_backend(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--client":
        run_client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),
                   float(sys.argv[6]))
    else:
        sys.exit(main())
