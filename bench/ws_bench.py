"""fleximq over WebSocket: frametap's WebSocket route against a pass-through relay of the
same WebSocket bytes, in counted instructions per request (issue 23: >= 0.9x).

Counted, not timed: the machine this runs on is shared, so wall-clock throughput would
measure the neighbours.  Each proxy in turn (``frametap proxy --protocol fleximq
--listen ws://... --upstream ws://...`` and ``bench/passthrough.py``, the bare uvloop
relay that shuffles the same bytes without reading them; and, to tell the WebSocket
layer's share from the fleximq parser's, frametap's plain-TCP fleximq route relaying the
bare frames) runs under callgrind, as
bench/guard.py runs the proxy: one client connection per size, lockstep batches (the
client writes ``batch`` masked WebSocket frames, each one binary message holding one
fleximq REQ, in one write(), and reads all the answers, unmasked frames each holding a
REP, before the next write), counters zeroed and dumped around windows of ``n`` batches
(vgdb), the figure the median window's instructions less an empty window's, per
request.  Speed ratio = pass-through instructions / frametap instructions.

The backend (in this process, not counted) answers the upgrade and then one REP frame
per request it receives (requests have a fixed size, so it counts bytes instead of
parsing).

    python bench/ws_bench.py                 # 64 B, 1 KiB, 16 KiB payloads
    python bench/ws_bench.py --sizes 64      # one size
    python bench/ws_bench.py --json out.json

``--timed`` measures throughput instead, the way bench/fleximq_bench.py does for TCP:
bench/fxload.c (C backend and pipelined client, ``--ws-key``/``--ws-accept``: each REQ one
masked binary message, each REP one unmasked) with 16 connections x 32 REQs in flight,
256-byte payloads; the proxy pinned to cpu 0, client and backend to cpu 1; pass-through
and frametap alternating, repeated; medians, the run-to-run range, and the proxies' CPU
seconds per request (steadier than req/s on a shared machine).

    python bench/ws_bench.py --timed --repeats 5 --seconds 4

Needs valgrind (callgrind, vgdb) for the counted mode, a C compiler for the timed one;
exit 2 when missing.  Results also go to bench/results/ws.json (ws_timed.json).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO_DIR))
import guard as g  # noqa: E402  (callgrind windows, process helpers)

from proxy.protocols.fleximq import codec  # noqa: E402

TARGET = 0.9
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
KEY = base64.b64encode(b"frametap-ws-benc").decode()
SHAPES = {64: (16, 200, 20), 1024: (16, 100, 10), 16384: (8, 40, 5)}  # batch, warmup, n
WINDOWS = 5


def ws_frame(payload: bytes, mask: bytes | None) -> bytes:
    n = len(payload)
    b1 = 0x80 if mask else 0
    if n < 126:
        head = struct.pack(">BB", 0x82, b1 | n)
    elif n < 65536:
        head = struct.pack(">BBH", 0x82, b1 | 126, n)
    else:
        head = struct.pack(">BBQ", 0x82, b1 | 127, n)
    if not mask:
        return head + payload
    key = (mask * (n // 4 + 1))[:n]
    body = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    return head + mask + body


def rid(i: int) -> str:
    return "01H2XQMGPE7ZPXXNKQD9XE8S%02d" % i


def request(size: int, i: int = 0, ws: bool = True) -> bytes:
    """One binary message holding one fleximq REQ (id ``rid(i)``) of ``size`` payload
    bytes (``ws=False``: the bare fleximq frame): every request of a size has the same
    length."""
    header = {"routing": [{"client_id": 1001, "path": "/bench"}],
              "reqrep": {"type": "request", "id": rid(i)}}
    frame = codec.encode(codec.REQ, 1000, header, raw_payload=b"x" * size)
    return ws_frame(frame, b"\x5a\x17\xc3\x01") if ws else frame


def reply(i: int, ws: bool = True) -> bytes:
    frame = codec.rep(1001, 1000, rid(i), payload={"ok": True})
    return ws_frame(frame, None) if ws else frame


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise g.GuardError("connection closed during the WebSocket upgrade")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


class Backend:
    """Answers the upgrade, then one REP frame per ``req_len`` bytes received."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.req_len = self.req_len_tcp = 0
        self.batch = 1
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            first = conn.recv(4, socket.MSG_PEEK)
            if first != b"GET ":                   # a bare fleximq client (--tcp)
                return self._answer(conn, 0, False)
            head, rest = _read_head(conn)
            key = [ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n")
                   if ln.lower().startswith(b"sec-websocket-key:")][0]
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                         b"\r\n\r\n")
            self._answer(conn, len(rest), True)
        except (OSError, IndexError):
            pass
        finally:
            conn.close()

    def _answer(self, conn, pending, ws):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        seq = 0
        replies = [reply(i, ws) for i in range(self.batch)]
        req_len = self.req_len if ws else self.req_len_tcp
        try:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                pending += len(data)
                k, pending = divmod(pending, req_len)
                out = []
                for _ in range(k):                 # the REP of each REQ, ids in order
                    out.append(replies[seq % self.batch])
                    seq += 1
                if out:
                    conn.sendall(b"".join(out))
        except OSError:
            pass
        finally:
            conn.close()


