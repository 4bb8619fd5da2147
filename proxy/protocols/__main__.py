"""``python -m proxy.protocols``: list the protocols of this build, or (``--check-build``)
import every compiled extension and fail with one line if one is missing."""

import argparse
import sys

from proxy import protocols


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m proxy.protocols",
                                description="List the protocols this build found in "
                                            "proxy/protocols/, or check its compiled extensions.")
    p.add_argument("--check-build", action="store_true",
                   help="import every compiled extension (proxy/**/*.pyx) and every "
                        "protocol's compiled parser; exit 1 naming the first one missing")
    args = p.parse_args(argv)
    if args.check_build:
        try:
            checked = protocols.check_build()
        except ImportError as exc:
            print(f"frametap build check: {exc}", file=sys.stderr)
            return 1
        print(f"frametap build check: {len(checked)} compiled modules import: "
              f"{', '.join(checked)}")
        return 0
    for spec in protocols.specs():
        print(f"{spec.name:<18} {spec.package:<34} port {spec.default_port}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
