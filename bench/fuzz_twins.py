"""Fuzz every protocol's parser twins in process: mutated frames through the compiled
parser and its pure-Python twin, which must agree and never raise.

Each case takes 1-8 frames from the protocol's corpus (its golden conversations, its
garbage cases and its benchmark samples), mutates some (a byte set at random, a length
field's bytes, a cut, an insertion, a frame repeated, bytes swapped), cuts the stream
into random reads and feeds both twins, then closes them. Counted: frames fed,
exceptions escaping ``feed``/``close`` (must be 0) and cases where the twins' counters,
return values or fatal error differ (must be 0). A failing case is printed (hex) and
the run goes on.

    python bench/fuzz_twins.py [--protocol NAME|all] [--frames N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _corpus(spec) -> list[tuple[int, bytes]]:
    conf = spec.load_conformance()
    out = []
    for conv in conf.conversations():
        out.extend((d, bytes(f)) for d, f in conv.steps)
    for g in conf.garbage():
        out.append((g.direction, bytes(g.data)))
    samples = spec.load_samples()
    _desc, reqs, resps = samples.bench_frames(16, 64)
    out.extend((0, bytes(f)) for f in reqs[:16])
    out.extend((1, bytes(f)) for f in resps[:16])
    return [(d, f) for d, f in out if f]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.randrange(7)
        if not b:
            b = bytearray(rng.randbytes(rng.randrange(1, 16)))
            continue
        k = rng.randrange(len(b))
        if op == 0:                                    # one byte at random
            b[k] = rng.randrange(256)
        elif op == 1:                                  # a length-ish field: extremes
            v = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0xFFFFFFFF, len(b)))
            w = rng.choice((1, 2, 4))
            b[k:k + w] = v.to_bytes(8, "big")[-w:]
        elif op == 2:                                  # cut
            del b[rng.randrange(len(b)):]
        elif op == 3:                                  # insertion
            b[k:k] = rng.randbytes(rng.randrange(1, 9))
        elif op == 4:                                  # deletion
            del b[k:k + rng.randrange(1, 9)]
        elif op == 5:                                  # swap two bytes
            j = rng.randrange(len(b))
            b[k], b[j] = b[j], b[k]
        else:                                          # bit flip
            b[k] ^= 1 << rng.randrange(8)
    return bytes(b)


def _splits(rng: random.Random, data: bytes) -> list[bytes]:
    out, k = [], 0
    while k < len(data):
        n = rng.choice((1, 3, 7, 64, 4096, 1 << 20))
        out.append(data[k:k + n])
        k += n
    return out


def _run(stats_cls, parser_cls, name, reads, limits):
    stats = stats_cls("fuzz", name)
    p = parser_cls(stats, None, 30.0, {})
    if limits:
        p.fifo_limit, p.map_limit = limits
    returns = []
    for d, piece in reads:
        returns.append(p.feed(d, piece))
        if p.error is not None:
            break
    p.close()
    s = stats.snapshot()
    counters = {k: s[k] for k in ("frames", "frame_bytes", "messages", "responses",
                                  "timeouts", "unmatched", "in_flight", "errors", "bytes")}
    counters["hist"] = {k: sum(v[0]) for k, v in s["hist"].items()}
    err = p.error
    return counters, returns, None if err is None else (err.reason, err.direction, err.offset)


def fuzz(name: str, frames: int, seed: int, out=sys.stdout) -> dict:
    from proxy import framing_py, protocols
    from proxy import _framing
    spec = protocols.load(name)
    c_cls = spec.load_parser(pure_python=False)
    py_cls = spec.load_parser(pure_python=True)
    corpus = _corpus(spec)
    rng = random.Random(seed)
    fed = cases = raised = differ = 0
    started = time.perf_counter()
    while fed < frames:
        picks = [rng.choice(corpus) for _ in range(rng.randrange(1, 9))]
        steps = [(d, _mutate(rng, f) if rng.random() < 0.5 else f) for d, f in picks]
        if rng.random() < 0.1:
            steps.append(rng.choice(steps))
        reads = []
        for d, f in steps:
            reads.extend((d, piece) for piece in _splits(rng, f))
        limits = rng.choice((None, None, (3, 3), (1, 2)))
        results = []
        for stats_cls, parser_cls in ((_framing.RouteStats, c_cls),
                                      (framing_py.RouteStats, py_cls)):
            try:
                results.append(_run(stats_cls, parser_cls, name, reads, limits))
            except Exception as exc:           # an escaping exception is a defect
                raised += 1
                results.append(("raised", type(exc).__name__, str(exc)))
        if results[0] != results[1]:
            differ += 1
            if differ <= 3:
                print(f"  {name}: twins differ on case {cases}: "
                      f"{[(d, f.hex()) for d, f in steps]}", file=out)
        fed += len(steps)
        cases += 1
    secs = time.perf_counter() - started
    return {"protocol": name, "frames": fed, "cases": cases, "raised": raised,
            "differ": differ, "seconds": round(secs, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default="all")
    ap.add_argument("--frames", type=int, default=10_000_000,
                    help="mutated frames per protocol (default 10,000,000)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    from proxy import protocols
    names = [s.name for s in protocols.specs()] if args.protocol == "all" else [args.protocol]
    bad = 0
    for name in names:
        r = fuzz(name, args.frames, args.seed)
        print(f"{r['protocol']:16s} {r['frames']:>11,} frames in {r['cases']:,} cases, "
              f"{r['seconds']} s: {r['raised']} exceptions, {r['differ']} twin "
              f"disagreements", flush=True)
        bad += r["raised"] + r["differ"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