class Client:
    def __init__(self, port: int, size: int, batch: int, proc, ws: bool = True):
        deadline = time.monotonic() + 180
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port), timeout=180)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise g.GuardError("cannot connect to the proxy") from None
                time.sleep(0.2)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.batch = b"".join(request(size, i, ws) for i in range(batch))
        self.want = len(reply(0, ws)) * batch
        self.buf = bytearray(self.want)
        self.done = 0
        self.n = batch
        if not ws:
            return
        self.sock.sendall(("GET /fx HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n" % (port, KEY)).encode())
        head, rest = _read_head(self.sock)
        if not head.startswith(b"HTTP/1.1 101"):
            raise g.GuardError("upgrade refused: %r" % head[:80])

    def run(self, batches: int) -> None:
        view = memoryview(self.buf)
        for _ in range(batches):
            self.sock.sendall(self.batch)
            got = 0
            while got < self.want:
                n = self.sock.recv_into(view[got:])
                if n == 0:
                    raise g.GuardError("the proxy closed the connection")
                got += n
            self.done += self.n

    def close(self):
        self.sock.close()


def measure(which: str, backend: Backend, sizes: list, workdir: Path) -> dict:
    tool = g.Callgrind(workdir)
    port = g.free_port()
    if which == "frametap":
        argv = [sys.executable, "-m", "proxy", "proxy", "--protocol", "fleximq",
                "--listen", f"ws://127.0.0.1:{port}/fx",
                "--upstream", f"ws://127.0.0.1:{backend.port}/fx", "--log-level", "warning"]
    elif which == "frametap-tcp":
        argv = [sys.executable, "-m", "proxy", "proxy", "--protocol", "fleximq",
                "--listen", f"127.0.0.1:{port}",
                "--upstream", f"127.0.0.1:{backend.port}", "--log-level", "warning"]
    else:
        argv = [sys.executable, str(BENCH_DIR / "passthrough.py"), "--listen",
                f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{backend.port}"]
    logfile = workdir / f"{which}.log"
    g.log(f"{which}: starting under callgrind (10-40 s)")
    with open(logfile, "wb") as out:
        proc = g.subprocess.Popen(tool.wrap(argv), cwd=REPO_DIR, env=g.proxy_env(REPO_DIR),
                                  stdout=out, stderr=g.subprocess.STDOUT)
    tool.pid = proc.pid
    results = {}
    try:
        for size in sizes:
            batch, warmup, n = SHAPES[size]
            backend.req_len, backend.batch = len(request(size)), batch
            backend.req_len_tcp = len(request(size, ws=False))
            client = Client(port, size, batch, proc, ws=which != "frametap-tcp")
            client.run(warmup)
            tool.start()
            empty = tool.stop()["instructions"]
            values = []
            for _ in range(WINDOWS):
                tool.start()
                client.run(n)
                values.append((tool.stop()["instructions"] - empty) / (n * batch))
            client.close()
            results[size] = {"median": statistics.median(values),
                             "windows": [round(v) for v in values]}
            g.log(f"{which}: {size:>6} B  {statistics.median(values):>10,.0f} "
                  f"instructions/request  [windows {min(values):,.0f}-{max(values):,.0f}]")
    except BaseException:
        print(logfile.read_text(errors="replace")[-2000:], file=sys.stderr)
        raise
    finally:
        g.stop(proc)
    return results


def timed(repeats: int, seconds: int) -> int:
    """Throughput of the WebSocket route against the pass-through (see --timed)."""
    import fleximq_bench as fb
    import run_bench as rb
    key = base64.b64encode(os.urandom(16)).decode()
    accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
    work = Path(tempfile.mkdtemp(prefix="ws-timed-"))
    runs = []
    try:
        exe = fb.build(work)
        port = rb.free_port()
        server = g.subprocess.Popen(rb.pinned(rb.LOAD_CPU, [
            str(exe), "server", "--port", str(port), "--ws-accept", accept]))
        try:
            rb.wait_port(port, server, 10, "fxload server", work / "server.log")
            for rep in range(repeats):
                order = ["passthrough", "frametap"][::(-1 if rep % 2 else 1)]
                for which in order:
                    listen = rb.free_port()
                    admin = None
                    if which == "passthrough":
                        argv = [sys.executable, str(BENCH_DIR / "passthrough.py"), "--listen",
                                f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{port}"]
                    else:
                        admin = rb.free_port()
                        argv = [sys.executable, "-m", "proxy", "proxy", "--protocol", "fleximq",
                                "--listen", f"ws://127.0.0.1:{listen}/fx", "--upstream",
                                f"ws://127.0.0.1:{port}/fx", "--admin", f"127.0.0.1:{admin}",
                                "--log-level", "warning"]
                    logfile = work / f"{which}-{listen}.log"
                    with open(logfile, "wb") as out:
                        proc = g.subprocess.Popen(rb.pinned(rb.PROXY_CPU, argv), cwd=REPO_DIR,
                                                  stdout=out, stderr=g.subprocess.STDOUT,
                                                  env=rb.frametap_env())
                    try:
                        rb.wait_port(listen, proc, 30, which, logfile)
                        if admin is not None:
                            rb.wait_ready(f"http://127.0.0.1:{admin}/readyz", proc, 30, logfile)
                        cpu0 = rb.proc_cpu_seconds(proc.pid)
                        res = g.subprocess.run(rb.pinned(rb.LOAD_CPU, [
                            str(exe), "client", "--port", str(listen), "--conns", "16",
                            "--depth", "32", "--size", "256", "--seconds", str(seconds),
                            "--warmup", "1", "--ws-key", key]),
                            capture_output=True, text=True, timeout=seconds + 60)
                        line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
                        if not line:
                            raise rb.BenchError(f"{which}: fxload client: {res.stderr[-300:]}")
                        r = json.loads(line[-1])
                        cpu1 = rb.proc_cpu_seconds(proc.pid)
                        total = r["requests"] * (seconds + 1) / seconds
                        r["proxy_cpu_us_per_req"] = 1e6 * (cpu1 - cpu0) / total
                        if admin is not None:
                            _, text = rb.http_get(f"http://127.0.0.1:{admin}/metrics")
                            frames = rb.metric_sum(text, "frametap_frames_total",
                                                   direction="c2s", opcode="REQ") or 0
                            errs = rb.metric_sum(text, "frametap_protocol_errors_total") or 0
                            r["saw_all"] = frames >= r["requests"] and errs == 0
                    finally:
                        rb.stop(proc)
                    r["proxy"] = which
                    runs.append(r)
                    print(f"[ws] rep {rep + 1}/{repeats} {which:12s} {r['rps']:>10,.0f} req/s  "
                          f"p50 {r['p50_us']} us  p99 {r['p99_us']} us  proxy cpu "
                          f"{r['proxy_cpu_us_per_req']:.2f} us/req", flush=True)
        finally:
            rb.stop(server)
    except rb.BenchError as exc:
        print(f"ws_bench: {exc}", file=sys.stderr)
        return 1
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    out = {}
    for w in ("passthrough", "frametap"):
        mine = [r for r in runs if r["proxy"] == w]
        out[w] = {k: {"median": statistics.median([r[k] for r in mine]),
                      "range": [min(r[k] for r in mine), max(r[k] for r in mine)]}
                  for k in ("rps", "p50_us", "proxy_cpu_us_per_req")}
    ratio = out["frametap"]["rps"]["median"] / out["passthrough"]["rps"]["median"]
    cpu_ratio = (out["passthrough"]["proxy_cpu_us_per_req"]["median"] /
                 out["frametap"]["proxy_cpu_us_per_req"]["median"])
    saw = all(r.get("saw_all") for r in runs if r["proxy"] == "frametap")
    print(f"[ws] 16 conns x 32 deep, 256 B: frametap ws {out['frametap']['rps']['median']:,.0f} "
          f"req/s, pass-through {out['passthrough']['rps']['median']:,.0f}: ratio {ratio:.3f} "
          f"(CPU per request ratio {cpu_ratio:.3f}; target >= {TARGET}); the parser saw every "
          f"frame: {'yes' if saw else 'NO'}")
    (BENCH_DIR / "results").mkdir(exist_ok=True)
    (BENCH_DIR / "results" / "ws_timed.json").write_text(json.dumps(
        {"ratio": ratio, "cpu_ratio": cpu_ratio, "target": TARGET, "summary": out,
         "runs": runs}, indent=1) + "\n")
    return 0 if ratio >= TARGET and saw else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--sizes", default="64,1024,16384",
                    help="fleximq payload sizes, comma-separated (of 64, 1024, 16384)")
    ap.add_argument("--json", metavar="PATH", help="also write the results here")
    ap.add_argument("--timed", action="store_true",
                    help="throughput with bench/fxload.c instead of counted instructions")
    ap.add_argument("--repeats", type=int, default=3, help="--timed: rounds (3)")
    ap.add_argument("--seconds", type=int, default=4, help="--timed: seconds a run (4)")
    args = ap.parse_args(argv)
    if args.timed:
        return timed(args.repeats, args.seconds)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        if not sizes or any(s not in SHAPES for s in sizes):
            raise ValueError
    except ValueError:
        print(f"ws_bench: --sizes: expected some of {', '.join(map(str, SHAPES))} "
              f"(got {args.sizes!r})", file=sys.stderr)
        return 2
    try:
        g.need_tools()
    except g.GuardError as exc:
        print(f"ws_bench: {exc}", file=sys.stderr)
        return 2
    backend = Backend()
    with tempfile.TemporaryDirectory(prefix="ws-bench-") as tmp:
        out = {}
        for which in ("passthrough", "frametap", "frametap-tcp"):
            work = Path(tmp) / which
            work.mkdir()
            out[which] = measure(which, backend, sizes, work)
    report = {"unit": "instructions per request (callgrind, proxy process)",
              "target": TARGET, "sizes": {}}
    ok = True
    for size in sizes:
        pt, ft = out["passthrough"][size]["median"], out["frametap"][size]["median"]
        tcp = out["frametap-tcp"][size]["median"]
        ratio = pt / ft
        ok &= ratio >= TARGET
        report["sizes"][str(size)] = {"passthrough": out["passthrough"][size],
                                      "frametap": out["frametap"][size],
                                      "frametap_tcp": out["frametap-tcp"][size],
                                      "ratio": round(ratio, 3),
                                      "websocket_layer": round(ft - tcp)}
        print(f"{size:>6} B payload: pass-through {pt:>9,.0f}  frametap ws {ft:>9,.0f}  "
              f"(fleximq over TCP {tcp:>9,.0f}: the WebSocket layer {ft - tcp:,.0f})  "
              f"instructions/request  ratio {ratio:.3f} (target >= {TARGET})")
    results = BENCH_DIR / "results"
    results.mkdir(exist_ok=True)
    for path in [results / "ws.json"] + ([Path(args.json)] if args.json else []):
        path.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
