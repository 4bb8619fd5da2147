"""Client-side frame log: the Locust users' requests as frame-log rows, ``source="client"``.

A protocol-agnostic Locust plugin (docs/design.md, "Frame log" and "Command line"). The
packaged locustfile calls :func:`install`, which adds three options to Locust's command
line:

``--frametap-framelog DIR``
    write the frame log into ``DIR`` (created when missing); off when not given.
``--frametap-run-id ID`` (or environment ``FRAMETAP_RUN_ID``)
    the rows' ``run_id``; default one new id per Locust process (``frametap demo`` gives
    the proxy and Locust the same one).
``--frametap-framelog-format parquet|jsonl``
    file format, default ``parquet`` (zstd).

Every process that runs users writes its own files with the shared writer of
:mod:`proxy.framelog` (``FrameLog(dir, source="client")``: file names carry host and pid,
so the children of ``--processes N`` and the workers of a distributed run never collide).
A master runs no users and writes nothing. A worker takes the options from its own
command line, else from the master's (Locust hands the master's custom options to its
workers with the first spawn message, which is why the log starts at ``test_start``).

Rows: one per request event whose ``context`` carries a ``"frametap"`` entry (the
convention is documented on :class:`loadgen.userbase.RequestReporter`; events without one,
such as Deliver chunks or failed connects, are not logged):

==================  ===================================================================
column              value
==================  ===================================================================
ts_ns               wall-clock start of the request (the event's ``start_time``)
source, run_id      ``"client"``, the run id
route               where the request went: the connection's remote address
                    (``host:port``, ``[v6]:port``, ``unix:/path``; Locust's ``--host``
                    when the user did not say) - the proxy's listen address when the
                    load goes through one. ``frametap analyze`` names the proxy's route
                    from it when the proxy's run file lists that listener (the join key
                    stays ``peer`` + ``correlation_id``)
protocol            the event's ``request_type`` (Locust's column "Type")
conn_id             the client connection's per-process number
peer                the client socket's local ``ip:port`` (``[v6]:port``): what the proxy
                    logs as the connection's peer when the client connects to it directly
direction           ``"c2s"``
opcode              the request's opcode where the client knows it, else null
opcode_name         the proxy's opcode name of the request (Locust's ``name`` in ``attrs``
                    under ``locust_name`` when it differs)
kind                ``"request"``, or ``"oneway"`` for a request that has no answer
correlation_id      as the proxy's parser assigns it (null when the frame has none)
status              the protocol's status name of the answer; ``"timeout"`` when the
                    client gave up waiting, the exception's class name when the
                    connection failed; null for a oneway request
outcome             ``"ok"`` unless Locust counted the request as a failure
latency_ns          the client-measured time, Locust's unrounded ``response_time`` in ns
messages            messages the exchange carried (sent or received)
resource            topic / stream when the users say
frame_bytes etc.    null
==================  ===================================================================

Besides the frame log, the process that runs the test (a plain run, or the master of a
distributed one or of ``--processes``) writes a run file into the same directory
(:mod:`proxy.runinfo`, ``run-client-....json``): host, users, spawn rate, run time, user
classes and their protocols, and at the end of each test Locust's own totals and errors
per request type and name - what the analysis report's headline quotes.

Per request the users' side appends one row dict to a :class:`~proxy.framelog.RowBuffer`
(never blocks; overflow is dropped and counted); encoding and writing happen off the
users' event loop, in gevent's pool of native threads (:class:`GeventFrameLog`: gevent's
monkey-patching would turn the writer's thread into a greenlet). What that costs is in
docs/benchmarks-loadgen.md.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time

from loadgen.pluginbase import install_once
from loadgen.userbase import RequestReporter
from proxy.framelog import FORMATS, FrameLog, RowBuffer, new_run_id
from proxy.runinfo import RunInfo

__all__ = ["install", "add_arguments", "ClientLog", "GeventFrameLog", "RUN_ID_ENV"]

log = logging.getLogger("frametap.clientlog")

#: Environment variable naming the run id (``frametap demo`` sets it).
RUN_ID_ENV = "FRAMETAP_RUN_ID"


# ---------------------------------------------------------------------- the writer

def _gevent_pool():
    """gevent's native thread pool when threading is monkey-patched (Locust), else None."""
    gevent = sys.modules.get("gevent")
    if gevent is None:
        return None
    from gevent import monkey
    if not monkey.is_module_patched("threading"):
        return None
    return gevent.get_hub().threadpool


