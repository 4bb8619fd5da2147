"""Locust's numbers in Prometheus: the ``frametap_locust_*`` metrics.

A protocol-agnostic Locust plugin (docs/design.md, "Prometheus metrics" and "Command
line"), installed by the packaged locustfile like :mod:`loadgen.clientlog`. Options:

``--frametap-metrics HOST:PORT``
    serve ``/metrics`` on ``HOST:PORT`` (``[v6]:PORT`` for IPv6); off when not given.
``--frametap-metrics-linger SECONDS``
    when Locust quits, keep serving until one more scrape has fetched the final numbers,
    at most this long (default 0: stop at once). A headless run ends a fraction of a
    second after the workers' last report; without this, a Prometheus that scrapes every
    few seconds never sees the run's last seconds.

Metrics (one private :class:`~prometheus_client.registry.CollectorRegistry`, read at
scrape time by :class:`LocustCollector`):

=============================================  =========  ==========================
metric                                         type       labels
=============================================  =========  ==========================
``frametap_locust_requests_total``             counter    protocol, opcode, outcome
``frametap_locust_request_duration_seconds``   histogram  protocol, opcode, outcome
``frametap_locust_users``                      gauge      (none)
=============================================  =========  ==========================

``protocol`` is the request event's ``request_type``, ``opcode`` its ``name``,
``outcome`` ``ok`` or ``error`` (an ``exception`` was given: what Locust counts as a
failure). Every request event counts in ``frametap_locust_requests_total``; the histogram
gets every event with a ``response_time``, converted from Locust's milliseconds to seconds
*unrounded* (Locust's own statistics round to whole milliseconds, useless for the
sub-millisecond requests of a local broker), into the proxy's buckets
(:data:`proxy.framing_common.BUCKETS`, compared in integer nanoseconds as the proxy does),
so the load-test dashboard compares like with like. Labels are bounded like the proxy's:
at most :data:`MAX_OPCODES` opcodes per protocol and :data:`MAX_PROTOCOLS` protocols,
the rest count as ``other``.

Who serves what:

* a plain run (no ``--master``/``--worker``): the process counts its own requests and
  serves them;
* a distributed run (``--master`` with ``--worker`` processes, or ``--processes N``,
  whose forked children are workers of the parent): each worker counts its requests and
  ships the increments since its previous report inside Locust's own worker report (the
  ``report_to_master`` event, every few seconds and once more when it quits, in the same
  message as Locust's statistics); the master adds them up (``worker_report``) and serves
  the totals, with the master's user count (the sum the workers report). No worker
  serves anything; a worker needs no option of its own: it starts counting when the
  master's options, which Locust hands to the workers with the first spawn message, name
  an address. The master's totals thus equal Locust's own request counts exactly.

The endpoint is up from Locust's start-up (the ``init`` event, after ``--processes``
forked its workers) until Locust quits (the ``quit`` event, after the final statistics
are printed; plus the linger). A port already in use is one error line and exit 2.

Per request event the users' side does a dict lookup, a bisect over the bounds and four
additions, without a lock (gevent runs one greenlet at a time and nothing here yields);
its cost is in docs/benchmarks-loadgen.md.
"""

from __future__ import annotations

import argparse
import bisect
import logging
import sys
import time

from loadgen.pluginbase import install_once
from proxy.addresses import format_peer, parse_address
from proxy.errors import ConfigError
from proxy.framing_common import BUCKETS, BUCKETS_NS
from proxy.metrics import _buckets as cumulative_buckets

__all__ = ["install", "add_arguments", "LocustMetrics", "LocustCollector", "MetricsServer",
           "REPORT_KEY", "MAX_OPCODES", "MAX_PROTOCOLS"]

log = logging.getLogger("frametap.locustmetrics")

