"""Runs every protocol's own proxy benchmark (``bench/<package>_bench.py``), one after
the other, so ``make bench`` covers protocols added later without naming them (a
protocol is one folder; see docs/adding-a-protocol.md).  Each benchmark compares
frametap with the pass-through proxy in the same run and prints its own ratios.

    python bench/protocol_benches.py [--only NAME,...] [--list] [-- ARGS for each bench]
"""

import argparse
import os
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))


def benches():
    """(protocol name, script path) for every protocol folder with a bench script."""
    from proxy import protocols
    out = []
    for spec in protocols.specs():
        script = os.path.join(BENCH, spec.package.rpartition(".")[2] + "_bench.py")
        if os.path.exists(script):
            out.append((spec.name, script))
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma list of protocol names to run")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)
    found = benches()
    if args.only:
        want = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = want - {name for name, _ in found}
        if unknown:
            ap.error("--only: no benchmark for %s (have: %s)"
                     % (", ".join(sorted(unknown)), ", ".join(n for n, _ in found)))
        found = [(n, s) for n, s in found if n in want]
    if args.list:
        for name, script in found:
            print(f"{name}\t{os.path.relpath(script)}")
        return 0
    failed = []
    for i, (name, script) in enumerate(found, 1):
        print(f"== [{i}/{len(found)}] {name}: {os.path.relpath(script)}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, script, *extra])
        print(f"== {name}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print("protocol benchmarks that failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
