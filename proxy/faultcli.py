"""``frametap faults list|add|remove``: a running proxy's rules and toxics, through its
fault API (proxy/api.py), for people who do not want curl; and the small HTTP client
that ``frametap load --frametap-fault`` (loadgen/faultplugin.py) shares.

    frametap faults list --api 127.0.0.1:8474
    frametap faults add --api 127.0.0.1:8474 --route rocketmq \\
        'error status=SYSTEM_BUSY opcode=SEND_MESSAGE_V2 probability=0.05 name=busy'
    frametap faults add --api 127.0.0.1:8474 --route rocketmq 'latency latency=100'
    frametap faults remove --api 127.0.0.1:8474 --route rocketmq busy

A mistake (a bad spec, an unknown route, a rule the proxy refuses) is one line and exit
status 2; a proxy that cannot be reached is one line and exit status 1.
"""

import json
import urllib.error
import urllib.parse
import urllib.request

from proxy.errors import ConfigError
from proxy.faultspec import SHORT_HELP, parse_short_spec

__all__ = ["FaultApi", "ApiUnreachable", "add_parser"]

DEFAULT_API = "127.0.0.1:8474"
TIMEOUT = 10.0


class ApiUnreachable(Exception):
    """The API did not answer (refused, timed out): exit status 1."""


class ApiRefused(ConfigError):
    """The API answered with an error (``{"error", "status"}``): one line, exit 2."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class FaultApi:
    """A client of one proxy's fault API at ``HOST:PORT`` (urllib: no event loop, so a
    gevent-patched Locust process can use it too)."""

    def __init__(self, address, timeout=TIMEOUT):
        from proxy.addresses import format_address, parse_address
        self.address = format_address(parse_address(address, "--api"))
        self.base = "http://" + self.address
        self.timeout = timeout

    def call(self, method, path, body=None):
        """JSON in, JSON out (None for 204); ApiRefused for an error answer,
        ApiUnreachable when nothing answers."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json",
                                                  "User-Agent": "frametap-faults"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode("utf-8", "replace").strip()[:200] or exc.reason
            raise ApiRefused(exc.code, str(message)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            reason = getattr(reason, "strerror", None) or str(reason)
            raise ApiUnreachable(f"cannot reach the fault API at {self.address}: {reason} "
                                 "(is the proxy running with --api or [toxiproxy] "
                                 "listen?)") from None
        return json.loads(raw) if raw.strip() else None

    @staticmethod
    def _q(name):
        return urllib.parse.quote(name, safe="")

    def routes(self):
        return self.call("GET", "/api/v1/routes")

    def add(self, route, kind, data):
        """Add a rule (``kind`` "rule") or a toxic to ``route``; returns its JSON."""
        if kind == "rule":
            return self.call("POST", f"/api/v1/routes/{self._q(route)}/faults", data)
        return self.call("POST", f"/proxies/{self._q(route)}/toxics", data)

    def remove(self, route, kind, name):
        if kind == "rule":
            return self.call("DELETE", f"/api/v1/routes/{self._q(route)}/faults/"
                                       f"{self._q(name)}")
        return self.call("DELETE", f"/proxies/{self._q(route)}/toxics/{self._q(name)}")


def _one_route(api, given):
    """The route a command acts on: ``--route``, or the proxy's only route."""
    routes = api.routes()
    names = [r["name"] for r in routes]
    if given is not None:
        if given not in names:
            raise ConfigError(f"--route {given!r}: no such route (the proxy has: "
                              f"{', '.join(names) or 'none'})")
        return next(r for r in routes if r["name"] == given)
    if len(routes) != 1:
        raise ConfigError(f"--route is required: the proxy has {len(routes)} routes "
                          f"({', '.join(names)})")
    return routes[0]


def _summary(kind, item):
    if kind == "toxic":
        attrs = " ".join(f"{k}={v}" for k, v in item["attributes"].items())
        return f"{item['type']} {item['stream']} toxicity={item['toxicity']:g} {attrs}"
    match = item["match"]
    parts = [item["action"]["type"]]
    parts += [f"{k}={v}" for k, v in item["action"].items() if k != "type"]
    parts += [f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in match.items()]
    parts += [f"{k}={v}" for k, v in item["trigger"].items()]
    return " ".join(parts)


def cmd_list(args):
    api = FaultApi(args.api)
    routes = api.routes()
    if args.route is not None:
        routes = [_one_route(api, args.route)]
    if args.json:
        print(json.dumps(routes, indent=2))
        return 0
    rows = [(r["name"], kind, item["name"], _summary(kind, item))
            for r in routes for kind, key in (("rule", "faults"), ("toxic", "toxics"))
            for item in r[key]]
    if not rows:
        print(f"no rules or toxics on {len(routes)} route(s): "
              f"{', '.join(r['name'] for r in routes)}")
        return 0
    head = ("ROUTE", "KIND", "NAME", "WHAT")
    widths = [max(len(str(x[i])) for x in rows + [head]) for i in range(3)]
    for row in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[3])
    return 0


