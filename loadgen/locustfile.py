"""frametap's packaged locustfile: ``locust -f loadgen/locustfile.py --host HOST:PORT``.

``FRAMETAP_PROTOCOLS`` (comma-separated, default: every protocol listed in ``PROTOCOLS``)
selects which protocols' user classes this file exposes to Locust. Each protocol adds one
line to ``PROTOCOLS``: module path and the user classes it contributes. Protocol-specific
settings are read from ``FRAMETAP_<PROTOCOL>_*`` variables by the user modules.
"""

import importlib
import os
import sys

# `locust -f loadgen/locustfile.py` puts loadgen/ on sys.path, not the project root.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

PROTOCOLS = {
    "flymq": ("loadgen.flymq.users", ("FlyMQProducer", "FlyMQConsumer")),
    "rabbitmq-stream": ("loadgen.rabbitmq_stream.users", ("StreamPublisher", "StreamConsumer")),
    "rocketmq": ("loadgen.rocketmq.users", ("RocketMQProducer", "RocketMQConsumer")),
}


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
    _module_name, _classes = PROTOCOLS[_name]
    _module = importlib.import_module(_module_name)
    for _cls in _classes:
        globals()[_cls] = getattr(_module, _cls)
