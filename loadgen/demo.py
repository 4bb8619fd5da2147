"""``frametap demo``: reference server + proxy + headless Locust run + per-opcode report,
then the Spark analysis of the run's frame logs (proxy and Locust sides) and report.html.

Every process it starts is its own child and is stopped on exit, Ctrl-C included.
"""

import argparse
import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error

from loadgen import promread
from proxy.framelog import new_run_id
from proxy import protocols
from proxy.paths import locustfile_path
from proxy.runinfo import RunInfo, is_run_file

def expected_failures(protocol):
    """The failures ``protocol``'s users cause on purpose: (Locust name or None for any,
    the start of Locust's error text - the exception's class; "" for any -, the frame-log
    status the proxy gives the answer, why), from ``DEMO_EXPECTED_FAILURES`` in the
    package beside its users module (a package that imports no Locust).  Everything else
    is not expected."""
    return getattr(_users_package(protocol), "DEMO_EXPECTED_FAILURES", ())


def _users_package(protocol):
    """The package beside ``protocol``'s Locust users module (it imports no Locust), or
    None: where a protocol keeps what the demo does with it."""
    spec = protocols.load(protocol)
    if not spec.users:
        return None
    try:
        return importlib.import_module(spec.users.rsplit(".", 1)[0])
    except ImportError:
        return None


#: ``frametap demo --faults``: per protocol, the fault rule armed from the proxy's config
#: file on the route in front of the named listener (issue 22 item 6): ``DEMO_FAULT =
#: (listener, rule)`` in the protocol's users package (loadgen/rocketmq: 5 % SYSTEM_BUSY on
#: SEND_MESSAGE_V2), so shared code names no protocol.
DEMO_FAULTS = {name: fault for name in protocols.names()
               if (fault := getattr(_users_package(name), "DEMO_FAULT", None)) is not None}


def fault_expectations(protocol, faults):
    """The failures the ``--faults`` rules cause on purpose, in expected_failures()'s
    shape: (Locust name, start of the error text, the status the proxy logs, why)."""
    if not faults or protocol not in DEMO_FAULTS:
        return ()
    _listener, rule = DEMO_FAULTS[protocol]
    why = (f"the demo's fault rule '{rule['name']}' (frametap demo --faults): the proxy "
           f"answers {rule['trigger']['probability']:.0%} of "
           f"{', '.join(rule['match']['opcode'])} {rule['action']['status']} itself")
    return tuple((op, "", rule["action"]["status"], why)        # the text names the status
                 for op in rule["match"]["opcode"])


def fault_tables(protocol, listener, faults):
    """The ``[[routes.faults]]`` tables of the route in front of ``listener``."""
    if not faults or protocol not in DEMO_FAULTS or DEMO_FAULTS[protocol][0] != listener:
        return ""
    rule = DEMO_FAULTS[protocol][1]
    return "[[routes.faults]]\n" + "".join(f"{toml_key(k)} = {toml_value(v)}\n"
                                           for k, v in rule.items())


def demo_protocols():
    """{name: ProtocolSpec} of the protocols the demo can run: every descriptor in
    proxy/protocols/ with demo settings, a reference server and Locust users."""
    return {spec.name: spec for spec in protocols.specs()
            if spec.demo and spec.server and spec.users}


def missing_needs(spec):
    """The ``(program, hint)`` pairs of ``spec.demo.needs`` not found on PATH."""
    return [(prog, hint) for prog, hint in spec.demo.needs if shutil.which(prog) is None]


