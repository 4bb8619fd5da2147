"""frametap's TLS routes against a bare uvloop TLS relay, same run (issue 23, "Speed").

Chain: a TLS client (this script) -> the relay measured -> a bare TLS terminator
(bench/tls_relay.py, not measured) -> the FlyMQ C backend (bench/flyload.c). The relay
measured is, in turn:

  frametap-tls   ``frametap proxy`` with a flymq route, ``[routes.tls] mode = "both"``
  bare-tls       bench/tls_relay.py with TLS on both sides (the baseline)
  frametap-plain ``frametap proxy``, plain flymq route, plain client (information:
  pass-plain     bench/passthrough.py                  the TLS/plain ratio)

Two methods, because the machine is shared and busy:

``--method callgrind`` (default, insensitive to other load): the relay process under
valgrind's callgrind; per size one connection, warm-up, then windows of lockstep batches
(the client writes ``batch`` PRODUCE requests at once and reads all the answers) counted
with ``vgdb zero``/``dump`` (bench/guard.py's machinery). The figure is instructions per
relayed request (median window, less an empty window), every thread of the process,
OpenSSL included. frametap/bare instructions per request is the cost ratio; its inverse
is the throughput ratio a CPU-bound relay would reach.

``--method timed``: every relay started once, pinned to cpu 0 (the client, the TLS
terminator and the backend on cpu 1, as bench/run_bench.py pins); rounds of ``--seconds``
each, relays interleaved in rotated order, ``--rounds`` times; per size requests/s of the lockstep
client (one connection) and the p50 of its batch round trips; medians and the spread
(min-max) over the rounds. Indicative only on a busy machine; the client is Python, so its
own cost is in every figure and the ratios come out closer to 1 than the relays' own.

    python bench/tls_bench.py                      # callgrind, 64B and 16KiB
    python bench/tls_bench.py --method timed --rounds 5 --seconds 3
    python bench/tls_bench.py --json bench/results/tls.json

Needs valgrind (callgrind), a C compiler and the openssl program (certificates).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO_DIR))

import guard  # noqa: E402
from guard import (Callgrind, Client, GuardError, Shape, free_port, stop,  # noqa: E402
                   wait_listening)

SHAPES = {"64B": Shape("64B", 64, batch=16, warmup=16, n=64),
          "16KiB": Shape("16KiB", 16 * 1024, batch=8, warmup=8, n=24)}
RELAYS = ("frametap-tls", "bare-tls", "frametap-plain", "pass-plain")
WINDOWS = 3


def log(msg):
    print(f"tls_bench: {msg}", flush=True)


class TLSClient(Client):
    """guard.Client over TLS (verified against the bench's throwaway CA)."""

    ctx: ssl.SSLContext | None = None

    def __init__(self, port, shape, proxy, timeout):
        super().__init__(port, shape, proxy, timeout)
        if self.ctx is not None:
            self.sock = self.ctx.wrap_socket(self.sock, server_hostname="127.0.0.1")


def relay_argv(which, port, tls_port, fly_port, certs, work):
    """argv of the relay measured: listening on ``port``; TLS ones forward to the TLS
    terminator on ``tls_port``, plain ones to the backend ``fly_port``."""
    py = sys.executable
    if which == "bare-tls":
        return [py, str(BENCH_DIR / "tls_relay.py"), "--listen", f"127.0.0.1:{port}",
                "--upstream", f"127.0.0.1:{tls_port}", "--cert", certs["cert"],
                "--key", certs["key"], "--ca", certs["ca"]]
    if which == "pass-plain":
        return [py, str(BENCH_DIR / "passthrough.py"), "--listen", f"127.0.0.1:{port}",
                "--upstream", f"127.0.0.1:{fly_port}"]
    cfg = work / f"{which}.toml"
    text = (f'[[routes]]\nname = "fly"\nprotocol = "flymq"\nlisten = "127.0.0.1:{port}"\n')
    if which == "frametap-tls":
        text += (f'upstream = "127.0.0.1:{tls_port}"\n[routes.tls]\nmode = "both"\n'
                 f'[routes.tls.listen]\ncert = "{certs["cert"]}"\nkey = "{certs["key"]}"\n'
                 f'[routes.tls.upstream]\nca = "{certs["ca"]}"\n')
    else:
        text += f'upstream = "127.0.0.1:{fly_port}"\n'
    cfg.write_text(text)
    return [py, "-m", "proxy", "proxy", "-c", str(cfg), "--log-level", "warning"]


def start(argv, port, work, name, wrap=None):
    env = dict(os.environ, PYTHONPATH=str(REPO_DIR), PYTHONHASHSEED="0")
    env.pop("FRAMETAP_NO_EXTENSIONS", None)
    out = open(work / f"{name}.log", "wb")
    proc = subprocess.Popen(wrap(argv) if wrap else argv, cwd=REPO_DIR, env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    out.close()
    return proc


def client_for(which, port, shape, proc, ctx):
    TLSClient.ctx = ctx if which.endswith("-tls") else None
    return TLSClient(port, shape, proc, timeout=240)


def measure_callgrind(which, shapes, tls_port, fly_port, certs, ctx, work):
    tool = Callgrind(work)
    port = free_port()
    proc = start(relay_argv(which, port, tls_port, fly_port, certs, work), port, work,
                 which, tool.wrap)
    tool.pid = proc.pid
    out = {}
    try:
        for shape in shapes:
            c = client_for(which, port, shape, proc, ctx)
            c.run(shape.warmup)
            tool.start()
            empty = tool.stop()["instructions"]
            values = []
            for _ in range(WINDOWS):
                tool.start()
                c.run(shape.n)
                values.append((tool.stop()["instructions"] - empty) / (shape.n * shape.batch))
            c.close()
            out[shape.name] = {"instructions_per_request": statistics.median(values),
                               "windows": [round(v) for v in values]}
            log(f"{which:>14} {shape.name:>5}: {statistics.median(values):>10,.0f} "
                f"instructions/request (windows {min(values):,.0f}-{max(values):,.0f})")
    finally:
        stop(proc)
    return out


def pin(cpu):
    """argv -> argv pinned to ``cpu`` (taskset), or unchanged without taskset."""
    if shutil.which("taskset") is None:
        return None
    return lambda argv: ["taskset", "-c", str(cpu), *argv]


def measure_timed(shapes, tls_port, fly_port, certs, ctx, work, rounds, seconds):
    # the relays measured on cpu 0 (one at a time carries load), this client, the TLS
    # terminator and the backend on cpu 1: what run_bench does, so a relay is not moved
    # between cores or made to share one with its own client mid-run
    procs, ports = {}, {}
    if shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    try:
        for which in RELAYS:
            ports[which] = free_port()
            procs[which] = start(relay_argv(which, ports[which], tls_port, fly_port, certs,
                                            work), ports[which], work, which, pin(0))
        for which in RELAYS:
            wait_listening(ports[which], procs[which], 30, which)
        res = {s.name: {w: {"rps": [], "p50_ms": []} for w in RELAYS} for s in shapes}
        for r in range(rounds):
            order = RELAYS[r % len(RELAYS):] + RELAYS[:r % len(RELAYS)]
            for shape in shapes:
                for which in order:
                    c = client_for(which, ports[which], shape, procs[which], ctx)
                    c.run(shape.warmup)
                    lat = []
                    t0 = time.perf_counter()
                    while time.perf_counter() - t0 < seconds:
                        t1 = time.perf_counter()
                        c.run(1)
                        lat.append(time.perf_counter() - t1)
                    elapsed = time.perf_counter() - t0
                    c.close()
                    res[shape.name][which]["rps"].append(len(lat) * shape.batch / elapsed)
                    res[shape.name][which]["p50_ms"].append(
                        1000 * statistics.median(lat))
            log(f"round {r + 1}/{rounds} done")
        return res
    finally:
        for p in procs.values():
            stop(p)


def summarize_timed(res):
    out = {}
    for size, by in res.items():
        s = {}
        for which, v in by.items():
            s[which] = {k: {"median": round(statistics.median(x), 3),
                            "min": round(min(x), 3), "max": round(max(x), 3)}
                        for k, x in v.items()}
        ft, bare = s["frametap-tls"], s["bare-tls"]
        s["ratios"] = {
            "rps_frametap_tls_over_bare_tls": round(ft["rps"]["median"] / bare["rps"]["median"], 3),
            "p50_frametap_tls_over_bare_tls": round(ft["p50_ms"]["median"]
                                                    / bare["p50_ms"]["median"], 3),
            "rps_tls_over_plain_frametap": round(ft["rps"]["median"]
                                                 / s["frametap-plain"]["rps"]["median"], 3)}
        out[size] = s
        log(f"{size}: " + "; ".join(
            f"{w} {s[w]['rps']['median']:,.0f} rps [{s[w]['rps']['min']:,.0f}-"
            f"{s[w]['rps']['max']:,.0f}] p50 {s[w]['p50_ms']['median']:.3f} ms"
            for w in RELAYS))
        log(f"{size}: ratios {s['ratios']}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", choices=("callgrind", "timed"), default="callgrind")
    ap.add_argument("--sizes", default="64B,16KiB", help="comma list of 64B, 16KiB")
    ap.add_argument("--relays", default=",".join(RELAYS),
                    help="callgrind: which relays to count (" + ", ".join(RELAYS) + ")")
    ap.add_argument("--rounds", type=int, default=5, help="timed: rounds (5)")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed: seconds per run (3)")
    ap.add_argument("--json", metavar="FILE", help="write the figures here too")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.sizes.split(",") if n.strip()]
    if not names or set(names) - set(SHAPES):
        ap.error("--sizes: a comma list of 64B, 16KiB")
    relays = [r.strip() for r in args.relays.split(",") if r.strip()]
    if set(relays) - set(RELAYS):
        ap.error("--relays: a comma list of " + ", ".join(RELAYS))
    shapes = [SHAPES[n] for n in names]
    from loadgen.tlscerts import CertError, throwaway
    with tempfile.TemporaryDirectory(prefix="frametap-tlsbench-") as tmp:
        work = Path(tmp)
        try:
            if args.method == "callgrind" and shutil.which("valgrind") is None:
                raise GuardError("valgrind is not installed (apt-get install valgrind)")
            certs = throwaway(str(work / "tls"))
            ctx = ssl.create_default_context(cafile=certs["ca"])
            flyload = guard.build_flyload(work)
            fly_port, tls_port = free_port(), free_port()
            side = pin(1) if args.method == "timed" else None
            backend_argv = [str(flyload), "server", "--host", "127.0.0.1", "--port",
                            str(fly_port)]
            backend = subprocess.Popen(side(backend_argv) if side else backend_argv,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            term = start([sys.executable, str(BENCH_DIR / "tls_relay.py"), "--listen",
                          f"127.0.0.1:{tls_port}", "--upstream", f"127.0.0.1:{fly_port}",
                          "--cert", certs["cert"], "--key", certs["key"]], tls_port, work,
                         "terminator", side)
            try:
                wait_listening(fly_port, backend, 10, "flyload server")
                wait_listening(tls_port, term, 30, "TLS terminator")
                if args.method == "callgrind":
                    figures = {w: measure_callgrind(w, shapes, tls_port, fly_port, certs, ctx,
                                                    work) for w in relays}
                    result = {"method": "callgrind", "figures": figures, "ratios": {}}
                    for s in names:
                        r = {}
                        ipr = {w: figures[w][s]["instructions_per_request"] for w in relays}
                        if "frametap-tls" in ipr and "bare-tls" in ipr:
                            r["cost_frametap_tls_over_bare_tls"] = round(
                                ipr["frametap-tls"] / ipr["bare-tls"], 3)
                            r["throughput_bound_frametap_tls_over_bare_tls"] = round(
                                ipr["bare-tls"] / ipr["frametap-tls"], 3)
                        if "frametap-tls" in ipr and "frametap-plain" in ipr:
                            r["cost_tls_over_plain_frametap"] = round(
                                ipr["frametap-tls"] / ipr["frametap-plain"], 3)
                        if "bare-tls" in ipr and "pass-plain" in ipr:
                            r["cost_tls_over_plain_bare"] = round(
                                ipr["bare-tls"] / ipr["pass-plain"], 3)
                        result["ratios"][s] = r
                        log(f"{s}: {r}")
                else:
                    result = {"method": "timed", "rounds": args.rounds,
                              "seconds": args.seconds,
                              "figures": summarize_timed(measure_timed(
                                  shapes, tls_port, fly_port, certs, ctx, work, args.rounds,
                                  args.seconds))}
            finally:
                stop(term)
                stop(backend)
        except (GuardError, CertError) as exc:
            print(f"tls_bench: ERROR {exc}", file=sys.stderr)
            return 2
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
