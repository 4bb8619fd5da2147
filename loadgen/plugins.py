"""frametap's Locust plugins, installed together: the client-side frame log
(:mod:`loadgen.clientlog`) and the Prometheus exporter (:mod:`loadgen.locustmetrics`).

The packaged locustfile calls :func:`install`; ``frametap load`` runs :func:`main`, which
installs them before Locust parses its command line so that ``--help`` lists their
options too (Locust prints ``--help`` before importing the locustfile: locustio/locust#2917).
"""

from __future__ import annotations

import os
import sys

__all__ = ["install", "install_once", "main"]

_installed: dict[type, object] = {}


def install_once(plugin_cls, add_arguments, events=None):
    """Hook one plugin into Locust's ``events`` (default ``locust.events``), once per
    process: its command-line options via ``add_arguments`` and one listener per entry of
    ``plugin_cls.LISTENERS`` (event name -> method name). Returns the plugin instance."""
    plugin = _installed.get(plugin_cls)
    if plugin is not None:
        return plugin
    if events is None:
        from locust import events
    plugin = _installed[plugin_cls] = plugin_cls()
    events.init_command_line_parser.add_listener(add_arguments)
    for event, method in plugin_cls.LISTENERS.items():
        getattr(events, event).add_listener(getattr(plugin, method))
    return plugin


def install(events=None) -> None:
    """Install every plugin into Locust's ``events`` (each once per process)."""
    from loadgen import clientlog, locustmetrics
    clientlog.install(events)
    locustmetrics.install(events)


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