def cmd_add(args):
    # one argument is the whole spec ('error status=X probability=0.1'); several are
    # its words as the shell split them (error "message=server busy")
    import shlex
    kind, data = parse_short_spec(args.spec[0] if len(args.spec) == 1 else
                                  shlex.join(args.spec))
    api = FaultApi(args.api)
    route = _one_route(api, args.route)
    try:
        made = api.add(route["name"], kind, data)
    except ApiRefused as exc:
        raise ConfigError(f"route {route['name']!r}: {exc}") from None
    print(f"added {kind} {made['name']!r} to route {route['name']!r}: {_summary(kind, made)}")
    return 0


def cmd_remove(args):
    api = FaultApi(args.api)
    route = _one_route(api, args.route)
    rules = {r["name"] for r in route["faults"]}
    toxics = {t["name"] for t in route["toxics"]}
    for name in args.names:
        kind = args.kind
        if kind is None:
            if name in rules and name in toxics:
                raise ConfigError(f"{name!r}: route {route['name']!r} has a rule and a toxic "
                                  "of that name; say which with --rule or --toxic")
            kind = "rule" if name in rules else "toxic" if name in toxics else None
            if kind is None:
                raise ConfigError(f"{name!r}: route {route['name']!r} has no rule or toxic "
                                  f"of that name (rules: {', '.join(sorted(rules)) or 'none'}"
                                  f"; toxics: {', '.join(sorted(toxics)) or 'none'})")
        try:
            api.remove(route["name"], kind, name)
        except ApiRefused as exc:
            raise ConfigError(f"route {route['name']!r}: {exc}") from None
        print(f"removed {kind} {name!r} from route {route['name']!r}")
    return 0


def _run(func):
    def run(args):
        try:
            return func(args)
        except ApiUnreachable as exc:
            import sys
            print(f"frametap: error: {exc}", file=sys.stderr)
            return 1
    return run


def add_parser(sub):
    """``frametap faults`` and its verbs, on the CLI's subparsers ``sub``."""
    f = sub.add_parser(
        "faults", help="list, add or remove a running proxy's fault rules and toxics",
        description="Change a running proxy's fault rules (opcode-aware: delay, drop, close, "
                    "error) and Toxiproxy toxics through its fault API (frametap proxy --api "
                    "HOST:PORT, or [toxiproxy] listen in the config).",
        epilog="SPEC: " + SHORT_HELP + ". Examples: 'error status=SYSTEM_BUSY "
               "opcode=SEND_MESSAGE_V2 probability=0.05 name=busy', 'delay ms=50 "
               "jitter_ms=5', 'latency latency=100 stream=upstream'.")
    verbs = f.add_subparsers(dest="verb", required=True, metavar="VERB")

    def common(p):
        p.add_argument("--api", metavar="HOST:PORT", default=DEFAULT_API,
                       help=f"the proxy's fault API (default {DEFAULT_API})")
        p.add_argument("--route", metavar="ROUTE",
                       help="route name (default: the proxy's only route)")

    ls = verbs.add_parser("list", help="every route's rules and toxics",
                          description="List the rules and toxics of every route (or --route).")
    common(ls)
    ls.add_argument("--json", action="store_true", help="print the API's JSON")
    ls.set_defaults(func=_run(cmd_list))
    add = verbs.add_parser("add", help="add a rule or a toxic",
                           description="Add a rule or a toxic to a route.",
                           epilog="SPEC: " + SHORT_HELP + ". Examples: 'error "
                                  "status=SYSTEM_BUSY opcode=SEND_MESSAGE_V2 probability=0.05 "
                                  "name=busy', 'drop opcode=PULL_MESSAGE nth=10', 'latency "
                                  "latency=100 jitter=10 stream=upstream', '{\"type\": "
                                  "\"timeout\", \"attributes\": {\"timeout\": 0}}'.")
    common(add)
    add.add_argument("spec", nargs="+", metavar="SPEC",
                     help="the rule or toxic: short form or a JSON object")
    add.set_defaults(func=_run(cmd_add))
    rm = verbs.add_parser("remove", help="remove rules or toxics by name",
                          description="Remove rules or toxics from a route, by name.")
    common(rm)
    which = rm.add_mutually_exclusive_group()
    which.add_argument("--rule", dest="kind", action="store_const", const="rule",
                       help="NAME is a rule")
    which.add_argument("--toxic", dest="kind", action="store_const", const="toxic",
                       help="NAME is a toxic")
    rm.add_argument("names", nargs="+", metavar="NAME")
    rm.set_defaults(func=_run(cmd_remove), kind=None)
    return f
