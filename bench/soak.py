"""Soak drivers for issue 8's figures (docs/design.md, "Pending requests" and "File
descriptors"): a real proxy process, real sockets, its RSS read from /proc.

flood
    ``--connections`` clients (10,000 by default) on one FlyMQ route in front of the
    reference FlyMQ server, each sending one request and then holding its connection:
    how many were served, how many the proxy counted otherwise, whether /metrics answered
    every scrape meanwhile, and the proxy's RSS per idle connection. The proxy, the server
    and this driver raise their own open-file limits (root may raise the hard limit).

blackhole
    Upstreams that accept and never answer: ``--stream`` RabbitMQ Stream connections
    publishing unconfirmed messages and one RocketMQ connection sending
    ``--routeinfo`` GET_ROUTEINFO_BY_TOPIC requests to a route that rewrites route data,
    for ``--seconds``; meanwhile a well-behaved FlyMQ client on a third route measures its
    round trips through the reference server. Reports the proxy's peak RSS against
    ``--budget`` (max_pending_bytes) + 64 MiB, the overflow counted, and the FlyMQ
    client's p50 / p99 / max latency.  The proxy runs on a cpu of its own, the driver on
    the others, the FlyMQ client and server in SCHED_FIFO (``--no-pin``: not); the
    proxy's cpu seconds and run-queue wait show how much of the latency a shared
    machine added.  ``--probe`` instruments the proxy's loop (bench/loopprobe.py).

proxyfuzz
    ``--frames`` mutated frames per protocol (bench/fuzz_twins.py's corpus and mutations)
    sent by ``--workers`` clients through a running proxy with one route per protocol, in
    front of upstreams that read and never answer; each case (1-8 frames) on a connection
    of its own, so a mutated length cannot swallow the next case. The proxy's RSS is read
    whenever all its connections have closed: after ``--warmup`` frames per protocol and
    at ``--checkpoints`` (growth against frames sent: a leak grows with them, a full
    table or allocator high-water mark does not). Reports the frames sent, the growth
    after the warm-up at each checkpoint, the peak of open connections and the tracebacks
    in its log (must be 0).

    python bench/soak.py flood [--connections N]
    python bench/soak.py proxyfuzz [--frames N] [--workers N] [--warmup N] [--checkpoints F,F]
    python bench/soak.py blackhole [--seconds S] [--stream N] [--routeinfo N] [--budget BYTES]
                                   [--stream-rate N] [--probe] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FRAMETAP = [sys.executable, "-m", "proxy"]
NOFILE = 65536
LIST_TOPICS = bytes([0xAF, 1, 0x08, 1]) + struct.pack(">I", 0)


def _raise_nofile(limit=NOFILE):
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    except (OSError, ValueError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def scrape(port, timeout=5.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def metric(text, name, **labels):
    total = None
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total = (total or 0) + float(value)
    return total


def wait_port(port, proc, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = ""
            if getattr(proc, "log", None) is not None:     # its last line says why
                proc.log.seek(0)
                lines = [ln.strip() for ln in proc.log.read().splitlines() if ln.strip()]
                said = f": {lines[-1]}" if lines else ""
            raise RuntimeError(f"{what} exited with status {proc.returncode}{said}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start")


def placed(cpus=None, realtime=False):
    """Put the calling process on ``cpus`` and, with ``realtime``, in SCHED_FIFO (the
    blackhole soak's measuring client and its server: their own scheduling must not be
    what is measured); silently left as is where the system refuses."""
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError):
            pass
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        except (OSError, AttributeError):
            pass


def start(cmd, port, what, nofile=NOFILE, cpus=None, realtime=False, **kw):
    # the log goes to a file: a pipe nobody reads until the end fills up (64 KiB) and
    # then blocks the process on its next log line
    import tempfile
    log = tempfile.TemporaryFile(mode="w+")

    def setup():
        _raise_nofile(nofile)
        placed(cpus, realtime)
    proc = subprocess.Popen(cmd, preexec_fn=setup,
                            stdout=subprocess.DEVNULL, stderr=log, text=True, **kw)
    proc.log = log
    wait_port(port, proc, what)
    return proc


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.log.seek(0)
    return proc.log.read()


class Scraper(threading.Thread):
    """Scrapes /metrics every ``period`` seconds; counts answers and failures."""

    def __init__(self, port, period=0.5):
        super().__init__(daemon=True)
        self.port, self.period = port, period
        self.ok = self.failed = 0
        self.worst = 0.0
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            t = time.perf_counter()
            try:
                scrape(self.port, 5)
                self.ok += 1
                self.worst = max(self.worst, time.perf_counter() - t)
            except OSError:
                self.failed += 1
            self.stopped.wait(self.period)


# ---------------------------------------------------------------------------- flood

async def _flood_clients(port, n, wait):
    served, failed, conns = 0, 0, []

    async def one():
        nonlocal served, failed
        writer = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(LIST_TOPICS)
            head = await asyncio.wait_for(reader.readexactly(8), wait)
            await reader.readexactly(struct.unpack(">I", head[4:])[0])
            served += 1
            conns.append(writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            failed += 1                              # not answered within `wait`
            if writer is not None:
                conns.append(writer)                 # still waiting: keep it open
    sem = asyncio.Semaphore(500)                     # connect 500 at a time

    async def limited():
        async with sem:
            await one()
    await asyncio.gather(*(limited() for _ in range(n)))
    return served, failed, conns


def flood(args):
    _raise_nofile()
    server_port, listen, admin = free_port(), free_port(), free_port()
    server = start(FRAMETAP + ["serve", "flymq", "--listen", f"127.0.0.1:{server_port}",
                               "--log-level", "WARNING"], server_port, "flymq server")
    proxy = start(FRAMETAP + ["proxy", "--protocol", "flymq", "--name", "flood",
                              "--log-level", "info",
                              "--listen", f"127.0.0.1:{listen}",
                              "--upstream", f"127.0.0.1:{server_port}",
                              "--admin", f"127.0.0.1:{admin}"],
                  listen, "proxy", nofile=args.nofile)
    try:
        time.sleep(0.5)
        base = rss_bytes(proxy.pid)
        scraper = Scraper(admin)
        scraper.start()
        t0 = time.perf_counter()
        loop = asyncio.new_event_loop()
        served, failed, conns = loop.run_until_complete(
            _flood_clients(listen, args.connections, args.wait))
        took = time.perf_counter() - t0
        time.sleep(1.0)
        held = rss_bytes(proxy.pid)
        try:
            text = scrape(admin)
        except OSError as exc:
            text = ""
            print(f"final scrape failed: {exc}", file=sys.stderr)
        scraper.stopped.set()
        scraper.join()
        result = {
            "connections": args.connections, "served": served, "client_failures": failed,
            "seconds_to_serve_all": round(took, 2),
            "proxy_connections_active": metric(text, "frametap_connections_active"),
            "proxy_rejected": metric(text, "frametap_connections_rejected_total"),
            "proxy_accept_errors": metric(text, "frametap_accept_errors_total") or 0,
            "proxy_connect_failures": metric(text, "frametap_upstream_connect_failures_total"),
            "metrics_scrapes_ok": scraper.ok, "metrics_scrapes_failed": scraper.failed,
            "slowest_scrape_s": round(scraper.worst, 3),
            "proxy_rss_before_mb": round(base / 2**20, 1),
            "proxy_rss_held_mb": round(held / 2**20, 1),
            "rss_per_idle_connection_kb": round((held - base) / max(1, served) / 1024, 2),
        }
        for w in conns:
            w.transport.abort()
        loop.run_until_complete(asyncio.sleep(0.2))
        loop.close()
    finally:
        err = stop(proxy) + stop(server)
    result["tracebacks"] = err.count("Traceback")
    result["proxy_log_tail"] = err.strip().splitlines()[-5:]
    return result


# ---------------------------------------------------------------------------- blackhole

class BlackHole(threading.Thread):
    """Accepts, reads and discards, never answers."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]

    def run(self):
        loop = asyncio.new_event_loop()

        async def swallow(reader, writer):
            try:
                while await reader.read(1 << 20):
                    pass
            except OSError:
                pass
            writer.close()                       # the client's FIN: close, as servers do

        async def main():
            server = await asyncio.start_server(swallow, sock=self.sock)
            await server.serve_forever()
        loop.run_until_complete(main())


