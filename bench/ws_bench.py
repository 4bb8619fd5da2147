"""fleximq over WebSocket: frametap's WebSocket route against a pass-through relay of the
same WebSocket bytes, in counted instructions per request (issue 23: >= 0.9x).

Counted, not timed: the machine this runs on is shared, so wall-clock throughput would
measure the neighbours.  Each proxy in turn (``frametap proxy --protocol fleximq
--listen ws://... --upstream ws://...`` and ``bench/passthrough.py``, the bare uvloop
relay that shuffles the same bytes without reading them) runs under callgrind, as
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

Needs valgrind (callgrind, vgdb); exit 2 when missing.  Results also go to
bench/results/ws.json.
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


def request(size: int, i: int = 0) -> bytes:
    """One binary message holding one fleximq REQ (id ``rid(i)``) of ``size`` payload
    bytes: every request of a size has the same length."""
    header = {"routing": [{"client_id": 1001, "path": "/bench"}],
              "reqrep": {"type": "request", "id": rid(i)}}
    return ws_frame(codec.encode(codec.REQ, 1000, header, raw_payload=b"x" * size),
                    b"\x5a\x17\xc3\x01")


def reply(i: int) -> bytes:
    return ws_frame(codec.rep(1001, 1000, rid(i), payload={"ok": True}), None)


REPLY_LEN = len(reply(0))


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
        self.req_len = 0
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
            head, rest = _read_head(conn)
            key = [ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n")
                   if ln.lower().startswith(b"sec-websocket-key:")][0]
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                         b"\r\n\r\n")
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending, seq = len(rest), 0
            replies = [reply(i) for i in range(self.batch)]
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                pending += len(data)
                k, pending = divmod(pending, self.req_len)
                out = []
                for _ in range(k):                 # the REP of each REQ, ids in order
                    out.append(replies[seq % self.batch])
                    seq += 1
                if out:
                    conn.sendall(b"".join(out))
        except (OSError, IndexError):
            pass
        finally:
            conn.close()


class Client:
    def __init__(self, port: int, size: int, batch: int, proc):
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
        self.sock.sendall(("GET /fx HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n" % (port, KEY)).encode())
        head, rest = _read_head(self.sock)
        if not head.startswith(b"HTTP/1.1 101"):
            raise g.GuardError("upgrade refused: %r" % head[:80])
        self.batch = b"".join(request(size, i) for i in range(batch))
        self.want = REPLY_LEN * batch
        self.buf = bytearray(self.want)
        self.done = 0
        self.n = batch

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
            client = Client(port, size, batch, proc)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--sizes", default="64,1024,16384",
                    help="fleximq payload sizes, comma-separated (of 64, 1024, 16384)")
    ap.add_argument("--json", metavar="PATH", help="also write the results here")
    args = ap.parse_args(argv)
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
        for which in ("passthrough", "frametap"):
            work = Path(tmp) / which
            work.mkdir()
            out[which] = measure(which, backend, sizes, work)
    report = {"unit": "instructions per request (callgrind, proxy process)",
              "target": TARGET, "sizes": {}}
    ok = True
    for size in sizes:
        pt, ft = out["passthrough"][size]["median"], out["frametap"][size]["median"]
        ratio = pt / ft
        ok &= ratio >= TARGET
        report["sizes"][str(size)] = {"passthrough": out["passthrough"][size],
                                      "frametap": out["frametap"][size],
                                      "ratio": round(ratio, 3)}
        print(f"{size:>6} B payload: pass-through {pt:>9,.0f}  frametap ws {ft:>9,.0f}  "
              f"instructions/request  ratio {ratio:.3f} (target >= {TARGET})")
    results = BENCH_DIR / "results"
    results.mkdir(exist_ok=True)
    for path in [results / "ws.json"] + ([Path(args.json)] if args.json else []):
        path.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