def toml_value(value):
    """A TOML literal for a route option (strings, numbers, booleans, lists, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)   # JSON's escapes are valid TOML
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}"
                                for k, v in value.items()) + " }"
    raise TypeError(f"demo route option {value!r}: cannot write it as TOML")


def toml_key(key):
    """A bare TOML key when it can be one, else a quoted key."""
    key = str(key)
    return key if key and all(c.isalnum() or c in "_-" for c in key) and key.isascii() \
        else toml_value(key)


def _fill(value, names):
    """``value`` with ``{server_<listener>}``-style placeholders filled in, recursively."""
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, dict):
        return {_fill(k, names): _fill(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_fill(v, names) for v in value]
    return value


def server_plan(spec, service_time):
    """``frametap serve`` argv (after ``frametap``) of one protocol's reference server,
    from its ``PROTOCOL.demo`` (see proxy.protocols.spec.DemoSpec): every listener on
    127.0.0.1 port 0 (its ``--ready-file`` says which ports it got)."""
    names = {"service_time": service_time}
    for listener in spec.demo.listeners:
        names[f"server_{listener}"] = "127.0.0.1:0"
    return ["serve", spec.name] + [_fill(a, names) for a in spec.demo.server_args]


def server_addresses(spec, ready):
    """{listener: bound address} from the server's ready file: a listener of that name's
    role (rocketmq: ``namesrv``, ``broker``), else the listeners in bind order."""
    roles, listen = ready.get("roles") or {}, ready["listen"]
    return {listener: roles.get(listener) or listen[i]
            for i, listener in enumerate(spec.demo.listeners)}


def pinned_listeners(spec):
    """Listeners whose proxy address a route option names (``{proxy_<listener>}``, e.g.
    RocketMQ's advertise map): their routes need a port before the proxy starts."""
    text = json.dumps([dict(route.options) for route in spec.demo.routes])
    return [listener for listener in spec.demo.listeners
            if "{proxy_" + listener + "}" in text]


def tls_tables(tls):
    """A route's ``[routes.tls]`` for ``frametap demo --tls``: TLS on both sides, the
    demo's throwaway CA (loadgen.tlscerts) behind both certificates."""
    return (f'[routes.tls]\nmode = "both"\n'
            f'[routes.tls.listen]\ncert = {toml_value(tls["cert"])}\n'
            f'key = {toml_value(tls["key"])}\n'
            f'[routes.tls.upstream]\nca = {toml_value(tls["ca"])}\n')


def route_plan(spec, servers, pick_port=None, tls=None, faults=False):
    """The proxy's route tables in front of ``servers`` ({listener: bound address}).

    A route listens on port 0 (the proxy's ``--ready-file`` says which port it got),
    unless a route option names its address (:func:`pinned_listeners`): that one gets a
    free port from ``pick_port`` now, which another process may take before the proxy
    binds it — the caller starts the proxy again on new ports then.  ``faults``: arm the
    protocol's DEMO_FAULTS rule on its route.

    Returns (route tables, {listener: route name}, route names)."""
    names = {f"server_{listener}": address for listener, address in servers.items()}
    for listener in spec.demo.listeners:
        names[f"proxy_{listener}"] = "127.0.0.1:0"
    for listener in pinned_listeners(spec):
        names[f"proxy_{listener}"] = f"127.0.0.1:{(pick_port or free_port)()}"
    tables, route_names, by_listener = [], [], {}
    for route in spec.demo.routes:
        name = spec.name + route.suffix
        table = (f'[[routes]]\nname = "{name}"\nprotocol = "{spec.name}"\n'
                 f'listen = "{names["proxy_" + route.listener]}"\n'
                 f'upstream = "{names["server_" + route.listener]}"\n')
        if route.options:
            table += "[routes.options]\n" + "".join(
                f"{toml_key(k)} = {toml_value(v)}\n"
                for k, v in _fill(dict(route.options), names).items())
        if tls is not None:
            table += tls_tables(tls)
        table += fault_tables(spec.name, route.listener, faults)
        tables.append(table)
        route_names.append(name)
        by_listener.setdefault(route.listener, name)
    return tables, by_listener, route_names


def free_port():
    """A port free now, for a route whose address must be known before the proxy starts
    (see :func:`route_plan`); everything else binds port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready_file(path, proc, what, timeout=30.0):
    """The JSON a ``--ready-file`` holds once ``proc`` listens."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start listening within {timeout:.0f}s")


