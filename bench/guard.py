"""frametap's performance guard: instructions and system calls per relayed request.

A deterministic check for CI (issue 19, "a guard that cannot be skipped"). For 64 B,
16 KiB and 1 MiB FlyMQ PRODUCE frames relayed by a real ``frametap proxy`` process
(FlyMQ route, the C backend of bench/flyload.c behind it), it counts

  instructions/request  the proxy's user-space instructions (valgrind --tool=callgrind,
                        every thread), and
  syscalls/request      the proxy's system calls (strace -c -f, every thread),

per relayed request, and compares them with the reference checked into
bench/guard_reference.json. ``64B-log`` is the 64 B load with a frame log on the route
(every frame recorded; bench/discard_writer.py's writer gives the rows back unwritten,
so the figure is the event loop's recording, not pyarrow's Parquet encoding): its
instructions only. A figure more than its tolerance (10 % unless the reference
says otherwise) above the reference fails the guard: exit 1, one line per figure.

Load shape (fixed, so the counts are too): one client connection per size, kept open;
the client writes ``batch`` requests in one write() and reads all their answers before
the next write, so every read the proxy does starts at a frame boundary and sees at
most one batch. 64 B: batches of 16; 16 KiB: batches of 8 (128 KiB a write, bigger
than a 64 KiB read slice); 1 MiB: one request at a time.

Start-up, imports and connection set-up are not counted: on each connection, after a
warm-up, the counters are started at a marker and read at another (callgrind: ``vgdb
zero`` and ``vgdb dump`` on the running proxy; strace: attached with -p, detached), once
with no load (what the markers cost) and then for windows of n batches each (callgrind 5,
strace 9). A window's figure is (its count - the empty window's) / (n * batch). The
instructions figure is the median window's. The system-calls figure is the fewest any
window needed: timing can only add system calls to a window (1 MiB frames arrive while
the proxy reads them, and now and then a read splits in two and costs a read, a write and
an epoll call more; in one reference run at least five of nine windows did), while a
change that costs more calls a frame costs them in every window.

    python bench/guard.py                      # measure this checkout, compare
    python bench/guard.py --tree ../old        # another checkout, built in place
    python bench/guard.py --runs 5             # medians of 5, spread per figure
    python bench/guard.py --update --reason "relay: ... (why the figures moved)"

Needs valgrind, strace (ptrace) and a C compiler; exit 2 when one is missing or the
checkout is not built. Counts depend on the toolchain too (Python, uvloop, Cython, gcc):
a change of those is a reason to re-take the reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from discard_writer import discarded

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
REFERENCE = BENCH_DIR / "guard_reference.json"
DEFAULT_TOLERANCE = 0.10

FLY_MAGIC, FLY_VERSION, OP_PRODUCE = 0xAF, 0x01, 0x01
RESPONSE_BYTES = 43            # flyload server: 8-byte header + 35-byte RecordMetadata
FIGURES = ("instructions_per_request", "syscalls_per_request")
LABEL = {"instructions_per_request": "instructions/request",
         "syscalls_per_request": "syscalls/request"}
#: strace names folded into the breakdown printed beside syscalls/request
GROUPS = {"read": ("read", "readv", "recvfrom", "recvmsg"),
          "write": ("write", "writev", "sendto", "sendmsg"),
          # libuv >= 1.45 batches epoll_ctl changes through io_uring_enter
         "epoll": ("epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl", "io_uring_enter")}


@dataclass(frozen=True)
class Shape:
    name: str
    size: int       # payload bytes of one PRODUCE request
    batch: int      # requests in one client write; all answered before the next write
    warmup: int     # batches before the first marker
    n: int          # batches in one measured window
    framelog: bool = False   # every frame recorded in the frame log (instructions only)


#: measured windows per size and tool: the instructions figure is the median window's,
#: the system-calls figure the fewest (module docstring). strace windows cost ~10 ms,
#: callgrind's 0.3-2 s.
WINDOWS = {"callgrind": 5, "strace": 9}

SHAPES = [
    Shape("64B", 64, batch=16, warmup=16, n=128),
    Shape("16KiB", 16 * 1024, batch=8, warmup=8, n=48),
    Shape("1MiB", 1024 * 1024, batch=1, warmup=4, n=16),
    # the 64 B load with a frame log on the route, its writer discarding the rows
    # (bench/discard_writer.py): what the event loop's recording costs, free of the
    # Parquet writer's work (pyarrow's, which moves with each pyarrow release)
    Shape("64B-log", 64, batch=16, warmup=16, n=128, framelog=True),
]


def shape_figures(shape: Shape) -> tuple:
    """The figures measured for a shape: the frame-log ones count instructions only."""
    return FIGURES[:1] if shape.framelog else FIGURES


class GuardError(RuntimeError):
    """Setup failed (exit 2): say what and how to fix it."""


def log(msg: str) -> None:
    print(f"guard: {msg}", flush=True)


# --------------------------------------------------------------------------- setup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_tools() -> None:
    missing = [t for t in ("valgrind", "vgdb", "strace") if shutil.which(t) is None]
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        missing.append("gcc")
    if missing:
        raise GuardError(f"missing {', '.join(missing)} on PATH: apt-get install "
                         + " ".join(sorted({"vgdb": "valgrind"}.get(t, t) for t in missing)))


def tool_versions() -> dict:
    def first_line(argv):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "?"
    probe = ("import sys, uvloop, Cython; print(sys.version.split()[0], uvloop.__version__, "
             "Cython.__version__)")
    py, uv, cy = (first_line([sys.executable, "-c", probe]).split() + ["?"] * 3)[:3]
    return {"python": py, "uvloop": uv, "cython": cy,
            "valgrind": first_line(["valgrind", "--version"]),
            "strace": first_line(["strace", "-V"]),
            "gcc": first_line(["gcc", "-dumpfullversion"]),
            "kernel": os.uname().release}


def git_commit(tree: Path) -> dict:
    def git(*args):
        r = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "proxy", "setup.py")
    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "subject": git("log", "-1", "--format=%s")[:200],
            # the measured code: the last commit that changed it, and proxy/'s tree hash
            # (equal on every commit with the same proxy/, whatever else changed)
            "code_commit": git("log", "-1", "--format=%H", "--", "proxy", "setup.py"),
            "proxy_tree": git("rev-parse", "HEAD:proxy"),
            "dirty": bool(dirty)}


def sources_of(tree: Path, pyx: Path) -> list[Path]:
    """A .pyx, its own .pxd and the .pxd files it cimports from this tree."""
    out = [pyx] + [p for p in [pyx.with_suffix(".pxd")] if p.exists()]
    for line in pyx.read_text(errors="replace").splitlines():
        m = re.match(r"\s*(?:from\s+([\w.]+)\s+cimport|cimport\s+([\w.]+))", line)
        if m:
            dep = tree / ((m.group(1) or m.group(2)).replace(".", "/") + ".pxd")
            if dep.exists():
                out.append(dep)
    return out


def check_build(tree: Path) -> None:
    """The tree's compiled extensions are what ``python -m proxy`` imports there, and are
    newer than their sources: a guard on a stale or pure-Python build measures nothing."""
    probe = ("import sys, proxy.framing as f, proxy.protocols.flymq as p; "
             "print(sys.modules[f.RouteStats.__module__].__file__); "
             "print(sys.modules[p.FlyMQParser.__module__].__file__)")
    res = subprocess.run([sys.executable, "-c", probe], cwd=tree, capture_output=True,
                         text=True, env=proxy_env(tree))
    build = (f"build it in place: cd {tree} && {sys.executable} setup.py build_ext "
             f"--inplace -q  (or pass --build)")
    if res.returncode != 0:
        raise GuardError(f"frametap does not import from {tree}: "
                         f"{(res.stderr.strip().splitlines() or ['?'])[-1]}\n{build}")
    for mod in res.stdout.split():
        path = Path(mod).resolve()
        if not path.name.endswith(".so") or tree.resolve() not in path.parents:
            raise GuardError(f"{tree}: imports {path}, not a compiled extension of this "
                             f"checkout\n{build}")
    for pyx in (tree / "proxy").rglob("*.pyx"):
        sos = list(pyx.parent.glob(pyx.stem + ".*.so"))
        if not sos or min(s.stat().st_mtime for s in sos) < max(
                p.stat().st_mtime for p in sources_of(tree, pyx)):
            raise GuardError(f"{tree}: {pyx.relative_to(tree)} is newer than its build\n{build}")


def build_in_place(tree: Path) -> None:
    log(f"building {tree}'s extensions in place ...")
    res = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"],
                         cwd=tree, capture_output=True, text=True)
    if res.returncode != 0:
        raise GuardError(f"build_ext in {tree} failed:\n{res.stderr[-3000:]}")


def build_flyload(workdir: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    exe = workdir / "flyload"
    res = subprocess.run([gcc, "-O2", "-std=c99", "-Wall", "-o", str(exe),
                          str(BENCH_DIR / "flyload.c")], capture_output=True, text=True)
    if res.returncode != 0:
        raise GuardError(f"building bench/flyload.c failed:\n{res.stderr}")
    return exe


def proxy_env(tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    env.pop("FRAMETAP_NO_EXTENSIONS", None)
    return env


def wait_listening(port: int, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise GuardError(f"{what} exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise GuardError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- the client


def request_frame(size: int) -> bytes:
    """The PRODUCE request flyload's client sends: topic "bench", no key, 'x' values."""
    payload = bytearray(b"x" * size)
    if size >= 19:
        struct.pack_into(">H5sII", payload, 0, 5, b"bench", 0, size - 19)
        struct.pack_into(">I", payload, size - 4, 0xFFFFFFFF)
    return struct.pack(">BBBBI", FLY_MAGIC, FLY_VERSION, OP_PRODUCE, 1, size) + bytes(payload)