def _routeinfo(opaque):
    from proxy.protocols.rocketmq.samples import remoting_frame
    return remoting_frame(b'{"code":105,"extFields":{"topic":"soak"},"flag":0,"language":'
                          b'"JAVA","opaque":%d,"serializeTypeCurrentRPC":"JSON",'
                          b'"version":433}' % opaque)


def _fly_latency(port, stop_at, results, realtime=False):
    """Child process: FlyMQ LIST_TOPICS round trips, one every millisecond, until
    ``stop_at`` (monotonic); puts the round-trip times (s) and, per round trip, the
    seconds since its first on ``results``."""
    placed(None, realtime)
    lat, at = [], []
    t0 = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while time.monotonic() < stop_at:
        t = time.perf_counter()
        s.sendall(LIST_TOPICS)
        got = b""
        while len(got) < 8 or len(got) < 8 + struct.unpack(">I", got[4:8])[0]:
            got += s.recv(65536)
        lat.append(time.perf_counter() - t)
        at.append(t - t0)
        time.sleep(0.001)
    s.close()
    results.put((lat, at))


def schedstat(pid):
    """(cpu seconds, seconds spent runnable but waiting for a cpu) of pid's main thread."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            run, wait = f.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def blackhole(args, tmp):
    from proxy.protocols.rabbitmq_stream.samples import publish
    _raise_nofile()
    # The proxy gets a cpu of its own, this driver (one GIL for 51 sending threads and the
    # black hole) the other one; the measuring FlyMQ client and its server run there too,
    # in SCHED_FIFO, so their round trips measure the proxy, not their own wait for a cpu
    # behind the driver (bench/run_bench.py pins the same way).
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin and len(cpus) >= 2
    proxy_cpus, driver_cpus = ({cpus[0]}, set(cpus[1:])) if pin else (None, None)
    placed(driver_cpus)                      # before any thread starts: threads inherit it
    hole = BlackHole()
    hole.start()
    fly_port = free_port()
    server = start(FRAMETAP + ["serve", "flymq", "--listen", f"127.0.0.1:{fly_port}",
                               "--log-level", "WARNING"], fly_port, "flymq server",
                   cpus=driver_cpus, realtime=pin)
    ports = {"stream": free_port(), "rocket": free_port(), "fly": free_port()}
    admin = free_port()
    cfg = Path(tmp) / "soak.toml"
    cfg.write_text(f"""[admin]
