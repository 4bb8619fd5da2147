"""Run the frametap CLI with its event loop instrumented (bench/soak.py blackhole --probe).

    python bench/loopprobe.py OUT.json proxy -c frametap.toml ...

Everything after OUT.json is frametap's own command line.  At exit OUT.json holds:

- ``loop_lag_ms``: how late a 1 ms timer fires on the proxy's loop (wall clock: what a
  client on another route waits for), p50 / p99 / p99.9 / max;
- ``loop_cpu_ms``: the loop thread's cpu time from one such timer to the next (the work
  the proxy itself did meanwhile; a machine shared with other load inflates the wall
  figure, not this one), same quantiles;
- ``callbacks``: per kind (``c2s:<route>``/``s2c:<route>`` reads and read slices,
  ``expire`` calls, ``sweep:<route>`` stretches of the sweep between two yields, ``gc<n>``
  collections) the count, mean and max cpu time (ms).

Instrumentation wraps the relay's Python-level methods, so it costs a little per read;
compare runs made with it to each other, not to runs without it.
"""

import atexit
import gc
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

cpu = time.thread_time
wall = time.perf_counter
_stats = {}                                  # kind -> [n, total, max] (cpu seconds)


def note(kind, dt):
    s = _stats.get(kind)
    if s is None:
        s = _stats[kind] = [0, 0.0, 0.0]
    s[0] += 1
    s[1] += dt
    if dt > s[2]:
        s[2] = dt


def instrument():
    import asyncio

    from proxy import relay

    def timed_read(cls, label):
        orig = cls.data_received

        def data_received(self, data):
            a = cpu()
            orig(self, data)
            route = self.route if cls is relay.ClientSide else self.client.route
            note(f"{label}:{route.cfg.name}", cpu() - a)
        cls.data_received = data_received
    timed_read(relay.ClientSide, "c2s")
    timed_read(relay.UpstreamSide, "s2c")
    if hasattr(relay.ClientSide, "_next_slice"):
        orig_slice = relay.ClientSide._next_slice

        def _next_slice(self, d):
            a = cpu()
            orig_slice(self, d)
            note(f"{'c2s' if d == 0 else 's2c'}:{self.route.cfg.name}", cpu() - a)
        relay.ClientSide._next_slice = _next_slice

    async def sweep_once(self, limit=None):       # relay.Route.sweep_once, timed
        limit = relay.SWEEP_SLICE if limit is None else limit
        now = relay.now_ns()
        self.log.flush()
        mono = time.monotonic()
        done = 0
        start = cpu()
        for conn in list(self.connections):
            while not conn.closed:
                a = cpu()
                n = conn.parser.expire(now, limit)
                note("expire", cpu() - a)
                done += n + 1
                if done >= limit:
                    done = 0
                    note(f"sweep:{self.cfg.name}", cpu() - start)
                    await asyncio.sleep(0)
                    start = cpu()
                if n < limit:
                    break
            if not conn.closed:
                conn.check_timeouts(mono)
        note(f"sweep:{self.cfg.name}", cpu() - start)
    relay.Route.sweep_once = sweep_once

    gc_start = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = cpu()
        else:
            note(f"gc{info['generation']}", cpu() - gc_start[0])
    gc.callbacks.append(on_gc)

    lag, lag_cpu = [], []

    async def probe():
        while True:
            w, c = wall(), cpu()
            await asyncio.sleep(0.001)
            lag.append(wall() - w - 0.001)
            lag_cpu.append(cpu() - c)

    orig_start = relay.Route.start
    started = []

    async def start(self):
        await orig_start(self)
        if not started:                      # one probe per process
            started.append(self.loop.create_task(probe()))
    relay.Route.start = start
    return lag, lag_cpu


def quantiles(xs):
    xs = sorted(xs)
    if not xs:
        return None

    def q(p):
        return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1e3, 3)
    return {"n": len(xs), "p50": q(0.5), "p99": q(0.99), "p999": q(0.999),
            "max": round(xs[-1] * 1e3, 3)}


def main():
    usage = "usage: python bench/loopprobe.py OUT.json FRAMETAP-ARGS..."
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(usage + "\n\n" + __doc__.strip())
        return 0
    if len(sys.argv) < 3:
        print(usage + " (see --help)", file=sys.stderr)
        return 2
    out = sys.argv[1]
    lag, lag_cpu = instrument()

    def dump():
        result = {"loop_lag_ms": quantiles(lag), "loop_cpu_ms": quantiles(lag_cpu),
                  "callbacks": {k: {"n": n, "mean_ms": round(t / n * 1e3, 3),
                                    "max_ms": round(m * 1e3, 3)}
                                for k, (n, t, m) in sorted(_stats.items())}}
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    atexit.register(dump)
    from proxy.cli import main as frametap
    return frametap(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