class GeventFrameLog(FrameLog):
    """:class:`~proxy.framelog.FrameLog` for a gevent-patched process.

    Under gevent's monkey-patching the writer "thread" is a greenlet on the users' event
    loop, and every flush (Arrow conversion, Parquet encoding, disk writes) would stall
    all requests in flight while it lasts. Here the loop stays a greenlet, but each
    flush runs in gevent's pool of native threads; the greenlet that asked waits without
    blocking the loop. The flush lock is a native lock (flushes only run in the pool).
    Without gevent it is a plain FrameLog.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pool = _gevent_pool()
        if self._pool is not None:
            from gevent import monkey
            self._lock = monkey.get_original("_thread", "allocate_lock")()

    def flush(self, finish=False, partial=True):
        # FrameLog's writer loop calls flush(partial=...): the signature must stay
        # FrameLog.flush's (a mismatch killed the writer on its first wake-up, and each
        # process then held its rows until exit and dropped all past the buffer's limit)
        if self._pool is None:
            return FrameLog.flush(self, finish, partial)
        error = self._pool.apply(self._flush_in_pool, (finish, partial))
        if error is not None:           # raised here, in the greenlet that asked (gevent's
            raise error                 # pool would print a traceback of its own)

    def _flush_in_pool(self, finish, partial):
        try:
            FrameLog.flush(self, finish, partial)
        except Exception as exc:
            return exc
        return None


# ---------------------------------------------------------------------- rows

def _failure_status(exception) -> str:
    """The status of a request that got no answer: ``timeout`` or the exception's class."""
    if isinstance(exception, TimeoutError):
        return "timeout"
    return type(exception).__name__


