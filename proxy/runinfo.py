"""Run files: what ran, written next to the frame logs (docs/analysis.md, "Run files").

A frame log holds what crossed the wire, not what the run was: how many Locust users, at
what spawn rate, for how long, through which routes and with what timeouts.  Each
process that writes frame logs (the proxy, a Locust run) and ``frametap demo`` also write
one small JSON file into the frame-log directory::

    <dir>/run-<source>-<host>-<pid>-<start, UTC %Y%m%dT%H%M%SZ>.json

with ``{"format": "frametap-run/1", "source", "run_id", "host", "pid", "started",
"ended", ...}`` plus a section of its own (``proxy``: the routes; ``locust``: the load
settings and Locust's own totals; ``demo``: the demo's settings).  It is written when the
process starts and again when it ends (``ended`` set), each time under a temporary name
starting with ``.`` and renamed, so a reader never sees half a file.  ``frametap
analyze`` reads every ``run-*.json`` under its paths for the report's headline; the
frame-log readers ignore them (they read ``*.parquet`` and ``*.jsonl`` only).

Writing one is never fatal: a failure is logged once and the run goes on.  Secrets are
never written (no route options, no credentials).
"""

import datetime
import json
import logging
import os
import socket

log = logging.getLogger("frametap.runinfo")

FORMAT = "frametap-run/1"
PREFIX = "run-"
SUFFIX = ".json"


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def _iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (t.microsecond // 1000)


def is_run_file(name):
    """Whether a file name (no directory) is a run file."""
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


class RunInfo:
    """One process's run file.  ``write()`` (re)writes it; ``finish(**sections)`` adds
    to it, sets ``ended`` and writes it for the last time."""

    def __init__(self, directory, source, run_id, **sections):
        self.started = _now()
        host = socket.gethostname().split(".")[0] or "host"
        self.path = os.path.join(directory, f"{PREFIX}{source}-{host}-{os.getpid()}-"
                                            f"{self.started:%Y%m%dT%H%M%SZ}{SUFFIX}")
        self.data = {"format": FORMAT, "source": source, "run_id": run_id, "host": host,
                     "pid": os.getpid(), "started": _iso(self.started), "ended": None}
        self.data.update(sections)
        self._warned = False
        self._written = False

    def write(self):
        """Write the file now (atomically); returns self.  Never raises."""
        directory, name = os.path.split(self.path)
        tmp = os.path.join(directory, "." + name + ".tmp")
        try:
            if not self._written:        # later writes never re-create a directory
                os.makedirs(directory, exist_ok=True)     # someone removed on purpose
            with open(tmp, "w") as f:
                json.dump(self.data, f, indent=1, sort_keys=True, default=str)
                f.write("\n")
            os.replace(tmp, self.path)
            self._written = True
        except OSError as exc:
            if not self._warned:
                log.warning("run file %s: cannot write (%s); the analysis report will not "
                            "know this run's settings", self.path, exc.strerror or exc)
                self._warned = True
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return self

    def update(self, **sections):
        """Merge ``sections`` (dicts merge one level deep) and write."""
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(self.data.get(key), dict):
                self.data[key].update(value)
            else:
                self.data[key] = value
        return self.write()

    def finish(self, **sections):
        self.data["ended"] = _iso(_now())
        return self.update(**sections)


def proxy_section(config, routes):
    """The ``proxy`` section: each route as configured and as bound, and the frame-log
    settings (no route options: they may hold credentials)."""
    from proxy.addresses import format_address
    out = []
    for route in routes:
        cfg = route.cfg
        bound = getattr(route, "address", None)
        out.append({
            "name": cfg.name, "protocol": cfg.protocol,
            "listen": format_address(bound) if bound else format_address(cfg.listen),
            "upstream": format_address(cfg.upstream),
            "request_timeout": cfg.request_timeout, "connect_timeout": cfg.connect_timeout,
            "max_connections": cfg.max_connections, "max_frame_bytes": cfg.max_frame_bytes,
            "framelog": cfg.framelog,
        })
    fl = config.framelog
    return {"routes": out,
            "framelog": None if fl is None else {"format": fl.format, "sample": fl.sample},
            "shutdown_timeout": config.shutdown_timeout}