class Client:
    """One connection through the proxy, driven in lockstep batches."""

    def __init__(self, port: int, shape: Shape, proxy: subprocess.Popen, timeout: float):
        self.shape, self.proxy = shape, proxy
        self.batch = request_frame(shape.size) * shape.batch
        self.want = RESPONSE_BYTES * shape.batch
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
                break
            except OSError:
                if proxy.poll() is not None or time.monotonic() > deadline:
                    raise GuardError("cannot connect to the proxy") from None
                time.sleep(0.1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(self.want)
        self.done = 0

    def run(self, batches: int) -> None:
        view = memoryview(self.buf)
        for _ in range(batches):
            self.sock.sendall(self.batch)
            got = 0
            while got < self.want:
                try:
                    n = self.sock.recv_into(view[got:])
                except socket.timeout:
                    raise GuardError(f"{self.shape.name}: no answer from the proxy "
                                     f"({got} of {self.want} bytes)") from None
                if n == 0:
                    raise GuardError(f"{self.shape.name}: the proxy closed the connection"
                                     + (f" (exit {self.proxy.returncode})"
                                        if self.proxy.poll() is not None else ""))
                got += n
            # every answer is a FlyMQ frame whose value_size is the request's size
            last = self.buf[-RESPONSE_BYTES:]
            if (self.buf[0] != FLY_MAGIC or last[0] != FLY_MAGIC
                    or struct.unpack_from(">I", last, RESPONSE_BYTES - 4)[0] != self.shape.size):
                raise GuardError(f"{self.shape.name}: unexpected answer {bytes(last[:16]).hex()}")
            self.done += self.shape.batch

    def close(self) -> None:
        self.sock.close()


# --------------------------------------------------------------------------- counters


KEEP_PROFILES = None        # --keep-profiles DIR
ARMED_RULE = False          # --armed-rule: one fault rule armed that never fires
PASSTHROUGH = False         # --passthrough: bench/passthrough.py measured instead

#: the guard's route as a config file (--armed-rule and the frame-log shapes need one)
ROUTE_CONFIG = """\
[[routes]]
name = "guard"
protocol = "flymq"
listen = "127.0.0.1:{port}"
upstream = "127.0.0.1:{upstream}"
"""
#: --armed-rule's addition: one delay rule on CONSUME, an opcode the guard's load never
#: sends (issue 22: an armed rule that never fires on the hot opcode costs at most 10 % on
#: 64 B frames, compared here with the no-rule reference)
ARMED_CONFIG = """
[[routes.faults]]
name = "never"
match = {opcode = ["CONSUME"]}
action = {type = "delay", ms = 10}
"""
#: the frame-log shapes' proxy: every connection recorded (sample 1)
FRAMELOG_CONFIG = """\
[framelog]
dir = "{dir}"

"""


class Callgrind:
    """The proxy under callgrind; a window's instructions are read with vgdb zero/dump."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.prefix = str(workdir / "vgdb")
        self.out = workdir / "callgrind.out"
        self.pid = None
        self.label = "window"                  # names kept profiles

    def wrap(self, argv: list) -> list:
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}",
                "--vgdb=yes", f"--vgdb-prefix={self.prefix}", *argv]

    def _vgdb(self, command: str) -> None:
        res = subprocess.run(["vgdb", f"--vgdb-prefix={self.prefix}", f"--pid={self.pid}",
                              command], capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise GuardError(f"vgdb {command} failed (exit {res.returncode}): "
                             f"{res.stderr.strip()[-500:]}")

    def start(self) -> None:
        self._vgdb("zero")

    def stop(self) -> dict:
        before = set(self.dir.glob("callgrind.out.*"))
        self._vgdb("dump")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for path in set(self.dir.glob("callgrind.out.*")) - before:
                text = path.read_text(errors="replace")
                if "\ntotals:" in text:              # written last: the dump is complete
                    m = re.search(r"^summary:\s*(\d+)", text, re.M)
                    if KEEP_PROFILES is not None:     # --keep-profiles: for callgrind_annotate
                        KEEP_PROFILES.mkdir(parents=True, exist_ok=True)
                        shutil.copy(path, KEEP_PROFILES / f"{self.label}.{path.name}")
                    path.unlink()
                    if m is None:
                        raise GuardError(f"no summary line in {path.name}")
                    return {"instructions": int(m.group(1))}
            time.sleep(0.05)
        raise GuardError("callgrind wrote no dump within 60 s")


class Strace:
    """strace -c -f attached to the running proxy for a window (-p), then detached."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.pid = None
        self.proc = None
        self.k = 0

    def wrap(self, argv: list) -> list:
        return argv

    def start(self) -> None:
        self.k += 1
        self.out = self.dir / f"strace.{self.k}"
        self.proc = subprocess.Popen(["strace", "-c", "-f", "-o", str(self.out),
                                      "-p", str(self.pid)],
                                     stderr=subprocess.PIPE, text=True)
        threads = len(os.listdir(f"/proc/{self.pid}/task"))
        attached, lines = 0, []
        timer = threading.Timer(30, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stderr:   # "Process N attached [with T threads]"
                lines.append(line.strip())
                m = re.search(r"attached(?: with (\d+) threads)?", line)
                if m:
                    attached += int(m.group(1) or 1)
                if attached >= threads or "ptrace" in line or "Operation not permitted" in line:
                    break
        finally:
            timer.cancel()
        if attached < threads:
            self.proc.kill()
            raise GuardError("strace could not attach to the proxy (ptrace; as root, or "
                             "kernel.yama.ptrace_scope=0): " + " | ".join(lines[-3:]))
        # keep draining strace's stderr so it never blocks on a full pipe
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise GuardError("strace did not detach within 60 s") from None
        text = self.out.read_text()
        calls = parse_strace_counts(text)
        if not calls and text.strip():     # an empty window writes nothing at all
            raise GuardError(f"strace -c wrote no counts:\n{text[-1000:]}")
        return {"syscalls": sum(calls.values()), "by_name": calls}


def parse_strace_counts(text: str) -> dict:
    """{syscall: calls} from ``strace -c``'s table (the errors column may be empty)."""
    calls = {}
    for line in text.splitlines():
        tok = line.split()
        # % time  seconds  usecs/call  calls  [errors]  syscall
        if (len(tok) in (5, 6) and tok[-1] != "total" and tok[3].isdigit()
                and re.fullmatch(r"[0-9.]+", tok[0])):
            calls[tok[-1]] = calls.get(tok[-1], 0) + int(tok[3])
    return calls


def window_taken(key: str, values: list) -> int:
    """Index of the window whose figure is the shape's: the median window for
    instructions, the fewest for system calls (timing only ever adds calls: a read that
    splits a 1 MiB frame costs a read, a write and an epoll call more)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[0] if key == "syscalls" else order[len(values) // 2]


def measure_tool(tool, flyload_port: int, tree: Path, shapes: list, tool_name: str,
                 runlabel: str, framelog: bool = False) -> dict:
    """One proxy process under ``tool``; per shape one connection: warm-up, an empty
    window (what the markers cost), then WINDOWS[tool_name] windows of ``shape.n`` batches;
    a window's figure is its count less the empty one's, per request; the shape's figure
    is the median window's (instructions) or the fewest (system calls).
    ``framelog``: the proxy records every frame, its writer discarding the rows."""
    port = free_port()
    head = [sys.executable, "-m", "proxy"]
    if ARMED_RULE or framelog:
        config = tool.dir / f"proxy-{tool_name}{'-log' if framelog else ''}.toml"
        text = ROUTE_CONFIG.format(port=port, upstream=flyload_port)
        if framelog:
            text = FRAMELOG_CONFIG.format(dir=tool.dir / "framelog") + text
            # this checkout's discard_writer, importing the measured tree's proxy (cwd)
            head = [sys.executable, str(BENCH_DIR / "discard_writer.py")]
        config.write_text(text + (ARMED_CONFIG if ARMED_RULE else ""))
        route = ["-c", str(config)]
    else:
        route = ["--protocol", "flymq", "--listen", f"127.0.0.1:{port}",
                 "--upstream", f"127.0.0.1:{flyload_port}"]
    if PASSTHROUGH:             # the baseline relay, the same load (bench/run_bench.py's)
        argv = [sys.executable, str(BENCH_DIR / "passthrough.py"), "--listen",
                f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{flyload_port}"]
    else:
        argv = [*head, "proxy", *route, "--log-level", "warning"]
    argv = tool.wrap(argv)
    logfile = tool.dir / f"proxy-{tool_name}{'-log' if framelog else ''}.log"
    t0 = time.monotonic()
    log(f"{runlabel} {tool_name}: starting the proxy"
        + (" (start-up under callgrind takes 10-40 s)" if tool_name == "callgrind" else ""))
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(argv, cwd=tree, env=proxy_env(tree), stdout=out,
                                stderr=subprocess.STDOUT)
    tool.pid = proc.pid
    results = {}
    try:
        for shape in shapes:
            client = Client(port, shape, proc, timeout=180)
            if not results:
                log(f"{runlabel} {tool_name}: proxy up in {time.monotonic() - t0:.1f} s")
            t1 = time.monotonic()
            client.run(shape.warmup)
            tool.label = shape.name
            tool.start()
            empty = tool.stop()
            windows = []
            for _ in range(WINDOWS[tool_name]):
                tool.start()
                client.run(shape.n)
                windows.append(tool.stop())
            client.close()
            if proc.poll() is not None:
                raise GuardError(f"the proxy died (exit {proc.returncode})")
            reqs = shape.n * shape.batch
            key = "instructions" if "instructions" in empty else "syscalls"
            if min(w[key] for w in windows) <= 0:
                raise GuardError(f"{tool_name} counted nothing in a window of {reqs} requests")
            values = [(w[key] - empty[key]) / reqs for w in windows]
            taken = window_taken(key, values)
            r = {f"{key}_per_request": values[taken],
                 f"{key}_windows": [round(v, 3) for v in values]}
            if key == "syscalls":
                w, names = windows[taken]["by_name"], set(windows[taken]["by_name"])
                r["by_name"] = {k: round((w.get(k, 0) - empty["by_name"].get(k, 0)) / reqs, 3)
                                for k in sorted(names | set(empty["by_name"]))}
            results[shape.name] = r
            extra = ""
            if key == "syscalls":
                extra = "  (" + ", ".join(f"{g} {v:.2f}" for g, v in
                                          group_syscalls(r["by_name"]).items()) + ")"
            log(f"{runlabel} {tool_name}: {shape.name:>5} {fmt(key, values[taken]):>12} "
                f"{key}/request{extra}  [windows {fmt(key, min(values))}-{fmt(key, max(values))}; "
                f"{client.done:,} requests, {time.monotonic() - t1:.1f} s]")
    except BaseException:
        text = logfile.read_text(errors="replace").strip().splitlines()
        if text:
            print("\n".join("    | " + ln for ln in text[-15:]), file=sys.stderr)
        raise
    finally:
        stop(proc)
    if framelog:
        rows = discarded(logfile.read_bytes())
        if rows is None or rows < sum(s.n * s.batch for s in shapes):
            raise GuardError("the frame-log proxy recorded "
                             + (f"only {rows} rows" if rows is not None else "nothing")
                             + f" (see {logfile}); its figure would not be the recording's")
    return results


def load_shapes(shapes: list) -> dict:
    """The load shape as the reference records it (a reference taken with another one
    cannot be compared)."""
    return {s.name: {**{k: v for k, v in asdict(s).items()
                        if k != "name" and (k != "framelog" or v)},
                     "windows": dict(WINDOWS)} for s in shapes}


def fmt(figure: str, value: float) -> str:
    return f"{value:,.1f}" if figure.startswith("instructions") else f"{value:,.3f}"


def group_syscalls(by_name: dict) -> dict:
    out = {g: 0.0 for g in GROUPS}
    out["other"] = 0.0
    for name, v in by_name.items():
        group = next((g for g, names in GROUPS.items() if name in names), "other")
        out[group] += v
    return {g: round(v, 3) for g, v in out.items()}


# --------------------------------------------------------------------------- compare


def measure(tree: Path, shapes: list, runs: int, tools=("callgrind", "strace")) -> dict:
    """{shape: {figure: median, ...}} with each run's values and the spread."""
    per_run = []
    with tempfile.TemporaryDirectory(prefix="frametap-guard-") as tmp:
        work = Path(tmp)
        flyload = build_flyload(work)
        fport = free_port()
        server = subprocess.Popen([str(flyload), "server", "--host", "127.0.0.1",
                                   "--port", str(fport)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_listening(fport, server, 10, "flyload server")
            log(f"flyload backend on 127.0.0.1:{fport}")
            for i in range(runs):
                label = f"[{i + 1}/{runs}]"
                one = {s.name: {} for s in shapes}
                for tool_name in tools:
                    for framelog in (False, True):
                        group = [s for s in shapes if s.framelog == framelog]
                        if not group or (tool_name == "strace" and FIGURES[1]
                                         not in shape_figures(group[0])):
                            continue            # the frame-log shapes: instructions only
                        tool = Callgrind(work) if tool_name == "callgrind" else Strace(work)
                        for name, r in measure_tool(tool, fport, tree, group, tool_name,
                                                    label, framelog).items():
                            one[name].update(r)
                per_run.append(one)
        finally:
            stop(server)
    figures = {}
    for s in shapes:
        f = {}
        for fig in FIGURES:
            if fig not in per_run[0][s.name]:
                continue
            values = [run[s.name][fig] for run in per_run]
            med = statistics.median(values)
            f[fig] = round(med, 3)
            if runs > 1:
                f[fig.replace("_per_request", "_runs")] = [round(v, 3) for v in values]
                f[fig.replace("_per_request", "_spread_pct")] = round(
                    100 * (max(values) - min(values)) / med, 2) if med else 0.0
        by = [run[s.name]["by_name"] for run in per_run if "by_name" in run[s.name]]
        if not by:
            figures[s.name] = f
            continue
        f["syscalls_by_name"] = {k: round(statistics.median(b.get(k, 0) for b in by), 3)
                                 for k in sorted({k for b in by for k in b})}
        f["syscalls_by_group"] = group_syscalls(f["syscalls_by_name"])
        figures[s.name] = f
    return figures


def tolerance(ref: dict, size: str, fig: str) -> float:
    own = ref.get("tolerances", {}).get(size, {}).get(fig)
    return float(own if own is not None else ref.get("tolerance", DEFAULT_TOLERANCE))


def compare(ref: dict, figures: dict) -> tuple[list, list]:
    """(table rows, failure lines)."""
    rows, failures = [], []
    for size, got in figures.items():
        want = ref.get("figures", {}).get(size)
        if want is None:
            failures.append(f"guard: FAIL {size}: no reference figures for this size "
                            f"(take them with --update)")
            continue
        for fig in FIGURES:
            if fig not in got:
                continue
            tol = tolerance(ref, size, fig)
            base, now = want[fig], got[fig]
            change = (now - base) / base if base else float("inf")
            verdict = "ok"
            if change > tol:
                verdict = "FAIL"
                failures.append(
                    f"guard: FAIL {size} {LABEL[fig]}: {fmt(fig, now)} vs {fmt(fig, base)} in the reference "
                    f"({change:+.1%}, tolerance {tol:.0%})")
            elif change < -tol:
                verdict = "better (re-take the reference to keep the gain)"
            rows.append(f"  {size:>5} {LABEL[fig]:<21} {fmt(fig, now):>14} {fmt(fig, base):>14} "
                        f"{change:>+8.1%} {tol:>6.0%}  {verdict}")
    return rows, failures


def passthrough_table(ref: dict, figures: dict, elapsed: float) -> int:
    """--passthrough's output: the pass-through's figures beside the reference's frametap
    figures (a ratio below 1: frametap does more than the bare relay)."""
    print(f"  {'size':>5} {'figure':<21} {'pass-through':>14} {'frametap ref':>14} "
          f"{'ratio':>7}")
    for size, got in figures.items():
        want = ref.get("figures", {}).get(size, {})
        for fig in FIGURES:
            if fig not in got:
                continue
            base = want.get(fig)
            ratio = f"{got[fig] / base:7.3f}" if base else "      -"
            print(f"  {size:>5} {LABEL[fig]:<21} {fmt(fig, got[fig]):>14} "
                  f"{fmt(fig, base) if base else '-':>14} {ratio}")
    log(f"pass-through measured in {elapsed:.0f} s (ratio: pass-through / frametap's "
        f"reference, by count; information)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(REPO_DIR),
                    help="frametap checkout to measure, its extensions built in place "
                         "(default: this one)")
    ap.add_argument("--reference", default=str(REFERENCE),
                    help="reference file (default bench/guard_reference.json)")
    ap.add_argument("--update", action="store_true",
                    help="write the measured figures as the new reference (commit it, "
                         "with the reason, as its own deliberate change)")
    ap.add_argument("--reason", help="why the reference changes (required with --update)")
    ap.add_argument("--runs", type=int, default=1,
                    help="measure N times; figures are medians, the spread is printed (1)")
    ap.add_argument("--sizes",
                    help="comma list of " + ", ".join(s.name for s in SHAPES) + " (all; "
                         "with --passthrough those without a frame log)")
    ap.add_argument("--only", choices=["all", "instructions", "syscalls"], default="all",
                    help="measure one of the two figures (all); for a quick look, not for CI")
    ap.add_argument("--build", action="store_true",
                    help="build the tree's extensions in place first (setup.py build_ext)")
    ap.add_argument("--json", metavar="FILE", help="also write the measured figures here")
    ap.add_argument("--keep-profiles", metavar="DIR", type=Path,
                    help="keep each callgrind window's profile here (callgrind_annotate "
                         "FILE shows which functions a figure's change went to)")
    ap.add_argument("--armed-rule", action="store_true",
                    help="run the proxy with one fault rule armed that never fires (a delay "
                         "on CONSUME; issue 22's target: within 10 %% of the no-rule "
                         "reference at 64 B); cannot be combined with --update")
    ap.add_argument("--passthrough", action="store_true",
                    help="measure bench/passthrough.py (the bare uvloop relay that make bench "
                         "compares frametap with) under the same load, and print each figure "
                         "beside the reference's frametap figure: the relay's cost "
                         "counted rather than timed (information: never fails; 64B, 16KiB, "
                         "1MiB only; cannot be combined with --update)")
    args = ap.parse_args(argv)
    global KEEP_PROFILES, ARMED_RULE, PASSTHROUGH
    KEEP_PROFILES = args.keep_profiles
    ARMED_RULE = args.armed_rule
    PASSTHROUGH = args.passthrough
    if args.update and args.armed_rule:
        ap.error("--armed-rule measures a fault-armed proxy: not a reference")
    if args.passthrough and (args.update or args.armed_rule):
        ap.error("--passthrough measures the baseline relay: not with --update or --armed-rule")
    if args.update and not (args.reason and args.reason.strip()):
        ap.error("--update needs --reason \"...\": the reference changes only deliberately")
    if args.runs < 1:
        ap.error("--runs: at least 1")
    known = {s.name: s for s in SHAPES}
    if args.sizes is None:
        args.sizes = ",".join(s.name for s in SHAPES if not (args.passthrough and s.framelog))
    names = [n.strip() for n in args.sizes.split(",") if n.strip()]
    if not names or set(names) - set(known):
        ap.error(f"--sizes: a comma list of {', '.join(known)}")
    if args.update and (names != list(known) or args.only != "all"):
        ap.error("--update measures every size and figure (leave out --sizes and --only)")
    shapes = [known[n] for n in names]
    if args.passthrough:
        if any(s.framelog for s in shapes):
            ap.error("--passthrough: the pass-through has no frame log (64B, 16KiB, 1MiB)")
    tree = Path(args.tree).resolve()
    ref_path = Path(args.reference)
    started = time.monotonic()
    try:
        need_tools()
        if args.build:
            build_in_place(tree)
        check_build(tree)
        commit = git_commit(tree)
        versions = tool_versions()
        log(f"tree {tree} at {commit['commit'][:10]}{' (proxy/ modified)' if commit['dirty'] else ''}"
            f" {commit['subject'][:70]!r}")
        log("python {python}, uvloop {uvloop}, Cython {cython}, {valgrind}, {strace}".format(
            **versions))
        for s in shapes:
            log(f"{s.name}: {s.warmup} warm-up batches, then windows of {s.n} batches of "
                f"{s.batch} request(s) on one connection (callgrind {WINDOWS['callgrind']}, "
                f"strace {WINDOWS['strace']} windows)")
        figures = measure(tree, shapes, args.runs,
                          {"all": ("callgrind", "strace"), "instructions": ("callgrind",),
                           "syscalls": ("strace",)}[args.only])
    except GuardError as exc:
        print(f"guard: ERROR {exc}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - started
    shape_doc = load_shapes(shapes)
    result = {"tree": str(tree), **commit, "runs": args.runs, "seconds": round(elapsed, 1),
              "versions": versions, "shapes": shape_doc, "figures": figures}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.runs > 1:
        for size, f in figures.items():
            log(f"spread (max - min) / median over {args.runs} runs, {size}: " + ", ".join(
                f"{k.split('_')[0]} {v:.2f} %" for k, v in f.items() if k.endswith("_spread_pct")))

    if args.update:
        old = json.loads(ref_path.read_text()) if ref_path.exists() else {}
        ref = {
            "about": "bench/guard.py's reference: the proxy's instructions and system calls "
                     "per relayed FlyMQ request. CI fails when a figure grows by more than "
                     "its tolerance. Re-take with: bench/guard.py --update --reason \"...\" "
                     "(make guard-update REASON=\"...\") and commit it on its own.",
            "measured_on": {**commit, "date": datetime.datetime.now(datetime.timezone.utc)
                            .strftime("%Y-%m-%d"), "runs": args.runs},
            "reason": args.reason.strip(),
            "tolerance": old.get("tolerance", DEFAULT_TOLERANCE),
            "tolerances": old.get("tolerances", {}),
            "tolerance_notes": old.get("tolerance_notes") or (
                "One tolerance for every figure unless 'tolerances' names a size and figure. "
                "Each figure's *_runs and *_spread_pct show its run-to-run variation when "
                "the reference was taken with --runs > 1."),
            "versions": versions,
            "shapes": shape_doc,
            "figures": figures,
        }
        if commit["dirty"]:
            log("warning: proxy/ has uncommitted changes; the reference names the commit below them")
        ref_path.write_text(json.dumps(ref, indent=2) + "\n")
        log(f"wrote {ref_path} ({elapsed:.0f} s); commit it with the reason")
        return 0

    try:
        ref = json.loads(ref_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"guard: ERROR cannot read the reference {ref_path}: {exc}", file=sys.stderr)
        return 2
    for s in shapes:
        if ref.get("shapes", {}).get(s.name) not in (None, shape_doc[s.name]):
            print(f"guard: ERROR {s.name}: the reference was taken with another load shape "
                  f"({ref['shapes'][s.name]}); re-take it (--update)", file=sys.stderr)
            return 2
    changed = [k for k, v in versions.items()
               if k != "kernel" and ref.get("versions", {}).get(k) not in (None, v)]
    if changed:
        log("note: toolchain differs from the reference's ("
            + ", ".join(f"{k} {ref['versions'][k]} -> {versions[k]}" for k in changed)
            + "): instruction counts may move with it")
    on = ref.get("measured_on", {})
    same = on.get("proxy_tree") and on.get("proxy_tree") == commit["proxy_tree"] and not commit["dirty"]
    log(f"reference: {on.get('commit', '?')[:10]} ({on.get('date', '?')}"
        f"{', the same proxy/ as this tree' if same else ''}): {ref.get('reason', '')[:100]}")
    if PASSTHROUGH:
        return passthrough_table(ref, figures, elapsed)
    rows, failures = compare(ref, figures)
    print(f"  {'size':>5} {'figure':<21} {'measured':>14} {'reference':>14} {'change':>8} "
          f"{'tol':>6}")
    print("\n".join(rows))
    for line in failures:
        print(line)
    log(f"{'FAILED' if failures else 'passed'} in {elapsed:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
