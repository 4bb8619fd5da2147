"""frametap's packaged locustfile: ``locust -f loadgen/locustfile.py --host HOST:PORT``.

``FRAMETAP_PROTOCOLS`` (comma-separated, default: every protocol with Locust users)
selects which protocols' user classes this file exposes to Locust. The protocols and
their users come from the descriptors in proxy/protocols/<pkg>/__init__.py
(``PROTOCOL.users``, ``PROTOCOL.user_classes``); nothing here names a protocol.
Protocol-specific settings are read from ``FRAMETAP_<PROTOCOL>_*`` variables by the
user modules.

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
from proxy import protocols  # noqa: E402

plugins.install()

#: protocol name -> its ProtocolSpec, for every protocol that offers Locust users
PROTOCOLS = {spec.name: spec for spec in protocols.specs() if spec.users}


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


for _name in selected_protocols():
    globals().update(PROTOCOLS[_name].load_users())