#: Key of the increments in Locust's worker report (Locust itself uses "stats", "errors",
#: "stats_total", "user_count", "user_classes_count").
REPORT_KEY = "frametap_metrics"
#: Distinct opcodes per protocol before the rest count as ``other`` (as the proxy's routes).
MAX_OPCODES = 256
#: Distinct protocols before the rest count as ``other``.
MAX_PROTOCOLS = 32
OTHER = "other"

_N = len(BUCKETS)
#: A row: [requests, observations, sum of seconds, per-bucket counts (last: +Inf)].
_ROW_LEN = 3 + _N + 1


# ---------------------------------------------------------------------- the numbers

class LocustMetrics:
    """Per (protocol, opcode, outcome) request counts and latency histograms.

    A worker keeps its increments since the last report here (:meth:`take` empties it);
    a master or a plain run keeps the totals (:meth:`merge` adds a worker's increments).
    """

    __slots__ = ("rows", "_opcodes", "malformed")

    def __init__(self):
        self.rows: dict[tuple[str, str, str], list] = {}
        self._opcodes: dict[str, set] = {}      # protocol -> opcodes with their own label
        self.malformed = 0                      # report items that could not be merged

    def _row(self, protocol, opcode, outcome) -> list:
        """The row of a key not seen yet (label bounds applied)."""
        ops = self._opcodes.get(protocol)
        if ops is None:
            if len(self._opcodes) >= MAX_PROTOCOLS:
                protocol = OTHER
                ops = self._opcodes.setdefault(OTHER, set())
            else:
                ops = self._opcodes[protocol] = set()
        if opcode not in ops:
            if len(ops) >= MAX_OPCODES:
                opcode = OTHER
            else:
                ops.add(opcode)
        key = (protocol, opcode, outcome)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0, 0, 0.0] + [0] * (_N + 1)
        return row

    def observe(self, protocol, opcode, outcome, response_time) -> None:
        """One request; ``response_time`` in milliseconds as Locust reports it (any
        precision), or None (counted, not timed, as Locust does; so is a value that is
        not a finite number)."""
        row = self.rows.get((protocol, opcode, outcome))
        if row is None:
            row = self._row(protocol, opcode, outcome)
        row[0] += 1
        if response_time is not None:
            try:
                ns = round(response_time * 1e6)
            except (TypeError, ValueError, OverflowError):    # NaN, inf, not a number
                return
            row[1] += 1
            row[2] += response_time / 1000.0
            row[3 + bisect.bisect_left(BUCKETS_NS, ns)] += 1

    def on_request(self, request_type, name, response_time, response_length=0,
                   exception=None, **_kwargs) -> None:
        """Locust ``request`` event listener."""
        self.observe(str(request_type), str(name), "ok" if exception is None else "error",
                     response_time)

    def take(self) -> list:
        """The increments since the previous call, as a list Locust's RPC can carry
        (``[protocol, opcode, outcome, requests, observations, sum, bucket counts...]``);
        the rows start again from zero."""
        rows, self.rows = self.rows, {}
        return [[*key, *row] for key, row in rows.items() if row[0]]

    def merge(self, items) -> None:
        """Add a worker's increments (what its :meth:`take` returned)."""
        if not isinstance(items, (list, tuple)):
            self.malformed += 1
            return
        for item in items:
            if (not isinstance(item, (list, tuple)) or len(item) != 3 + _ROW_LEN
                    or not all(isinstance(x, str) for x in item[:3])
                    or not all(isinstance(x, (int, float)) for x in item[3:])):
                self.malformed += 1     # e.g. a worker of another version (other buckets)
                continue
            row = self.rows.get(tuple(item[:3]))
            if row is None:
                row = self._row(*item[:3])
            for i, v in enumerate(item[3:]):
                row[i] += v

    def total_requests(self) -> int:
        return sum(row[0] for row in self.rows.values())


