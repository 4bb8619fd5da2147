"""Instructions per frame of the compiled parsers, counted by valgrind's callgrind.

Wall-clock times on a shared, noisy machine say little about a small change to the hot
path; instruction counts do. For each protocol the parser_bench schedule (4096 requests
and their 4096 responses, in 64 KiB reads) is fed ``--passes`` times through fresh
compiled parsers, under callgrind, once with 1 pass and once with 1 + ``--passes``: the
difference divided by the extra passes is the cost of one pass, free of start-up and
import costs. Needs ``valgrind`` on PATH.

``--framelog`` also counts the parser with a frame log: ``on`` (every frame recorded and
appended to a FrameLogBuffer, the hot path's share of full logging) and ``unsampled``
(the buffer exists and the route is registered, but the connection was not sampled, as
the relay leaves a connection that ``[framelog] sample`` passed over: it must cost what
``off`` costs).

    python bench/callgrind_parsers.py [--protocol NAME|all] [--passes N]
                                      [--framelog off,unsampled,on]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _feed(protocol: str, passes: int, framelog: str = "off") -> None:
    """Child: build the schedule, then feed it ``passes`` times."""
    from parser_bench import FRAMES_PER_SIDE, PAYLOAD, build_schedule
    from proxy import protocols
    proto = protocols.load(protocol)
    samples = proto.load_samples()
    _desc, reqs, resps = samples.bench_frames(FRAMES_PER_SIDE, PAYLOAD)
    schedule, _frames = build_schedule(reqs, resps)
    from proxy._framing import FrameLogBuffer, RouteStats
    parser_cls = proto.load_parser(pure_python=False)
    stats = RouteStats("bench", protocol)
    buf = route = None
    if framelog != "off":
        buf = FrameLogBuffer(64, 32768)
        route = buf.add_route(stats)
    for _ in range(passes):
        parser = parser_cls(stats, None, 30.0, {})
        if framelog == "on":
            parser.attach_log(buf, route)
        for d, chunk in schedule:
            parser.feed(d, chunk)
        parser.close()
        if framelog == "on":               # the writer's side, outside the hot path
            while (i := buf.take()) >= 0:
                buf.release(i)


def callgrind_total(script: str, args: list, cwd=None) -> int:
    """Instructions callgrind counts for ``python script args...`` (run in ``cwd``):
    the whole process, start-up included (callers subtract two runs)."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, script, *args],
        capture_output=True, text=True, cwd=cwd, env=dict(os.environ, PYTHONHASHSEED="0"))
    m = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"valgrind {script} {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return int(m.group(1))


def _instructions(protocol: str, passes: int, framelog: str = "off") -> int:
    return callgrind_total(__file__, ["--child", protocol, str(passes), framelog])


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        _feed(argv[1], int(argv[2]), argv[3] if len(argv) > 3 else "off")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default="all")
    ap.add_argument("--passes", type=int, default=4, help="extra passes measured (4)")
    ap.add_argument("--framelog", default="off",
                    help="comma list of off,unsampled,on (default off): the parser without "
                         "a frame log, on a connection the sampling passed over, and logged")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.framelog.split(",") if m.strip()]
    if not modes or set(modes) - {"off", "unsampled", "on"}:
        ap.error("--framelog: a comma list of off, unsampled, on")
    from proxy import protocols
    known = [s.name for s in protocols.specs()]
    names = known if args.protocol == "all" else [args.protocol]
    if set(names) - set(known):
        ap.error(f"--protocol: one of {', '.join(known)} or all, not {args.protocol!r}")
    for name in names:
        for mode in modes:
            base = _instructions(name, 1, mode)
            more = _instructions(name, 1 + args.passes, mode)
            per_pass = (more - base) / args.passes
            label = name if modes == ["off"] else f"{name} [framelog {mode}]"
            print(f"{label:30s} {per_pass / 8192:8.1f} instructions/frame "
                  f"({per_pass / 1e6:.2f} M per 8192 frames)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
