"""Parser microbenchmarks: each compiled parser against its pure-Python twin.

For every protocol found in proxy/protocols/ (its ``PROTOCOL`` descriptor), the
protocol's ``samples.bench_frames(n, size)`` gives 4096 request frames (64-byte
payloads where the protocol has a payload size) and their 4096 responses. Both
streams are cut into 64 KiB reads the way a socket delivers them (so frames straddle
reads) and interleaved causally: a response is fed only after its request. Times
``parser.feed(direction, chunk)`` over that schedule, best of N trials, pinned to one
cpu. Request and response frames both count.

Targets (compiled frames/s, compiled / pure-Python ratio) are each protocol's
``samples.TARGET_FPS`` and ``samples.TARGET_RATIO``: flymq >= 10 M frames/s and 20x,
rabbitmq-stream >= 3 M and 20x, rocketmq >= 1 M and 10x.

    python bench/parser_bench.py [--protocol NAME|all] [--quick]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import gc
import json
import os
import sys
import time
from pathlib import Path

C2S, S2C = 0, 1
FRAMES_PER_SIDE = 4096
PAYLOAD = 64
READ_SIZE = 64 * 1024


def build_schedule(reqs: list[bytes], resps: list[bytes]) -> tuple[list[tuple[int, bytes]], int]:
    """(direction, chunk) reads: c2s in 64 KiB reads, each followed by the
    responses to every request completed so far (also in <= 64 KiB reads).
    ``resps[i]`` answers ``reqs[i]``."""
    n = len(reqs)
    c2s, s2c = b"".join(reqs), b"".join(resps)
    req_ends = list(itertools.accumulate(map(len, reqs)))
    resp_ends = [0] + list(itertools.accumulate(map(len, resps)))
    schedule: list[tuple[int, bytes]] = []
    sent_resp = 0
    for start in range(0, len(c2s), READ_SIZE):
        end = min(start + READ_SIZE, len(c2s))
        schedule.append((C2S, c2s[start:end]))
        answerable = resp_ends[bisect.bisect_right(req_ends, end)]
        while sent_resp < answerable:
            step = min(READ_SIZE, answerable - sent_resp)
            schedule.append((S2C, s2c[sent_resp:sent_resp + step]))
            sent_resp += step
    if sent_resp != len(s2c):
        raise RuntimeError(f"schedule covers {sent_resp} of {len(s2c)} response bytes")
    return schedule, 2 * n


def verify(parser_cls, stats_cls, schedule, frames_per_pass: int, protocol: str) -> None:
    """One untimed pass: every read must be accepted whole and, where the
    stats expose ``snapshot()``, every frame counted and every request answered."""
    stats = stats_cls(route="bench", protocol=protocol)
    parser = parser_cls(stats)
    for i, (direction, chunk) in enumerate(schedule):
        took = parser.feed(direction, chunk)
        if took != len(chunk):
            raise SystemExit(f"parser_bench: {parser_cls.__module__}.{parser_cls.__name__}.feed "
                             f"accepted {took} of {len(chunk)} bytes at read {i} "
                             f"(direction {direction}): protocol error on valid frames")
    snapshot = getattr(stats, "snapshot", None)
    if callable(snapshot):
        counted = sum(snapshot().get("frames", {}).values())
        if counted != frames_per_pass:
            raise SystemExit(f"parser_bench: {parser_cls.__module__}.{parser_cls.__name__} counted "
                             f"{counted} frames, expected {frames_per_pass}")
        snap = snapshot()
        if snap["in_flight"] or snap["unmatched"] or snap["errors"]:
            raise SystemExit(f"parser_bench: {parser_cls.__name__} left in_flight="
                             f"{snap['in_flight']} unmatched={snap['unmatched']} "
                             f"errors={snap['errors']}")


def time_parser(parser_cls, stats_cls, schedule, frames_per_pass: int, trials: int,
                min_time: float, protocol: str) -> dict:
    """Best-of-``trials`` frames/s; each trial feeds the schedule ``loops`` times."""
    def trial(loops: int) -> float:
        parser = parser_cls(stats_cls(route="bench", protocol=protocol))
        feed = parser.feed
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            for _ in range(loops):
                for direction, chunk in schedule:
                    feed(direction, chunk)
            return time.perf_counter() - t0
        finally:
            gc.enable()

    loops = 1
    elapsed = trial(loops)
    while elapsed < min_time:  # calibrate so a trial lasts at least min_time
        loops = max(loops + 1, int(loops * min_time / max(elapsed, 1e-6) * 1.2))
        elapsed = trial(loops)
    times = [elapsed] + [trial(loops) for _ in range(trials - 1)]
    frames = frames_per_pass * loops
    fps = [frames / t for t in times]
    return {"best_fps": max(fps), "median_fps": sorted(fps)[len(fps) // 2], "loops": loops,
            "frames_per_trial": frames, "trials_fps": fps}


def is_compiled(cls) -> bool:
    mod = sys.modules.get(cls.__module__)
    return bool(mod and getattr(mod, "__file__", "") and not mod.__file__.endswith((".py", ".pyc")))


def import_frametap():
    """Import the protocol registry, from an install or from the repo this file sits in."""
    # This benchmark compares both parsers, so the pure-Python switch must be off.
    if os.environ.pop("FRAMETAP_NO_EXTENSIONS", None):
        print("note: ignoring FRAMETAP_NO_EXTENSIONS (both parsers are measured here)")
    try:
        import proxy.protocols  # noqa: F401
    except ImportError:
        # not installed: an in-place build in the repo this file sits in
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from proxy import protocols
    return protocols


def main(argv: list[str] | None = None) -> int:
    protocols = import_frametap()
    names = protocols.names()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", type=int, default=0, help="cpu to pin to (default 0)")
    ap.add_argument("--trials", type=int, default=5, help="timed trials, best is reported (default 5)")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per trial at least (default 0.3)")
    ap.add_argument("--quick", action="store_true", help="3 trials of >= 0.1 s")
    ap.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--protocol", default="all", choices=["all"] + names,
                    help="which parser to measure (default all)")
    args = ap.parse_args(argv)
    if args.quick:
        args.trials, args.min_time = 3, 0.1

    result: dict = {"pass": False}

    def finish(code: int) -> int:
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
        return code

    chosen = names if args.protocol == "all" else [args.protocol]
    try:
        from proxy.framing import RouteStats
        from proxy.framing_py import RouteStats as PyRouteStats
        benches = {}
        for name in chosen:
            spec = protocols.load(name)
            benches[name] = (spec.load_parser(pure_python=False),
                             spec.load_parser(pure_python=True), spec.load_samples())
    except ImportError as exc:
        result["error"] = f"cannot import frametap's parser: {exc}"
        print(f"parser_bench: {result['error']}\n  build/install frametap first (e.g. `pip install -e .`) "
              f"and run with that environment's python ({sys.executable} now)", file=sys.stderr)
        return finish(2)

    try:
        os.sched_setaffinity(0, {args.cpu})
        pinned = f"pinned to cpu {args.cpu}"
    except (AttributeError, OSError) as exc:
        pinned = f"not pinned ({exc})"

    all_ok = True
    result = {"pinned": pinned, "protocols": {}}
    for protocol in chosen:
        parser_cls, py_cls, samples = benches[protocol]
        target_fps, target_ratio = samples.TARGET_FPS, samples.TARGET_RATIO
        what, reqs, resps = samples.bench_frames(FRAMES_PER_SIDE, PAYLOAD)
        schedule, frames_per_pass = build_schedule(reqs, resps)
        nbytes = sum(len(c) for _, c in schedule)
        print(f"[{protocol}] {what}, {nbytes:,} bytes in {len(schedule)} reads of <= 64 KiB; "
              f"{pinned}")
        compiled_ok = is_compiled(parser_cls) and parser_cls is not py_cls
        if not compiled_ok:
            print(f"WARNING: {parser_cls.__module__}.{parser_cls.__name__} is not the compiled parser")
        verify(parser_cls, RouteStats, schedule, frames_per_pass, protocol)
        verify(py_cls, PyRouteStats, schedule, frames_per_pass, protocol)
        comp = time_parser(parser_cls, RouteStats, schedule, frames_per_pass, args.trials,
                           args.min_time, protocol)
        pure = time_parser(py_cls, PyRouteStats, schedule, frames_per_pass, args.trials,
                           args.min_time, protocol)
        ratio = comp["best_fps"] / pure["best_fps"]
        fps_ok = comp["best_fps"] >= target_fps
        ratio_ok = ratio >= target_ratio

        def mbps(fps: float) -> float:
            return fps / frames_per_pass * nbytes / 1e6

        print(f"  compiled     {comp['best_fps'] / 1e6:8.2f} M frames/s  ({mbps(comp['best_fps']):,.0f} MB/s, "
              f"best of {args.trials}, median {comp['median_fps'] / 1e6:.2f} M)")
        print(f"  pure-Python  {pure['best_fps'] / 1e6:8.2f} M frames/s  ({mbps(pure['best_fps']):,.0f} MB/s, "
              f"best of {args.trials}, median {pure['median_fps'] / 1e6:.2f} M)")
        print(f"  compiled >= {target_fps / 1e6:.0f} M frames/s: {'PASS' if fps_ok else 'FAIL'}")
        print(f"  compiled / pure-Python = {ratio:.1f}x (target >= {target_ratio:.0f}x): "
              f"{'PASS' if ratio_ok else 'FAIL'}")
        ok = fps_ok and ratio_ok and compiled_ok
        all_ok = all_ok and ok
        result["protocols"][protocol] = {
            "compiled": comp, "pure_python": pure, "ratio": ratio,
            "frames_per_pass": frames_per_pass, "bytes_per_pass": nbytes,
            "reads_per_pass": len(schedule), "compiled_parser_in_use": compiled_ok,
            "targets": {"compiled_fps": target_fps, "ratio": target_ratio}, "pass": ok}
    result["pass"] = all_ok
    return finish(0 if all_ok else 1)


if __name__ == "__main__":
    sys.exit(main())
