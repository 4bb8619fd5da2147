"""frametap's Locust plugins, installed together: the client-side frame log
(:mod:`loadgen.clientlog`), the Prometheus exporter (:mod:`loadgen.locustmetrics`) and
the run's own plumbing (:class:`RunPlumbing`: ``--frametap-ready-file``, one ``--json``
document per run).

The packaged locustfile calls :func:`install`; ``frametap load`` runs :func:`main`, which
installs them before Locust parses its command line so that ``--help`` lists their
options too (Locust prints ``--help`` before importing the locustfile: locustio/locust#2917).
"""

from __future__ import annotations

import os
import sys

from loadgen import clientlog, faultplugin, locustmetrics, tlsopts
from loadgen.pluginbase import install_once, installed
from proxy.addresses import format_peer
from proxy.readyfile import remove_ready_file, write_ready_file

__all__ = ["install", "install_once", "main"]

def _add_run_arguments(parser) -> None:
    group = parser.add_argument_group("frametap run")
    group.add_argument(
        "--frametap-ready-file", metavar="PATH", default=None,
        help="Once the master (or a plain run) is listening, write JSON naming its "
             "addresses to PATH (atomically; removed when Locust quits): {\"pid\": N, "
             "\"role\": \"master\" or \"local\", \"master\": HOST:PORT or null, "
             "\"metrics\": HOST:PORT or null}. With --master-bind-port 0 or "
             "--frametap-metrics HOST:0 the kernel picks free ports and this file says which "
             "(--processes cannot use port 0: its workers are forked before the master binds).")


class RunPlumbing:
    """What a run needs beyond Locust's own behaviour:

    * ``--frametap-ready-file PATH``: the bound addresses of the master's worker port and
      of the ``--frametap-metrics`` endpoint (see :mod:`proxy.readyfile`), so tests and
      scripts can bind port 0 instead of guessing a free port;
    * ``--json`` prints one document per run: a worker (``--worker``, or a child of
      ``--processes N``) sends its numbers to the master and prints no ``[]`` of its own
      (Locust prints ``--json`` in every process).
    """

    LISTENERS = {"init": "on_init", "quit": "on_quit"}

    def __init__(self):
        self.ready_file = None

    def on_init(self, environment, runner=None, **_kwargs) -> None:
        from locust.runners import MasterRunner, WorkerRunner
        options = environment.parsed_options
        runner = runner if runner is not None else environment.runner
        if options is None:
            return
        if isinstance(runner, WorkerRunner):
            if getattr(options, "json", False):
                options.json = False      # the master prints the run's one document
            return
        if isinstance(runner, MasterRunner) and getattr(options, "processes", None) and \
                options.master_bind_port == 0:
            # the children were forked before this bind and connect to --master-port
            sys.stderr.write("locust: --processes cannot use --master-bind-port 0 (its workers "
                             "are started before the master binds); give a port\n")
            sys.exit(2)
        path = getattr(options, "frametap_ready_file", None)
        if not path:
            return
        master = None
        if isinstance(runner, MasterRunner):
            host = options.master_bind_host
            host = "0.0.0.0" if host in ("*", "") else host
            port = runner.server.port
            master = format_peer((host, port))
        exporter = installed(locustmetrics._Plugin)
        server = getattr(exporter, "server", None)
        try:
            write_ready_file(path, {"pid": os.getpid(),
                                    "role": "master" if master else "local",
                                    "master": master,
                                    "metrics": None if server is None else server.address})
        except OSError as exc:
            sys.stderr.write(f"locust: --frametap-ready-file {path}: cannot write: "
                             f"{exc.strerror or exc}\n")
            sys.exit(2)
        self.ready_file = path

    def on_quit(self, **_kwargs) -> None:
        if self.ready_file is not None:
            remove_ready_file(self.ready_file)
            self.ready_file = None


def install(events=None) -> None:
    """Install every plugin into Locust's ``events`` (each once per process)."""
    clientlog.install(events)
    locustmetrics.install(events)
    tlsopts.install(events)
    install_once(RunPlumbing, _add_run_arguments, events)
    faultplugin.install(events)            # --frametap-fault: faults armed for a run


def main(argv=None):
    """``python -m loadgen.plugins [locust options]``: Locust with the plugins loaded
    first; otherwise the same as ``locust``. ``-f`` defaults to the packaged locustfile."""
    args = list(sys.argv[1:] if argv is None else argv)
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "locustfile.py")
    if not any(a in ("-f", "--locustfile") or a.startswith("--locustfile=") for a in args):
        args = ["-f", packaged] + args
    install()
    from loadgen.loadargs import precheck
    problem = precheck(args) if _locustfiles(args) == [os.path.realpath(packaged)] else None
    if problem:                  # one line, before Locust starts (and logs) anything
        sys.stderr.write(f"frametap load: {problem}\n")
        return 2
    from locust.main import main as locust_main
    sys.argv = ["locust"] + args
    return locust_main()


def _locustfiles(args):
    """The real paths of the ``-f`` / ``--locustfile`` values in ``args`` (the packaged
    locustfile's arguments are checked before Locust starts; another's are its own)."""
    out = []
    for i, a in enumerate(args):
        if a in ("-f", "--locustfile") and i + 1 < len(args):
            out += args[i + 1].split(",")
        elif a.startswith("--locustfile="):
            out += a.partition("=")[2].split(",")
    return [os.path.realpath(p) for p in out]


if __name__ == "__main__":
    # run as a script the module is __main__: use the importable one, so the plugins are
    # installed once (the locustfile installs them from there too)
    from loadgen import plugins
    sys.exit(plugins.main())
