"""frametap's packaged locustfile: ``locust -f loadgen/locustfile.py --host HOST:PORT``.

``FRAMETAP_PROTOCOLS`` (comma-separated) selects which protocols' user classes this
file exposes to Locust. Without it the protocol comes from the command line, checked
before any user starts (:func:`choose_protocols`): the user classes named there, else
``--host``'s scheme (``flymq://HOST:PORT``), else its port when it is exactly one
protocol's usual port (9092 FlyMQ, 5552 RabbitMQ Stream, ...); one line on stderr says
which it picked. A headless run without ``--host``, a host no chosen protocol's users
accept (``tcp://`` for FlyMQ) or a host that names no protocol is one line and exit
status 2. The web UI (no ``--headless``) may get its host in the form: then every
protocol's users are offered.

The protocols and their users come from the descriptors in
proxy/protocols/<pkg>/__init__.py (``PROTOCOL.users``, ``PROTOCOL.user_classes``);
nothing here names a protocol. Protocol-specific settings are read from
``FRAMETAP_<PROTOCOL>_*`` variables by the user modules.

frametap's Locust plugins are installed here (:mod:`loadgen.plugins`): the client-side
frame log (:mod:`loadgen.clientlog`: ``--frametap-framelog DIR``, ``--frametap-run-id ID``,
``--frametap-framelog-format``) and the Prometheus exporter (:mod:`loadgen.locustmetrics`:
``--frametap-metrics HOST:PORT``, ``--frametap-metrics-linger SECONDS``).
"""

import os
import sys

# `locust -f loadgen/locustfile.py` puts loadgen/ on sys.path, not the project root.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from loadgen import plugins  # noqa: E402  (needs the sys.path fix above)
from loadgen.loadargs import PROTOCOLS, LoadArgumentError, choose_protocols  # noqa: E402

plugins.install()


def selected_protocols(text=None):
    """Protocol names chosen by FRAMETAP_PROTOCOLS (all of PROTOCOLS when unset)."""
    if text is None:
        text = os.environ.get("FRAMETAP_PROTOCOLS", "")
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        return list(PROTOCOLS)
    unknown = [n for n in names if n not in PROTOCOLS]
    if unknown:
        raise SystemExit(f"frametap: FRAMETAP_PROTOCOLS={text!r}: unknown protocol "
                         f"{unknown[0]!r} (expected a comma list of: {', '.join(PROTOCOLS)})")
    return names


def check_load_arguments(environment, **_kwargs):
    """Locust ``init`` listener: the protocols and the host, checked before any user
    starts (one line and exit 2 instead of a traceback per user class); the user
    classes narrowed to the chosen protocols'.  A worker takes both from its master."""
    from locust.runners import WorkerRunner
    opts = environment.parsed_options
    if opts is None or isinstance(environment.runner, WorkerRunner):
        return
    headless = bool(getattr(opts, "headless", False) or getattr(opts, "autostart", False))
    named = tuple(getattr(opts, "user_classes", None) or ())
    try:
        chosen, why = choose_protocols(environment.host, named, headless=headless)
    except LoadArgumentError as exc:
        sys.stderr.write(f"frametap load: {exc}\n")
        sys.exit(2)
    if why is None or named:
        return
    keep = {cls for name in chosen for cls in PROTOCOLS[name].user_classes}
    environment.user_classes = [c for c in environment.user_classes if c.__name__ in keep]
    classes = ", ".join(c.__name__ for c in environment.user_classes)
    sys.stderr.write(f"frametap load: running the {', '.join(chosen)} users ({classes}) "
                     f"against {environment.host}: {why} (FRAMETAP_PROTOCOLS chooses)\n")


for _name in selected_protocols():
    globals().update(PROTOCOLS[_name].load_users())

from locust import events as _events  # noqa: E402  (the users imported Locust already)

_events.init.add_listener(check_load_arguments)