def wait_ready(url, proc, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"proxy exited with status {proc.returncode}")
        try:
            promread.fetch(url, timeout=1)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"proxy not ready at {url} within {timeout:.0f}s")


def analyse(logdir, out):
    """``frametap analyze`` on the run's frame logs (proxy and Locust): its summary table,
    then where report.html is.  Returns its exit status."""
    print(f"\n[demo] analysing the frame logs with Spark: frametap analyze {logdir} "
          f"--out {out}", flush=True)
    r = subprocess.run([sys.executable, "-m", "proxy", "analyze", logdir, "--out", out])
    if r.returncode != 0:
        print(f"[demo] FAILED: frametap analyze exited with {r.returncode}", file=sys.stderr)
    return r.returncode


def locust_exit_reason(stderr):
    """The line of a failed Locust's stderr that says why: its last error or traceback
    line (never its stats tables, whose borders and rows also go to stderr)."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    table = re.compile(r"^(-+\|[-|]*|Type\s+Name\b.*|\S+\s+\S.*\|.*\d.*\|.*|"
                       r"Aggregated\b.*|Response time percentiles.*|Error report.*|"
                       r"#\s*occurrences.*)$")
    useful = [line for line in lines if not table.match(line)]
    for line in reversed(useful):
        if re.search(r"(Error|Exception|error:|CRITICAL|Traceback)", line):
            return line[:300]
    return (useful[-1][:300] if useful else "no message (see its output above)")


def stop_gracefully(proc, what, timeout=30.0):
    """SIGTERM and wait (the proxy drains, then flushes its frame log)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} did not stop within {timeout:.0f}s of SIGTERM") from None