class LocustCollector:
    """prometheus_client collector of a :class:`LocustMetrics` and a user count."""

    def __init__(self, metrics: LocustMetrics, users=lambda: 0):
        self.metrics = metrics
        self.users = users

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)
        labels = ["protocol", "opcode", "outcome"]
        requests = CounterMetricFamily(
            "frametap_locust_requests", "Requests the Locust users made (Locust's request "
            "events; outcome error = Locust counted a failure)", labels=labels)
        duration = HistogramMetricFamily(
            "frametap_locust_request_duration_seconds", "Request time measured by the "
            "Locust users (unrounded), in the proxy's buckets", labels=labels)
        for key, row in sorted(self.metrics.rows.items()):
            requests.add_metric(list(key), row[0])
            buckets, _ = cumulative_buckets(row[3:])
            duration.add_metric(list(key), buckets, row[2])
        try:
            users = int(self.users() or 0)
        except Exception:        # a runner being torn down
            users = 0
        yield requests
        yield duration
        yield GaugeMetricFamily("frametap_locust_users", "Locust users running (on a master: "
                                "the sum the workers report)", value=users)


class MetricsServer:
    """``/metrics`` of one :class:`LocustCollector` on a private registry.

    prometheus_client's WSGI app on its threading WSGI server (threads are greenlets
    under Locust), with a request handler that notes when a response has been written:
    :meth:`linger` waits for a whole response, not merely for a collect."""

    def __init__(self, collector: LocustCollector, host: str, port: int):
        import socket
        import threading
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer
        from prometheus_client.registry import CollectorRegistry

        class Handler(WSGIRequestHandler):
            def log_message(self, format, *args):     # no access log on Locust's stderr
                pass

            def setup(self):
                self.began = time.monotonic()
                super().setup()

            def finish(self):
                super().finish()
                # a response has been written whole: note when its request began
                self.server.answered = max(self.server.answered, self.began)

        class Server(ThreadingWSGIServer):
            address_family = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0][0]
            answered = 0.0    # time.monotonic() the latest fully answered request began

        self.collector = collector
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.host, self.port = host, port
        self.httpd = make_server(host, port, make_wsgi_app(self.registry), Server,
                                 handler_class=Handler)
        self.port = self.httpd.server_address[1]     # as bound: port 0 picks a free one
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       name="frametap-locust-metrics", daemon=True)
        self.thread.start()

    def linger(self, seconds: float) -> bool:
        """Serve until a request that began after this call has been answered in full
        (it read the numbers as they are now), at most ``seconds``; True when one was."""
        if seconds <= 0:
            return False
        start = time.monotonic()
        deadline = start + seconds
        while time.monotonic() < deadline:
            if self.httpd.answered > start:
                return True
            time.sleep(0.05)
        return False

    @property
    def address(self) -> str:
        """``host:port`` (``[v6]:port``) as bound."""
        return format_peer((self.host, self.port))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------------- Locust wiring

def address_arg(text: str) -> str:
    """argparse type of ``--frametap-metrics``: validates ``HOST:PORT``, keeps the text
    (the master hands it to the workers as it is)."""
    try:
        parse_address(text, "--frametap-metrics", allow_port_zero=True)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    return text


def linger_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 to 3600 (got {text!r})")
    return value


def add_arguments(parser) -> None:
    """Locust ``init_command_line_parser`` listener: the plugin's options."""
    group = parser.add_argument_group(
        "frametap Prometheus metrics",
        "Locust's numbers as frametap_locust_* metrics (docs/design.md, \"Prometheus "
        "metrics\"). In a distributed run only the master serves them (the totals of "
        "all workers).")
    group.add_argument(
        "--frametap-metrics", metavar="HOST:PORT", default=None, type=address_arg,
        help="Serve /metrics on HOST:PORT ([v6]:PORT for IPv6) from start-up until Locust "
             "quits. Give it to the master (or the --processes parent); workers need "
             "nothing. Port 0 picks a free port (--frametap-ready-file says which).")
    group.add_argument(
        "--frametap-metrics-linger", metavar="SECONDS", default=0.0, type=linger_arg,
        help="When Locust quits, keep /metrics up until one more scrape has read the "
             "final numbers, at most SECONDS (default 0). Set it above Prometheus' "
             "scrape interval for headless runs.")


