"""The ``frametap`` command line (docs/design.md, "Command line").

User errors (bad arguments, bad config, a port in use) print one line and exit 2,
never a traceback.
"""

import argparse
import logging
import os
import sys

from proxy import protocols
from proxy.errors import ConfigError
from proxy.paths import locustfile_path


def servers():
    """{protocol name: ProtocolSpec} of the protocols with a reference server."""
    return {spec.name: spec for spec in protocols.specs() if spec.server}


def _setup_logging(level):
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _add_proxy(sub):
    p = sub.add_parser(
        "proxy", help="run the proxy",
        description="Run the frametap proxy, from a TOML config file (-c) or for one route "
                    "given on the command line.",
        epilog="example: frametap proxy --protocol flymq --listen 127.0.0.1:19092 "
               "--upstream 127.0.0.1:9092 --admin 127.0.0.1:9400")
    p.add_argument("-c", "--config", metavar="FILE", help="TOML config (see README)")
    p.add_argument("--protocol",
                   help="protocol of the single route: " + ", ".join(protocols.names()))
    p.add_argument("--listen", metavar="ADDR", help="where clients connect: HOST:PORT, "
                   "[V6]:PORT, unix:/path/to.sock, or ws://HOST:PORT/PATH (fleximq)")
    p.add_argument("--upstream", metavar="ADDR", help="the real server: HOST:PORT, "
                   "[V6]:PORT, unix:/path/to.sock, or ws://HOST:PORT/PATH (fleximq)")
    p.add_argument("--admin", metavar="HOST:PORT",
                   help="admin HTTP address for /metrics, /healthz, /readyz")
    p.add_argument("--framelog", metavar="DIR", help="frame log directory")
    p.add_argument("--api", metavar="HOST:PORT",
                   help="serve the Toxiproxy-compatible fault API (and frametap's "
                        "/api/v1/routes/ROUTE/faults) on HOST:PORT ([toxiproxy] listen)")
    p.add_argument("--run-id", metavar="ID",
                   help="frame-log run id (default: a new one per process)")
    p.add_argument("--name", default=None, help="route name (default: the protocol name)")
    p.add_argument("--max-frame-bytes", type=int, default=None,
                   help="reject frames declaring more than this (default: protocol limit)")
    p.add_argument("--request-timeout", type=float, default=30.0,
                   help="seconds before an unanswered request counts as a timeout (30)")
    p.add_argument("--drain-timeout", type=float, default=None,
                   help="on SIGTERM/SIGINT, seconds to let open connections finish (10)")
    p.add_argument("--ready-file", metavar="PATH",
                   help="once every listener is bound, write JSON naming them to PATH "
                        "(atomically; removed on exit): {\"pid\": N, \"routes\": {ROUTE "
                        "NAME: ADDR}, \"admin\": ADDR or null, \"api\": ADDR or null}. "
                        "With port 0 in a listen "
                        "address the kernel picks a free port and this file says which")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_proxy)


#: config path -> the flag that sets it in single-route mode (errors name the flag)
FLAG_NAMES = {
    "routes[0].protocol": "--protocol",
    "routes[0].listen": "--listen",
    "routes[0].upstream": "--upstream",
    "routes[0].name": "--name",
    "routes[0].max_frame_bytes": "--max-frame-bytes",
    "routes[0].request_timeout": "--request-timeout",
    "admin.listen": "--admin",
    "framelog.dir": "--framelog",
    "framelog.run_id": "--run-id",
    "proxy.shutdown_timeout": "--drain-timeout",
    "toxiproxy.listen": "--api",
}