class ClientLog:
    """One process's client-side frame log: a RowBuffer fed by Locust's request event,
    drained into files by a :class:`GeventFrameLog`."""

    def __init__(self, directory: str, run_id: str | None = None, fmt: str = "parquet",
                 flush_interval: float = 1.0, limit: int = 65536, target: str | None = None,
                 **framelog_options):
        self.directory = directory
        self.run_id = run_id or new_run_id()
        #: the rows' route when the request's own context names no target (Locust's host)
        self.target = target
        self.framelog = GeventFrameLog(directory, source="client", fmt=fmt,
                                       flush_interval=flush_interval, **framelog_options)
        self.buffer = self.framelog.add_source(RowBuffer(limit, defaults={
            "source": "client", "run_id": self.run_id, "direction": "c2s"}))
        self._started = False
        self._closed = False

    def start(self) -> "ClientLog":
        self.framelog.start()
        self._started = True
        return self

    def on_request(self, request_type, name, response_time, response_length=0,
                   exception=None, context=None, start_time=None, **_kwargs) -> None:
        """Locust ``request`` event listener: the event's row(s), if it has a frame-log
        context (see :class:`loadgen.userbase.RequestReporter`)."""
        if not context:
            return
        ft = context.get("frametap")
        if ft is None or ft.__class__ is not dict:
            return
        opcode_name = ft.get("opcode_name") or name
        ts_ns = ft.get("ts_ns")
        if ts_ns is None:
            ts_ns = (int(start_time * 1e9) if start_time
                     else time.time_ns() - int(response_time * 1e6))
        row = {"ts_ns": ts_ns, "route": ft.get("target") or self.target,
               "protocol": request_type, "conn_id": ft.get("conn_id"),
               "peer": ft.get("peer"), "opcode": ft.get("opcode"),
               "opcode_name": opcode_name, "kind": ft.get("kind") or "request",
               "resource": ft.get("resource"),
               "attrs": None if opcode_name == name else {"locust_name": name}}
        failed = None if exception is None else _failure_status(exception)
        items = ft.get("items")
        append = self.buffer.append
        if items is None:
            status = ft.get("status")
            row["correlation_id"] = ft.get("correlation_id")
            row["status"] = status if status is not None else failed
            row["outcome"] = "ok" if exception is None else "error"
            row["messages"] = ft.get("messages", 0)
            row["latency_ns"] = int(response_time * 1e6)
            append(row)
            return
        for correlation_id, ms, status, outcome in items:
            item = dict(row)
            item["correlation_id"] = correlation_id
            item["status"] = status if status is not None else failed
            item["outcome"] = outcome
            item["messages"] = 1
            item["latency_ns"] = int(ms * 1e6)
            append(item)

    def flush(self, finish: bool = False) -> None:
        """Write what is buffered now (``finish``: and complete the open file)."""
        if self._started and not self._closed:
            self.framelog.flush(finish)

    def close(self) -> None:
        """Write the rest and complete the open file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.framelog.close()
        fl = self.framelog
        records = sum(fl.records.values())
        dropped = sum(fl.dropped().values())
        log.info("frametap: client frame log: %d rows in %d file(s) in %s (run_id %s)",
                 records, fl.files, self.directory, self.run_id)
        if dropped or fl.write_errors:
            log.warning("frametap: client frame log dropped %d rows (%d write errors)",
                        dropped, fl.write_errors)


# ---------------------------------------------------------------------- Locust wiring

def add_arguments(parser) -> None:
    """Locust ``init_command_line_parser`` listener: the plugin's options (in their own
    help section; not offered in the web UI, which only lists the parser's own
    arguments)."""
    group = parser.add_argument_group(
        "frametap client frame log",
        "One row per request of the frametap users, the proxy's frame-log schema with "
        "source=client (docs/design.md, \"Frame log\").")
    group.add_argument(
        "--frametap-framelog", metavar="DIR", default=None,
        help="Write the client-side frame log into DIR (created when missing). Every "
             "process that runs users writes its own files; a master writes none.")
    group.add_argument(
        "--frametap-run-id", metavar="ID", default=None, env_var=RUN_ID_ENV,
        help=f"run_id of the rows (also ${RUN_ID_ENV}); default: a new one per Locust "
             f"process.")
    group.add_argument(
        "--frametap-framelog-format", choices=FORMATS, default=None,
        help="Frame-log file format (default parquet).")


class _Plugin:
    """The per-process state: the options this process was given itself, and the log."""

    LISTENERS = {"init": "on_init", "test_start": "on_test_start",
                 "test_stop": "on_test_stop", "quitting": "on_quitting", "quit": "close"}

    def __init__(self):
        self.own = None          # (dir, run_id, format) from this process's command line
        self.log: ClientLog | None = None
        self.environment = None
        self.runinfo: RunInfo | None = None
        self.master_run_id: str | None = None

    @staticmethod
    def _is_master(environment) -> bool:
        from locust.runners import MasterRunner
        return isinstance(environment.runner, MasterRunner)

    @staticmethod
    def _options(environment):
        opts = environment.parsed_options
        if opts is None:
            return (None, None, None)
        return (getattr(opts, "frametap_framelog", None),
                getattr(opts, "frametap_run_id", None),
                getattr(opts, "frametap_framelog_format", None))

    def on_init(self, environment, **_kwargs) -> None:
        self.own = self._options(environment)
        self.environment = environment
        directory = self.own[0]
        if directory and self._is_master(environment):
            # one run id for the whole distributed run: the master's goes to its workers
            # with the first spawn message (unless each was given its own)
            self.master_run_id = self.own[1] or new_run_id()
            if environment.parsed_options is not None:
                environment.parsed_options.frametap_run_id = self.master_run_id
        if directory:
            self._keep_totals(environment)
        if directory:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as exc:
                sys.stderr.write(f"locust: --frametap-framelog {directory}: cannot create "
                                 f"the directory: {exc.strerror or exc}\n")
                sys.exit(2)

    def on_test_start(self, environment, **_kwargs) -> None:
        if self._is_master(environment):
            self._run_file(environment)
            return
        if self.log is not None:
            self._run_file(environment)
            return
        own = self.own or (None, None, None)
        given = self._options(environment)      # a worker: the master's, once spawned
        directory, run_id, fmt = (a or b for a, b in zip(own, given))
        if not directory:
            return
        fmt = fmt or "parquet"
        if fmt not in FORMATS:     # only a master's value can bypass argparse's choices
            log.error("frametap: --frametap-framelog-format %r: expected one of %s; "
                      "client frame log off", fmt, ", ".join(FORMATS))
            return
        self.environment = environment
        self.log = ClientLog(directory, run_id, fmt, target=host_target(environment.host)).start()
        environment.events.request.add_listener(self.log.on_request)
        RequestReporter.frame_log = True
        atexit.register(self.close, at_exit=True)
        log.info("frametap: client frame log in %s (run_id %s, pid %d)", directory,
                 self.log.run_id, os.getpid())
        self._run_file(environment)

    def _run_file(self, environment) -> None:
        """The run file (:mod:`proxy.runinfo`) of the process that runs the test: a plain
        run or a master (workers' numbers reach their master, which writes them)."""
        from locust.runners import WorkerRunner
        if isinstance(environment.runner, WorkerRunner):
            return
        directory = (self.own or (None,))[0]
        if not directory:
            return
        section = locust_settings(environment)
        if self.runinfo is None:
            run_id = self.log.run_id if self.log is not None else self.master_run_id
            self.runinfo = RunInfo(directory, "client", run_id, locust=section)
            self.runinfo.write()
        else:
            self.runinfo.update(locust=section)

    def on_test_stop(self, environment, **_kwargs) -> None:
        # a finished test's rows in complete files now (the web UI may stay up for long)
        if self.log is not None:
            self.log.flush(finish=True)
        self._totals(environment)

    def _keep_totals(self, environment) -> None:
        """Take Locust's totals for the run file just before ``--json`` / ``--json-file``
        print them: Locust empties its per-name stats as it serializes them for that
        (``get_stripped_report``), after the master's last worker reports arrived and
        before ``quit``. (A worker serializes its stats for every report: its totals are
        its master's business.)"""
        from locust.runners import WorkerRunner
        stats = environment.stats
        if isinstance(environment.runner, WorkerRunner) or stats is None:
            return
        serialize = stats.serialize_stats

        def serialize_stats():
            self._totals(environment)
            return serialize()
        stats.serialize_stats = serialize_stats

    def on_quitting(self, environment, **_kwargs) -> None:
        self._totals(environment)

    def _totals(self, environment) -> None:
        """Locust's totals into the run file.  Taken at test_stop, at quitting and at
        quit: Locust's ``--json`` / ``--json-file`` empty its per-name stats when they
        print them (between quitting and quit), so an empty table never replaces a
        full one."""
        if self.runinfo is None or environment is None:
            return
        totals = locust_totals(environment)
        if totals["stats"] or not (self.runinfo.data.get("locust") or {}).get("stats"):
            self.runinfo.update(locust=totals)
        else:
            self.runinfo.update(locust={"errors": totals["errors"],
                                        "errors_left_off": totals["errors_left_off"],
                                        "total": totals["total"]})

    def close(self, at_exit=False, **_kwargs) -> None:
        """Locust ``quit`` listener (after the users' on_stop requests); also run at
        interpreter exit in case ``quit`` never fired."""
        if not at_exit:
            self._totals(self.environment)
        runinfo, self.runinfo = self.runinfo, None
        if runinfo is not None:
            runinfo.finish()
        log_, self.log = self.log, None
        if log_ is None:
            return
        if at_exit:      # the gevent hub may be gone: flush in this thread
            log_.framelog._pool = None
        RequestReporter.frame_log = False
        if self.environment is not None:
            self.environment.events.request.remove_listener(log_.on_request)
        log_.close()


def host_target(host):
    """Locust's ``--host`` as the address the users connect to (``host:port``,
    ``unix:/path``): the scheme and any path dropped; None without a host."""
    if not host:
        return None
    text = host.strip()
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme.lower() == "ipc":
            return "unix:" + rest
        text = rest.split("/", 1)[0] if not rest.startswith("/") else rest
    return text.rstrip("/") or None


def locust_settings(environment) -> dict:
    """The ``locust`` section of the run file: what was asked of Locust."""
    import locust
    opts = environment.parsed_options
    classes = list(environment.user_classes or [])

    def opt(name):
        return getattr(opts, name, None) if opts is not None else None
    return {
        "host": environment.host, "target": host_target(environment.host),
        "users": opt("num_users"), "spawn_rate": opt("spawn_rate"),
        "run_time_s": opt("run_time"), "headless": opt("headless"),
        "processes": opt("processes"), "expect_workers": opt("expect_workers")
        if opt("master") else None,
        "user_classes": sorted(c.__name__ for c in classes),
        "protocols": sorted({getattr(c, "request_type", "") for c in classes} - {""}),
        "stop_timeout": opt("stop_timeout"), "locust_version": locust.__version__,
        "protocols_env": os.environ.get("FRAMETAP_PROTOCOLS") or None,
    }


def locust_totals(environment, max_errors=200) -> dict:
    """Locust's own numbers at the end of a test, per (type, name): requests, failures,
    median and 99th percentile (Locust's rounded histogram, ms), and its error list."""
    stats = environment.stats
    entries = []
    for (name, method), e in sorted(stats.entries.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if not (e.num_requests or e.num_failures):
            continue
        answered = e.num_requests - e.num_none_requests
        entries.append({
            "type": method, "name": name, "requests": e.num_requests,
            "failures": e.num_failures,
            "p50_ms": e.get_response_time_percentile(0.5) if answered else None,
            "p99_ms": e.get_response_time_percentile(0.99) if answered else None,
            "avg_ms": round(e.avg_response_time, 3) if answered else None,
            "max_ms": e.max_response_time if answered else None})
    errors = sorted(({"type": err.method, "name": err.name, "error": str(err.error)[:300],
                      "occurrences": err.occurrences} for err in stats.errors.values()),
                    key=lambda r: -r["occurrences"])
    total = stats.total
    return {"stats": entries, "errors": errors[:max_errors],
            "errors_left_off": max(0, len(errors) - max_errors),
            "total": {"requests": total.num_requests, "failures": total.num_failures},
            "first_request": _iso(total.start_time) if total.start_time else None,
            "last_request": _iso(total.last_request_timestamp)
            if total.last_request_timestamp else None}


def _iso(seconds):
    import datetime
    t = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (t.microsecond // 1000)


def install(events=None) -> None:
    """Hook the plugin into Locust's ``events`` (default ``locust.events``); once per
    process, so a locustfile may call it unconditionally."""
    install_once(_Plugin, add_arguments, events)


# ---------------------------------------------------------------------- launcher

if __name__ == "__main__":
    # ``python -m loadgen.clientlog [locust options]``: the same as ``python -m
    # loadgen.plugins`` (Locust with every frametap plugin loaded first). Run as a script
    # this file is ``__main__``, not loadgen.clientlog, so the import is no cycle.
    from loadgen.plugins import main
    sys.exit(main())
