"""Faults for a load run: ``frametap load --frametap-fault ROUTE:SPEC`` arms rules or
toxics on a running proxy through its fault API when the test starts and removes them
when it stops (docs/design.md, "Faults"; issue 22 part 6).

``--frametap-fault ROUTE:SPEC`` (repeatable)
    SPEC is the short form of ``frametap faults add`` (``error status=SYSTEM_BUSY
    opcode=SEND_MESSAGE_V2 probability=0.05``, ``latency latency=100``) or a JSON object
    (a rule as in ``[[routes.faults]]``, or a Toxiproxy toxic).
``--frametap-fault-api HOST:PORT``
    the proxy's fault API (``frametap proxy --api``, ``[toxiproxy] listen``); default
    127.0.0.1:8474, Toxiproxy's port.

The process that runs the test (a plain run, or the master of a distributed one) does
the arming; workers do nothing. The specs are checked at start-up, and the API asked for
the routes then too, so a typo or an unreachable proxy is one line and exit status 2
before any user starts. A rule the proxy refuses when the test starts stops the run
(exit status 2) after removing what was armed.
"""

from __future__ import annotations

import logging
import sys

from loadgen.pluginbase import install_once

__all__ = ["install", "add_arguments"]

log = logging.getLogger("frametap.faults")


def add_arguments(parser) -> None:
    group = parser.add_argument_group(
        "frametap faults",
        "Arm fault rules or toxics on the proxy for the run (removed when it stops).")
    group.add_argument(
        "--frametap-fault", metavar="ROUTE:SPEC", action="append", default=None,
        help="A rule or toxic for proxy route ROUTE, armed at test start and removed at "
             "test stop; repeatable. SPEC: 'error status=SYSTEM_BUSY opcode=SEND_MESSAGE_V2 "
             "probability=0.05', 'delay ms=50 jitter_ms=5', 'latency latency=100', or a "
             "JSON object (see frametap faults add --help).")
    group.add_argument(
        "--frametap-fault-api", metavar="HOST:PORT", default="127.0.0.1:8474",
        help="The proxy's fault API (frametap proxy --api, [toxiproxy] listen); default "
             "127.0.0.1:8474.")


def _fail(message):
    sys.stderr.write(f"frametap load: {message}\n")
    sys.exit(2)


class _Plugin:
    LISTENERS = {"init": "on_init", "test_start": "on_test_start",
                 "test_stop": "on_test_stop", "quit": "on_quit"}

    def __init__(self):
        self.api = None
        self.faults = []          # (route, kind, data, the option's text)
        self.armed = []           # (route, kind, name) on the proxy now
        self.environment = None

    def on_init(self, environment, runner=None, **_kwargs) -> None:
        from locust.runners import WorkerRunner
        runner = runner if runner is not None else environment.runner
        opts = environment.parsed_options
        specs = getattr(opts, "frametap_fault", None) if opts is not None else None
        if not specs or isinstance(runner, WorkerRunner):
            return
        from proxy.errors import ConfigError
        from proxy.faultcli import ApiUnreachable, FaultApi
        from proxy.faultspec import parse_fault_arg
        self.environment = environment
        try:
            self.api = FaultApi(opts.frametap_fault_api)
        except ConfigError as exc:
            _fail(f"--frametap-fault-api: {exc}")
        for text in specs:
            try:
                route, kind, data = parse_fault_arg(text)
            except ConfigError as exc:
                _fail(f"--frametap-fault: {exc}")
            self.faults.append((route, kind, data, text))
        try:
            names = {r["name"] for r in self.api.routes()}
        except ApiUnreachable as exc:
            _fail(f"--frametap-fault: {exc}")
        except ConfigError as exc:
            _fail(f"--frametap-fault-api {self.api.address}: {exc}")
        for route, _kind, _data, text in self.faults:
            if route not in names:
                _fail(f"--frametap-fault {text!r}: the proxy has no route {route!r} (its "
                      f"routes: {', '.join(sorted(names)) or 'none'})")

    def on_test_start(self, environment, **_kwargs) -> None:
        if self.api is None or self.armed:
            return
        from proxy.errors import ConfigError
        from proxy.faultcli import ApiUnreachable
        for route, kind, data, text in self.faults:
            try:
                made = self.api.add(route, kind, data)
            except (ConfigError, ApiUnreachable) as exc:
                log.error("frametap load: --frametap-fault %r: route %r: %s; stopping the "
                          "run", text, route, exc)
                self.disarm()
                environment.process_exit_code = 2
                import gevent
                gevent.spawn(environment.runner.quit)
                return
            self.armed.append((route, kind, made["name"]))
            log.info("frametap: armed %s %r on route %r", kind, made["name"], route)

    def on_test_stop(self, environment=None, **_kwargs) -> None:
        self.disarm()

    def on_quit(self, **_kwargs) -> None:
        self.disarm()

    def disarm(self) -> None:
        """Remove what this run armed (one that is gone already is fine)."""
        from proxy.errors import ConfigError
        from proxy.faultcli import ApiUnreachable
        armed, self.armed = self.armed, []
        for route, kind, name in armed:
            try:
                self.api.remove(route, kind, name)
            except ConfigError as exc:
                if getattr(exc, "status", None) != 404:
                    log.warning("frametap: could not remove %s %r from route %r: %s", kind,
                                name, route, exc)
            except ApiUnreachable as exc:
                log.warning("frametap: could not remove %s %r from route %r: %s", kind,
                            name, route, exc)
                continue
            else:
                log.info("frametap: removed %s %r from route %r", kind, name, route)


def install(events=None) -> None:
    """Hook the plugin into Locust's ``events`` once per process."""
    install_once(_Plugin, add_arguments, events)
