"""Protocol registry: one sub-package per protocol (DESIGN.md, "Layout").

Each implemented protocol module exposes ``NAME``, ``Parser`` (compiled or twin,
per FRAMETAP_NO_EXTENSIONS), ``MAX_FRAME_BYTES`` and ``DEFAULT_PORT``; those with route options also
``validate_options(options, where) -> dict``.
"""

import importlib

#: Every protocol name of the product (DESIGN.md, "Command line").
KNOWN = ("rocketmq", "fleximq", "flymq", "rabbitmq-stream", "ttheader")

#: Protocols this build can parse, by module.
IMPLEMENTED = {
    "flymq": "proxy.protocols.flymq",
    "rabbitmq-stream": "proxy.protocols.rabbitmq_stream",
    "rocketmq": "proxy.protocols.rocketmq",
}


def load(name):
    """Import and return the protocol module for ``name`` (KeyError if not built)."""
    return importlib.import_module(IMPLEMENTED[name])