def build_config(args):
    """The Config for ``frametap proxy``: from -c FILE, or from the single-route flags."""
    from proxy.config import RANGES, config_from_dict, load_config
    if args.run_id is not None and args.framelog is None and not args.config:
        raise ConfigError("--run-id needs --framelog DIR (the run id names frame-log rows)")
    single = [args.protocol, args.listen, args.upstream]
    if args.config:
        if any(v is not None for v in single):
            raise ConfigError("use either -c/--config or --protocol/--listen/--upstream, not both")
        cfg = load_config(args.config)
        if args.admin is not None:
            from proxy.addresses import parse_address
            cfg.admin_listen = parse_address(args.admin, "--admin", allow_port_zero=True)
            cfg.key_names["admin.listen"] = "--admin"
        if args.api is not None:
            from proxy.addresses import parse_address
            cfg.toxiproxy_listen = parse_address(args.api, "--api", allow_port_zero=True)
            cfg.key_names["toxiproxy.listen"] = "--api"
        if args.drain_timeout is not None:
            cfg.shutdown_timeout = RANGES["proxy.shutdown_timeout"].check(
                args.drain_timeout, "--drain-timeout")
        if args.run_id is not None and args.framelog is None and cfg.framelog is None:
            raise ConfigError("--run-id needs --framelog DIR or a [framelog] table in "
                              f"{args.config}")
        if args.framelog is not None or args.run_id is not None:
            from proxy.config import FramelogConfig
            fl = cfg.framelog or FramelogConfig()
            if args.framelog is not None:
                fl.dir = args.framelog
                cfg.key_names["framelog.dir"] = "--framelog"
            if args.run_id is not None:
                fl.run_id = args.run_id
            cfg.framelog = fl
        return cfg
    missing = [flag for flag, v in zip(("--protocol", "--listen", "--upstream"), single)
               if v is None]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)} (or give a config file with -c)")
    route = {"protocol": args.protocol, "listen": args.listen, "upstream": args.upstream,
             "request_timeout": args.request_timeout}
    route["name"] = args.protocol if args.name is None else args.name
    if args.max_frame_bytes is not None:
        route["max_frame_bytes"] = args.max_frame_bytes
    data = {"routes": [route]}
    if args.admin is not None:
        data["admin"] = {"listen": args.admin}
    if args.framelog is not None:
        data["framelog"] = {"dir": args.framelog}
        if args.run_id is not None:
            data["framelog"]["run_id"] = args.run_id
    if args.drain_timeout is not None:
        data["proxy"] = {"shutdown_timeout": args.drain_timeout}
    if args.api is not None:
        data["toxiproxy"] = {"listen": args.api}
    return config_from_dict(data, FLAG_NAMES)


def cmd_proxy(args):
    import uvloop

    from proxy.app import ProxyApp
    cfg = build_config(args)
    _setup_logging(args.log_level)
    uvloop.run(ProxyApp(cfg, ready_file=args.ready_file).run())
    return 0


def cmd_serve(args):
    available = servers()
    if args.protocol not in protocols.names():
        raise ConfigError(f"serve: protocol {protocols.unavailable_message(args.protocol)}")
    if args.protocol not in available:
        raise ConfigError(f"serve: protocol {args.protocol!r} has no reference server in this "
                          f"build (available: {', '.join(available)})")
    return available[args.protocol].load_server().main(args.args)


def cmd_load(args):
    # loadgen.plugins runs Locust with frametap's options registered first, so that
    # `frametap load --help` lists them (Locust prints --help before the locustfile loads)
    argv = ["loadgen.plugins", "-f", locustfile_path()] + args.args
    os.execvp(sys.executable, [sys.executable, "-m"] + argv)


def _add_analyze(sub):
    from loadgen.analysis.job import DESCRIPTION, EPILOG, add_arguments
    a = sub.add_parser("analyze", help="PySpark analysis of frame logs: tables + report.html",
                       description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(a)
    a.set_defaults(func=cmd_analyze)


def cmd_analyze(args):
    from loadgen.analysis.job import exit_code
    return exit_code(args)


def cmd_demo(args):
    from loadgen import demo
    return demo.main(args.args)


PASSTHROUGH = {"load": cmd_load, "demo": cmd_demo}


def make_parser():
    parser = argparse.ArgumentParser(
        prog="frametap",
        description="Protocol-aware TCP proxy for load testing: decodes every frame, counts "
                    "opcodes and request latency for Prometheus.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_proxy(sub)
    s = sub.add_parser("serve", help="run a reference server (frametap serve flymq --help)",
                       description="Run the reference server for a protocol.", add_help=True)
    s.add_argument("protocol", help="protocol name: " + ", ".join(servers()))
    s.add_argument("args", nargs=argparse.REMAINDER, help="server options (see its --help)")
    s.set_defaults(func=cmd_serve)
    _add_analyze(sub)
    from proxy.faultcli import add_parser as add_faults
    add_faults(sub)
    ld = sub.add_parser("load", help="run Locust with the packaged locustfile",
                        description="Run Locust with frametap's locustfile; every option after "
                                    "'load' goes to Locust (e.g. --headless -u 10 -t 30s "
                                    "--host 127.0.0.1:19092).", add_help=False)
    ld.add_argument("args", nargs=argparse.REMAINDER)
    ld.set_defaults(func=cmd_load)
    d = sub.add_parser("demo", help="reference servers + proxy + headless Locust run + report",
                       add_help=False,
                       description="See `frametap demo --help`.")
    d.add_argument("args", nargs=argparse.REMAINDER)
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = make_parser()
    if argv and argv[0] in PASSTHROUGH:
        # every option after these belongs to the sub-tool, --help included
        args = argparse.Namespace(func=PASSTHROUGH[argv[0]], args=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except ConfigError as exc:
        print(f"frametap: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