def _role(environment) -> str:
    """``master``, ``worker`` or ``local`` (a plain run)."""
    from locust.runners import MasterRunner, WorkerRunner
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        return "master"
    if isinstance(runner, WorkerRunner):
        return "worker"
    return "local"


def _option(environment, name, default=None):
    opts = environment.parsed_options
    return default if opts is None else getattr(opts, name, default)


class _Plugin:
    """The per-process state: the totals (master, plain run) or the increments to ship
    (worker), and the server."""

    LISTENERS = {"init": "on_init", "test_start": "on_test_start", "quit": "on_quit"}

    def __init__(self):
        self.metrics: LocustMetrics | None = None
        self.server: MetricsServer | None = None
        self.environment = None
        self.role = None
        self._reporting = False

    def on_init(self, environment, **_kwargs) -> None:
        self.environment = environment
        self.role = _role(environment)
        if self.role == "worker":
            # the address may come with the master's options at the first spawn
            self._report_to_master(environment)
            return
        address = _option(environment, "frametap_metrics")
        if not address:
            return
        host, port = parse_address(address, "--frametap-metrics", allow_port_zero=True)
        metrics = LocustMetrics()
        runner = environment.runner
        collector = LocustCollector(metrics, lambda: getattr(runner, "user_count", 0))
        try:
            self.server = MetricsServer(collector, host, port)
        except OSError as exc:
            sys.stderr.write(f"locust: --frametap-metrics {address}: cannot listen: "
                             f"{exc.strerror or exc}\n")
            sys.exit(2)
        self.metrics = metrics
        if self.role == "master":
            environment.events.worker_report.add_listener(self.on_worker_report)
        else:
            environment.events.request.add_listener(metrics.on_request)
        log.info("frametap: Locust metrics on http://%s/metrics", self.server.address)

    def on_test_start(self, environment, **_kwargs) -> None:
        # A worker may get the master's first spawn message - and so test_start - before
        # its own init event, even before Locust has stored its runner in the environment
        # (the runner talks to the master while it is being set up): no runner yet means
        # a worker, since a master's or a plain run's test_start cannot come that early.
        from locust.runners import WorkerRunner
        runner = environment.runner
        if self.metrics is not None or not (runner is None or isinstance(runner, WorkerRunner)):
            return
        if not _option(environment, "frametap_metrics"):
            return
        if self.environment is None:
            self.environment = environment
        self.metrics = LocustMetrics()
        environment.events.request.add_listener(self.metrics.on_request)
        self._report_to_master(environment)

    def _report_to_master(self, environment) -> None:
        if not self._reporting:
            self._reporting = True
            environment.events.report_to_master.add_listener(self.on_report_to_master)

    def on_report_to_master(self, client_id=None, data=None, **_kwargs) -> None:
        if self.metrics is not None and data is not None:
            items = self.metrics.take()
            if items:
                data[REPORT_KEY] = items

    def on_worker_report(self, client_id=None, data=None, **_kwargs) -> None:
        items = (data or {}).get(REPORT_KEY)
        if items and self.metrics is not None:
            before = self.metrics.malformed
            self.metrics.merge(items)
            if self.metrics.malformed != before:
                log.warning("frametap: ignored %d malformed metric rows from worker %s "
                            "(another frametap version?)", self.metrics.malformed - before,
                            client_id)

    def on_quit(self, **_kwargs) -> None:
        """Locust ``quit`` listener: after the final statistics; linger, then stop."""
        server, self.server = self.server, None
        if server is None:
            return
        server.linger(float(_option(self.environment, "frametap_metrics_linger", 0) or 0))
        server.close()


def install(events=None) -> None:
    """Hook the plugin into Locust's ``events`` (default ``locust.events``); once per
    process, so a locustfile may call it unconditionally."""
    install_once(_Plugin, add_arguments, events)