class Processes:
    """Children started by the demo; stop() terminates them all (then kills stragglers)."""

    def __init__(self):
        self.procs = []

    def start(self, name, argv, **kw):
        proc = subprocess.Popen(argv, **kw)
        self.procs.append((name, proc))
        return proc

    def stop(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        for _, p in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def locust_totals(json_text):
    """Locust's final ``--json`` stats -> {name: {requests, failures, p50, p99}} (ms).

    (Its ``--csv`` stats file is written periodically and can miss the last seconds.)
    """
    rows = {}
    try:
        entries = json.loads(json_text or "[]")
    except ValueError:
        return rows
    for e in entries:
        times = sorted((float(k), v) for k, v in e.get("response_times", {}).items())
        rows[e["name"]] = {"requests": e["num_requests"], "failures": e["num_failures"],
                           "p50": _percentile(times, 0.5), "p99": _percentile(times, 0.99)}
    return rows


def _percentile(times, q):
    total = sum(n for _, n in times)
    if not total:
        return float("nan")
    acc = 0
    for ms, n in times:
        acc += n
        if acc >= q * total:
            return ms
    return times[-1][0]


def fmt_ms(seconds):
    if seconds != seconds:          # NaN
        return "-"
    return f"{seconds * 1000:.2f}"


def report(metrics_text, locust_rows, seconds, route=None, out=sys.stdout):
    """Per-opcode table of one route: proxy view (from /metrics) next to Locust's view.

    ``t/o``: the proxy's timeouts (no answer within the route's request timeout);
    ``cut``: requests whose connection closed before the answer (the run stopping), not
    timeouts. An opcode that crosses the proxy in both directions (a fleximq REQ goes
    from the requester to the broker and on to a responder) is counted by the proxy once
    per leg: a note under the table says so."""
    ops = promread.per_opcode(metrics_text, route)
    names = sorted(op for op, v in ops.items()
                   if v["requests"] or v["timeouts"] or v.get("cutoffs"))
    width = max([len(n) for n in names] + [8])
    peak = max([ops[n]["requests"] for n in names] + [1])
    head = (f"{'opcode':<{width}}  {'proxy req':>10} {'err':>5} {'t/o':>5} {'cut':>5} "
            f"{'p50 ms':>7} {'p99 ms':>7}  {'locust req':>10} {'fail':>5} {'p50 ms':>7} "
            f"{'p99 ms':>7}  requests/s")
    print(head, file=out)
    print("-" * len(head), file=out)
    for n in names:
        v = ops[n]
        lrow = locust_rows.get(n)
        lreq = lrow["requests"] if lrow else "-"
        lfail = lrow["failures"] if lrow else "-"
        l50 = f"{lrow['p50']:.0f}" if lrow else "-"
        l99 = f"{lrow['p99']:.0f}" if lrow else "-"
        bar = "#" * max(1, round(30 * v["requests"] / peak)) if v["requests"] else ""
        print(f"{n:<{width}}  {v['requests']:>10.0f} {v['errors']:>5.0f} {v['timeouts']:>5.0f}"
              f" {v.get('cutoffs', 0):>5.0f} {fmt_ms(v['p50']):>7} {fmt_ms(v['p99']):>7}  "
              f"{lreq:>10} {lfail:>5} {l50:>7} {l99:>7}  "
              f"{v['requests'] / seconds:>8.0f} {bar}", file=out)
    # totals add up from the rows above: Locust rows of other routes are not in them
    total = sum(ops[n]["requests"] for n in names)
    etotal = sum(ops[n]["errors"] for n in names)
    ttotal = sum(ops[n]["timeouts"] for n in names)
    ctotal = sum(ops[n].get("cutoffs", 0) for n in names)
    shown = [locust_rows[n] for n in names if n in locust_rows]
    ltotal = sum(r["requests"] for r in shown)
    lfail = sum(r["failures"] for r in shown)
    print("-" * len(head), file=out)
    print(f"{'total':<{width}}  {total:>10.0f} {etotal:>5.0f} {ttotal:>5.0f} {ctotal:>5.0f} "
          f"{'':>7} {'':>7}  {ltotal:>10} {lfail:>5}", file=out)
    for n in names:
        note = count_note(n, ops[n], locust_rows.get(n))
        if note:
            print(f"  {n}: {note}", file=out)
    return ops


def start_proxy(procs, frametap, out, cfg, logdir, run_id, specs, servers, attempts=3,
                tls=None, faults=False):
    """The demo's one proxy: a route in front of every server listener, the admin
    endpoint and the frame log; its listeners on port 0, read back from its ready file.
    A route whose port had to be chosen in advance (:func:`route_plan`) may find it
    taken: then the proxy is started again on new ports.

    Returns (process, ready-file JSON, {protocol: route names},
    {protocol: the route Locust uses})."""
    ready = os.path.join(out, "proxy.ready.json")
    log_path = os.path.join(out, "proxy.log")
    for attempt in range(attempts):
        routes, route_names, locust_routes = [], {}, {}
        for proto, spec in specs.items():
            tables, by_listener, names = route_plan(spec, servers[proto], tls=tls,
                                                    faults=faults)
            routes.extend(tables)
            route_names[proto] = names
            locust_routes[proto] = by_listener[spec.demo.locust_listener]
        with open(cfg, "w") as f:
            f.write(f'[admin]\nlisten = "127.0.0.1:0"\n\n'
                    f'[framelog]\ndir = {toml_value(logdir)}\nrun_id = "{run_id}"\n\n'
                    + "\n".join(routes))
        print(f"[demo] starting proxy (config {cfg}, log {log_path})", flush=True)
        with open(log_path, "w") as log:
            proxy = procs.start("proxy", frametap + ["proxy", "-c", cfg, "--log-level",
                                                     "warning", "--ready-file", ready],
                                stderr=log)
        try:
            bound = wait_ready_file(ready, proxy, "proxy")
        except RuntimeError:
            with open(log_path) as f:
                text = f.read()
            if "address already in use" in text and attempt < attempts - 1:
                print("[demo] a proxy port was taken meanwhile; starting it on new ports",
                      flush=True)
                continue
            raise RuntimeError(f"proxy did not start: {text.strip()[-2000:]}") from None
        print(f"[demo] proxy metrics at http://{bound['admin']}/metrics", flush=True)
        return proxy, bound, route_names, locust_routes
    raise AssertionError("unreachable")  # pragma: no cover


def count_note(opcode, proxy, locust):
    """Why the proxy's count of ``opcode`` differs from Locust's, when a rule knows."""
    if not locust or not locust.get("requests") or not proxy.get("requests"):
        return None
    lreq, preq = locust["requests"], proxy["requests"]
    c2s, s2c = proxy.get("c2s_frames", 0), proxy.get("s2c_frames", 0)
    slack = max(5, 0.05 * lreq)
    if abs(preq - 2 * lreq) <= slack and c2s and abs(s2c - c2s) <= max(5, 0.05 * c2s):
        return (f"each one crosses the proxy twice - {c2s:,.0f} from the requesters to the "
                f"broker and {s2c:,.0f} on to the responders - so the proxy counts "
                f"{preq:,.0f} answered legs where Locust counts {lreq:,} requests")
    if preq > 2.5 * lreq:
        return (f"the proxy counts each message ({preq:,.0f}), Locust each request, which "
                f"carries a batch of about {preq / lreq:.0f} ({lreq:,})")
    return None


def locust_errors(logdir, protocol):
    """Locust's error list ([{"type", "name", "error", "occurrences"}]) for ``protocol``
    from the run files its processes wrote into ``logdir`` (loadgen.clientlog)."""
    out = []
    try:
        names = sorted(os.listdir(logdir))
    except OSError:
        return out
    for name in names:
        if not (is_run_file(name) and name.startswith("run-client-")):
            continue
        try:
            with open(os.path.join(logdir, name)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        for e in (data.get("locust") or {}).get("errors") or []:
            if e.get("type") == protocol:
                out.append(e)
    return out


def expected_why(protocol, name, error, extra=()):
    """Why a failure of ``protocol``'s Locust request ``name`` with error text ``error``
    is deliberate, or None when it is not (expected_failures(), then ``extra``: the
    --faults rules')."""
    for want_name, prefix, _status, why in expected_failures(protocol):
        if (want_name is None or want_name == name) and str(error).startswith(prefix):
            return why
    for want_name, prefix, status, why in extra:      # an injected error names its status
        if want_name == name and str(error).startswith(prefix) and status in str(error):
            return why
    return None


def explain_failures(protocol, rows, errors, out=sys.stdout, extra=()):
    """One line per kind of failure Locust counted for ``protocol``: which requests, how
    many, the error, and whether the demo meant it (``extra``: fault_expectations()).
    Returns the count not expected."""
    failed = {name: r["failures"] for name, r in rows.items() if r["failures"]}
    if not failed:
        return 0
    kinds = {}
    for e in errors:
        error = str(e.get("error", ""))
        what = error.split("(", 1)[0].strip() or error[:60]
        why = expected_why(protocol, e.get("name"), error, extra)
        key = (why is not None, what, why)
        entry = kinds.setdefault(key, {"names": {}, "count": 0, "sample": error})
        entry["names"][e.get("name")] = entry["names"].get(e.get("name"), 0) + \
            (e.get("occurrences") or 0)
        entry["count"] += e.get("occurrences") or 0
    unexpected = 0
    total = sum(failed.values())
    print(f"[demo] {protocol}: {total:,} of {sum(r['requests'] for r in rows.values()):,} "
          f"requests failed", file=out)
    for (expected, what, why), entry in sorted(kinds.items(), key=lambda kv: -kv[1]["count"]):
        names = ", ".join(f"{n} ×{c:,}" for n, c in sorted(entry["names"].items(),
                                                            key=lambda kv: -kv[1]))
        if expected:
            print(f"[demo]   expected ({names}): {why}", file=out)
        else:
            unexpected += entry["count"]
            print(f"[demo]   NOT expected ({names}): {entry['sample'][:200]}", file=out)
    listed = sum(entry["count"] for entry in kinds.values())
    if listed < total:
        unexpected += total - listed
        print(f"[demo]   NOT expected: {total - listed:,} failures Locust did not describe "
              "(no run file with its error list)", file=out)
    return unexpected


def demo_section(args, chosen):
    """The ``demo`` section of the demo's run file (proxy.runinfo): its settings, and the
    failures it causes on purpose (the report marks them), --faults' included."""
    faults = getattr(args, "faults", False)
    section = {"seconds": args.seconds, "users": args.users,
               "service_time": args.service_time, "protocols": list(chosen),
               "expected_failures": [
                   {"protocol": proto, "opcode": name, "status": status, "why": why}
                   for proto in chosen
                   for name, _prefix, status, why in (
                       tuple(expected_failures(proto)) + fault_expectations(proto, faults))]}
    if faults:
        section["faults"] = [{"protocol": proto, "listener": DEMO_FAULTS[proto][0],
                              "rule": DEMO_FAULTS[proto][1]}
                             for proto in chosen if proto in DEMO_FAULTS]
    return section


def fault_report(metrics_text, rows, errors, route, protocol, out=sys.stdout):
    """What ``--faults`` did, seen from both ends: the proxy's
    frametap_faults_injected_total for the rule and the failures Locust counted with
    the injected status.  Returns (injected, Locust's failures with that status)."""
    _listener, rule = DEMO_FAULTS[protocol]
    status = rule["action"]["status"]
    injected = promread.sample_sum(metrics_text, "frametap_faults_injected_total",
                                   route=route, fault=rule["name"])
    failed, sent = 0, 0
    for op in rule["match"]["opcode"]:
        sent += (rows.get(op) or {}).get("requests", 0)
        failed += sum(e.get("occurrences") or 0 for e in errors
                      if e.get("name") == op and status in str(e.get("error", "")))
    share = f" ({failed / sent:.1%} of {sent:,})" if sent else ""
    print(f"[demo] fault '{rule['name']}' on route {route}: {status} for "
          f"{rule['trigger']['probability']:.0%} of {', '.join(rule['match']['opcode'])}"
          f" - the proxy injected {injected:,.0f} (frametap_faults_injected_total), "
          f"Locust counted {failed:,} {status} failures{share}", file=out)
    return injected, failed


def build_parser():
    p = argparse.ArgumentParser(
        prog="frametap demo",
        description="Start the reference server(s), a frametap proxy in front of them, run a "
                    "headless Locust load through the proxy, then print a per-opcode table "
                    "read from the proxy's /metrics beside Locust's own totals.")
    p.add_argument("--seconds", type=int, default=20, help="length of the Locust run (20)")
    p.add_argument("--users", type=int, default=8, help="Locust users (8)")
    p.add_argument("--service-time", default="1ms±0.5ms",
                   help="reference server service time per request (1ms±0.5ms)")
    p.add_argument("--protocols", default=",".join(demo_protocols()),
                   help="comma list of protocols to include (default: all available)")
    p.add_argument("--no-analysis", action="store_true",
                   help="skip the Spark analysis of the run's frame logs at the end")
    p.add_argument("--out", default=None, help="directory for the proxy config and the final metrics "
                   "scrape (default: a temporary directory)")
    p.add_argument("--faults", action="store_true",
                   help="arm one fault rule from the proxy's config: the proxy answers 5 %% "
                        "of RocketMQ SEND_MESSAGE_V2 with SYSTEM_BUSY itself; the demo then "
                        "shows it in Locust's failures, the proxy's metrics and the report "
                        "(needs rocketmq among --protocols)")
    p.add_argument("--tls", action="store_true",
                   help="TLS on both sides of every route: the demo makes a throwaway CA "
                        "(with the openssl program) whose certificates the servers and the "
                        "proxy present; Locust verifies against it")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    available = demo_protocols()
    chosen = [p.strip() for p in args.protocols.split(",") if p.strip()]
    for p in chosen:
        if p not in available:
            print(f"frametap demo: --protocols: {p!r} is not available "
                  f"(expected: {', '.join(available)})", file=sys.stderr)
            return 2
    explicit = args.protocols != ",".join(available)     # the user named them
    for p in list(chosen):
        missing = missing_needs(available[p])
        if missing:
            what = "; ".join(f"`{prog}` not found ({hint})" for prog, hint in missing)
            if explicit:
                print(f"frametap demo: --protocols: {p} needs {what}", file=sys.stderr)
                return 2
            print(f"[demo] leaving {p} out: {what}", flush=True)
            chosen.remove(p)
    if args.faults and not any(p in DEMO_FAULTS for p in chosen):
        print(f"frametap demo: --faults: the demo's fault rule is on "
              f"{', '.join(DEMO_FAULTS)}, which --protocols leaves out", file=sys.stderr)
        return 2
    if args.seconds < 1 or args.users < 1:
        print("frametap demo: --seconds and --users must be >= 1", file=sys.stderr)
        return 2
    out = args.out or tempfile.mkdtemp(prefix="frametap-demo-")
    os.makedirs(out, exist_ok=True)
    procs = Processes()
    frametap = [sys.executable, "-m", "proxy"]
    status = 1
    tls = None
    if args.tls:
        from loadgen.tlscerts import CertError, throwaway
        try:
            tls = throwaway(os.path.join(out, "tls"))
        except CertError as exc:
            print(f"frametap demo: --tls: {exc}", file=sys.stderr)
            return 2
        print(f"[demo] TLS on both sides of every route; throwaway CA {tls['ca']}", flush=True)
    server_tls = [] if tls is None else ["--tls-cert", tls["cert"], "--tls-key", tls["key"]]
    locust_tls = [] if tls is None else ["--tls", "--tls-ca", tls["ca"]]
    try:
        servers = {}
        for proto in chosen:
            argv = server_plan(available[proto], args.service_time)
            ready = os.path.join(out, f"{proto}-server.ready.json")
            print(f"[demo] starting reference {proto} server: frametap {' '.join(argv)}",
                  flush=True)
            srv = procs.start(f"{proto} server", frametap + argv + server_tls + [
                "--log-level", "WARNING", "--ready-file", ready], stdout=subprocess.DEVNULL)
            servers[proto] = server_addresses(available[proto],
                                              wait_ready_file(ready, srv, f"{proto} server"))
            print(f"[demo] {proto} server listening on {', '.join(servers[proto].values())}",
                  flush=True)
        cfg = os.path.join(out, "frametap.toml")
        logdir = os.path.join(out, "framelogs")
        run_id = new_run_id()
        proxy, bound, route_names, locust_routes = start_proxy(
            procs, frametap, out, cfg, logdir, run_id,
            {proto: available[proto] for proto in chosen}, servers, tls=tls,
            faults=args.faults)
        if args.faults:
            for proto in chosen:
                if proto in DEMO_FAULTS:
                    rule = DEMO_FAULTS[proto][1]
                    print(f"[demo] fault rule '{rule['name']}' armed ([[routes.faults]] in "
                          f"{cfg}): {rule['action']['status']} for "
                          f"{rule['trigger']['probability']:.0%} of "
                          f"{', '.join(rule['match']['opcode'])}", flush=True)
        metrics_url = f"http://{bound['admin']}/metrics"
        hosts = {proto: bound["routes"][locust_routes[proto]] for proto in chosen}
        wait_ready(f"http://{bound['admin']}/readyz", proxy)

        runinfo = RunInfo(logdir, "demo", run_id, demo=demo_section(args, chosen)).write()
        loads = []
        for proto in chosen:
            classes = available[proto].user_classes
            env = dict(os.environ, FRAMETAP_PROTOCOLS=proto, FRAMETAP_RUN_ID=run_id)
            print(f"[demo] Locust: {args.users} users ({', '.join(classes)}) for "
                  f"{args.seconds}s through the proxy at {hosts[proto]}", flush=True)
            loads.append(procs.start(f"locust {proto}", [
                sys.executable, "-m", "locust", "-f", locustfile_path(), "--headless",
                "-u", str(args.users), "-r", str(args.users), "-t", f"{args.seconds}s",
                "--host", hosts[proto], "--json", "--only-summary",
                # failed requests are part of the demo (ttheader's `retired`, NotFound):
                # only a Locust that crashed exits non-zero and is reported below
                "--exit-code-on-error", "0",
                "--loglevel", "WARNING", "--frametap-framelog", logdir, *locust_tls,
                *classes],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        started = time.time()
        while any(p.poll() is None for p in loads):
            time.sleep(2)   # Locust's --json goes to a pipe read at the end: it stays small
            try:
                text = promread.fetch(metrics_url)
            except (urllib.error.URLError, OSError):
                continue
            n = promread.sample_sum(text, "frametap_request_duration_seconds_count")
            el = time.time() - started
            print(f"[demo] {el:5.1f}s / {args.seconds}s  proxy has seen {n:,.0f} answered "
                  f"requests ({n / max(el, 0.1):,.0f}/s)", flush=True)
        rows = {}
        for proto, p in zip(chosen, loads):
            stdout, stderr = p.communicate()
            rows[proto] = locust_totals(stdout)
            if p.returncode != 0:
                print(f"[demo] {proto}: Locust failed (exit status {p.returncode}): "
                      f"{locust_exit_reason(stderr)}", file=sys.stderr)
        time.sleep(0.5)
        text = promread.fetch(metrics_url)
        with open(os.path.join(out, "metrics.txt"), "w") as f:
            f.write(text)
        stop_gracefully(proxy, "proxy")    # SIGTERM: the frame log is flushed and closed
        if os.path.getsize(os.path.join(out, "proxy.log")):
            print(f"[demo] the proxy logged warnings: {os.path.join(out, 'proxy.log')}",
                  flush=True)
        print(f"[demo] frame logs (run {run_id}): {logdir}", flush=True)
        print()
        total = 0
        for proto in chosen:
            for route in route_names[proto]:
                print(f"== {proto} (route {route}) ==")
                ops = report(text, rows.get(proto, {}), args.seconds, route=route)
                total += sum(v["requests"] for v in ops.values())
                print()
        for proto in chosen:
            explain_failures(proto, rows.get(proto, {}), locust_errors(logdir, proto),
                             extra=fault_expectations(proto, args.faults))
        if args.faults:
            for proto in chosen:
                if proto in DEMO_FAULTS:
                    listener = DEMO_FAULTS[proto][0]
                    route = next(n for n, r in zip(route_names[proto],
                                                   available[proto].demo.routes)
                                 if r.listener == listener)
                    fault_report(text, rows.get(proto, {}), locust_errors(logdir, proto),
                                 route, proto)
        runinfo.finish()
        errs = promread.sample_sum(text, "frametap_protocol_errors_total")
        unmatched = promread.sample_sum(text, "frametap_unmatched_responses_total")
        print(f"protocol errors: {errs:.0f}   unmatched responses: {unmatched:.0f}   "
              f"output: {out}")
        status = 0 if total > 0 and errs == 0 and unmatched == 0 else 1
        if status:
            print("[demo] FAILED: the proxy saw no answered requests, or protocol errors",
                  file=sys.stderr)
        elif not args.no_analysis:
            status = analyse(logdir, os.path.join(out, "analysis"))
    except KeyboardInterrupt:
        print("\n[demo] interrupted; stopping everything", file=sys.stderr)
        status = 130
    except RuntimeError as exc:
        print(f"[demo] {exc}", file=sys.stderr)
    finally:
        procs.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