listen = "127.0.0.1:{admin}"

[proxy]
max_pending_bytes = {args.budget}

[[routes]]
name = "stream"
protocol = "rabbitmq-stream"
listen = "127.0.0.1:{ports['stream']}"
upstream = "127.0.0.1:{hole.port}"
request_timeout = 5

[[routes]]
name = "rocket"
protocol = "rocketmq"
listen = "127.0.0.1:{ports['rocket']}"
upstream = "127.0.0.1:{hole.port}"
request_timeout = 5
[routes.options]
advertise = {{ "10.0.0.7:10911" = "127.0.0.1:20911" }}

[[routes]]
name = "fly"
protocol = "flymq"
listen = "127.0.0.1:{ports['fly']}"
upstream = "127.0.0.1:{fly_port}"
""")
    probe = Path(tmp) / "loopprobe.json"
    cmd = ([sys.executable, str(ROOT / "bench" / "loopprobe.py"), str(probe)] if args.probe
           else FRAMETAP)
    proxy = start(cmd + ["proxy", "-c", str(cfg), "--log-level", "warning"],
                  ports["fly"], "proxy", cpus=proxy_cpus)
    sched0 = schedstat(proxy.pid)
    stop_at = time.monotonic() + args.seconds
    peak = [rss_bytes(proxy.pid)]
    base = peak[0]
    sent = {"stream_ids": 0, "routeinfo": 0}

    def sample_rss():
        while time.monotonic() < stop_at + 1:
            peak[0] = max(peak[0], rss_bytes(proxy.pid))
            time.sleep(0.2)

    def stream_client():
        s = socket.create_connection(("127.0.0.1", ports["stream"]))
        first = 0
        batch = b"".join(publish(first + 10 * i) for i in range(100))
        t0 = time.monotonic()
        while time.monotonic() < stop_at:
            frames = b"".join(publish(first + 10 * i) for i in range(100))
            s.sendall(frames)
            first += 1000
            sent["stream_ids"] += 1000
            if args.stream_rate:                 # ids per second per connection
                ahead = first / args.stream_rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        s.close()
        del batch

    def rocket_client():
        s = socket.create_connection(("127.0.0.1", ports["rocket"]))
        opaque = 0
        while time.monotonic() < stop_at and opaque < args.routeinfo:
            s.sendall(b"".join(_routeinfo(opaque + i) for i in range(1000)))
            opaque += 1000
        sent["routeinfo"] = opaque
        s.close()

    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    # the latency client runs in a process of its own: in this one it would wait for the
    # GIL behind the publisher threads and measure that instead of the proxy
    fly = ctx.Process(target=_fly_latency, args=(ports["fly"], stop_at, results, pin))
    fly.start()

    threads = [threading.Thread(target=sample_rss)] + \
        [threading.Thread(target=stream_client) for _ in range(args.stream)] + \
        [threading.Thread(target=rocket_client)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat, at = results.get(timeout=60)
    # the slow round trips' times: a stall while the tables fill (the first seconds) is
    # told from one in the steady state
    slow = sorted(range(len(lat)), key=lat.__getitem__)[-5:][::-1]
    slowest = [(round(lat[i] * 1e3, 2), round(at[i], 2)) for i in slow]
    lat = sorted(lat)
    fly.join(10)
    sched1 = schedstat(proxy.pid)
    text = scrape(admin)
    err = stop(proxy) + stop(server)

    def pct(q):
        return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3, 3) if lat else None
    probed = json.loads(probe.read_text()) if args.probe and probe.exists() else None
    return {
        "seconds": args.seconds, "stream_connections": args.stream,
        "stream_rate_per_connection": args.stream_rate or "flat out",
        "stream_ids_sent": sent["stream_ids"], "routeinfo_sent": sent["routeinfo"],
        "budget_mb": round(args.budget / 2**20, 1),
        "proxy_rss_start_mb": round(base / 2**20, 1),
        "proxy_rss_peak_mb": round(peak[0] / 2**20, 1),
        "limit_mb (budget + 64 + start)": round((args.budget + base) / 2**20 + 64, 1),
        "pending_bytes_mb": round((metric(text, "frametap_pending_bytes") or 0) / 2**20, 1),
        "overflow_stream": metric(text, "frametap_protocol_errors_total", route="stream",
                                  reason="in_flight_overflow"),
        "overflow_rocket": metric(text, "frametap_protocol_errors_total", route="rocket",
                                  reason="in_flight_overflow"),
        "timeouts_stream": metric(text, "frametap_request_timeouts_total", route="stream"),
        "fly_round_trips": len(lat), "fly_p50_ms": pct(0.5), "fly_p99_ms": pct(0.99),
        "fly_max_ms": round(lat[-1] * 1e3, 3) if lat else None,
        "fly_slowest_ms_at_s": slowest,
        "pinned": f"proxy on cpu {sorted(proxy_cpus)}, driver on {sorted(driver_cpus)}"
                  if pin else False,
        "proxy_cpu_s": round(sched1[0] - sched0[0], 1),
        "proxy_runqueue_wait_s": round(sched1[1] - sched0[1], 2),
        "tracebacks": err.count("Traceback"),
        **({"probe": probed} if args.probe else {}),
    }


def _settle(admin, timeout=60.0):
    """Wait until the proxy has no open connection (every fuzz client closed its own);
    returns the connections still open when ``timeout`` ran out (0 normally)."""
    deadline = time.monotonic() + timeout
    while True:
        active = metric(scrape(admin, 30), "frametap_connections_active") or 0
        if not active or time.monotonic() >= deadline:
            return active
        time.sleep(0.2)


def _fractions(text):
    """--checkpoints "0.25,0.5": fractions of --frames, each in (0, 1]."""
    try:
        out = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        out = None
    if out is None or not all(0 < f <= 1 for f in out):
        raise argparse.ArgumentTypeError(f"want fractions in (0, 1] such as 0.25,0.5, "
                                         f"not {text!r}")
    return out


def _checkpoints(fractions, frames):
    """Frame counts per protocol at which RSS is read: the fractions of ``frames``, and
    ``frames`` itself."""
    return sorted({max(1, int(f * frames)) for f in fractions} | {frames})


def proxyfuzz(args, tmp):
    """RSS is read only when the proxy has no connection open (after the warm-up and at
    every checkpoint), so growth compares like with like: what closed connections left
    behind, not the connections that happened to be open at that moment."""
    import random
    sys.path.insert(0, str(ROOT / "bench"))
    from fuzz_twins import _corpus, _mutate
    from proxy import protocols
    _raise_nofile()
    hole = BlackHole()
    hole.start()
    specs = list(protocols.specs())
    ports = {s.name: free_port() for s in specs}
    admin = free_port()
    cfg = Path(tmp) / "fuzz.toml"
    cfg.write_text(f'[admin]\nlisten = "127.0.0.1:{admin}"\n' + "".join(
        f'\n[[routes]]\nname = "{n}"\nprotocol = "{n}"\nlisten = "127.0.0.1:{p}"\n'
        f'upstream = "127.0.0.1:{hole.port}"\nrequest_timeout = 2\n'
        for n, p in ports.items()))
    proxy = start(FRAMETAP + ["proxy", "-c", str(cfg), "--log-level", "warning"],
                  admin, "proxy")
    corpora = {s.name: _corpus(s) for s in specs}
    sent = {n: 0 for n in ports}
    failed = {n: 0 for n in ports}           # cases whose connect or send failed
    lock = threading.Lock()
    peak = [0]
    running = threading.Event()

    def watch():                             # peak of open connections, twice a second
        while running.is_set():
            try:
                peak[0] = max(peak[0], metric(scrape(admin, 30),
                                              "frametap_connections_active") or 0)
            except OSError:
                pass
            time.sleep(0.5)

    def worker(seed, name, target):
        rng = random.Random(seed)
        corpus = corpora[name]
        while True:
            with lock:
                if sent[name] + failed[name] >= target:
                    break
            picks = [rng.choice(corpus) for _ in range(rng.randrange(1, 9))]
            data = b"".join(_mutate(rng, f) if rng.random() < 0.5 else f for _d, f in picks)
            ok = True
            try:                                 # one case per connection: a mutated
                with socket.create_connection(   # length cannot swallow the next case
                        ("127.0.0.1", ports[name]), 5) as sock:
                    sock.sendall(data)
            except ConnectionError:
                pass                             # the proxy closed it first: sent
            except OSError:
                ok = False                       # never connected (timeout): not sent
            with lock:
                if ok:
                    sent[name] += len(picks)
                else:
                    failed[name] += len(picks)

    def run_to(target, phase):
        running.set()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        threads = [threading.Thread(target=worker, args=(f"{phase}:{i}:{n}", n, target))
                   for n in ports for i in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        running.clear()
        watcher.join()
        still_open = _settle(admin)
        time.sleep(1.5)                      # a sweep or two after the last close
        text = scrape(admin)
        row = {"frames_per_protocol": target,
               "rss_mb": round(rss_bytes(proxy.pid) / 2**20, 1),
               "connections": int(metric(text, "frametap_connections_total") or 0),
               "peak_open": int(peak[0]), "open_after_settle": int(still_open)}
        peak[0] = 0
        return row, text

    t0 = time.perf_counter()
    start_rss = rss_bytes(proxy.pid)
    warm, _ = run_to(min(args.warmup, args.frames), "warm")
    rows = []
    for k, mark in enumerate(_checkpoints(args.checkpoints, args.frames)):
        if mark <= warm["frames_per_protocol"]:
            continue
        row, text = run_to(mark, k)
        row["growth_mb"] = round(row["rss_mb"] - warm["rss_mb"], 1)
        closed = row["connections"] - warm["connections"]
        row["kb_per_closed_connection"] = round(
            (row["rss_mb"] - warm["rss_mb"]) * 1024 / max(1, closed), 3)
        rows.append(row)
    if not rows:                             # --frames within the warm-up
        text = scrape(admin)
    end = rows[-1] if rows else warm
    err = stop(proxy)
    growths = [r["growth_mb"] for r in rows]
    return {
        "frames_sent": sent, "frames_not_sent (connect failed)": failed,
        "seconds": round(time.perf_counter() - t0, 1),
        "proxy_rss_start_mb": round(start_rss / 2**20, 1),
        "warmup": warm,
        "checkpoints": rows,
        "rss_growth_mb": round(end["rss_mb"] - warm["rss_mb"], 1),
        "rss_growth_max_mb": max(growths) if growths else 0.0,
        "pending_bytes_end": metric(text, "frametap_pending_bytes"),
        "frames_parsed_c2s": {n: metric(text, "frametap_frames_total", route=n,
                                        direction="c2s") for n in ports},
        "connections": {n: metric(text, "frametap_connections_total", route=n)
                        for n in ports},
        "connections_still_open": {n: metric(text, "frametap_connections_active", route=n)
                                   for n in ports},
        "protocol_errors": {n: metric(text, "frametap_protocol_errors_total", route=n)
                            for n in ports},
        "tracebacks": err.count("Traceback"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("flood", help="many idle connections on one route")
    f.add_argument("--connections", type=int, default=10_000)
    f.add_argument("--nofile", type=int, default=NOFILE,
                   help="the proxy's open-file limit (default 65536, or the hard limit)")
    f.add_argument("--wait", type=float, default=30,
                   help="seconds a client waits for its answer (default 30)")
    b = sub.add_parser("blackhole", help="upstreams that never answer")
    b.add_argument("--seconds", type=float, default=30)
    b.add_argument("--stream", type=int, default=50)
    b.add_argument("--routeinfo", type=int, default=10_000_000)
    b.add_argument("--stream-rate", type=int, default=0,
                   help="publishing ids per second per Stream connection (0: flat out)")
    b.add_argument("--budget", type=int, default=256 * 2**20)
    b.add_argument("--probe", action="store_true",
                   help="instrument the proxy's loop (bench/loopprobe.py): loop lag, and the "
                        "cpu time of every read, expire() call, sweep slice and gc pass")
    b.add_argument("--no-pin", dest="pin", action="store_false",
                   help="do not pin the proxy to one cpu and the driver to the others")
    z = sub.add_parser("proxyfuzz", help="mutated frames through a running proxy")
    z.add_argument("--frames", type=int, default=1_000_000, help="per protocol")
    z.add_argument("--workers", type=int, default=4, help="clients per protocol")
    z.add_argument("--warmup", type=int, default=10_000,
                   help="frames per protocol before the baseline RSS is read (default "
                        "10000)")
    z.add_argument("--checkpoints", type=_fractions, default=[0.25, 0.5],
                   help="fractions of --frames at which RSS is read too, after the "
                        "proxy's connections have closed (default 0.25,0.5; the end "
                        "always)")
    args = ap.parse_args(argv)
    import tempfile
    try:
        if args.what == "flood":
            result = flood(args)
        elif args.what == "proxyfuzz":
            with tempfile.TemporaryDirectory() as tmp:
                result = proxyfuzz(args, tmp)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                result = blackhole(args, tmp)
    except RuntimeError as exc:          # a process that would not start: one line
        print(f"soak {args.what}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
