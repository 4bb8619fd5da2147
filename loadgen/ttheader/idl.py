"""The service's IDL (``frametap_demo.thrift``), loaded at run time by ``thriftpy2``, and
the Thrift payload helpers the reference server and the client share.

Nothing is compiled ahead of time: :func:`load` parses the IDL once per process (no
``thrift`` compiler, no generated code) into a module holding the structs (``User``,
``Order``), the declared exception ``NotFound`` and the services (``UserService``,
``LegacyUserService``, each with ``<method>_args`` / ``<method>_result`` classes).
Payloads are encoded and decoded by ``thriftpy2``'s protocols: binary (its Cython
codec when built, strict or non-strict on input) or compact, chosen per message; bytes
from a peer are shape-checked first (:func:`reader`, :mod:`loadgen.ttheader.wire`).

Apache's own ``thrift`` library and its generated code are used only by the tests, as an
independent peer (``tests/thrift_real.py``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from loadgen.ttheader import wire

IDL = Path(__file__).with_name("frametap_demo.thrift")
MODULE_NAME = "frametap_demo_thrift"       # thriftpy2 wants the ``_thrift`` suffix

__all__ = ["IDL", "load", "TApplicationException", "TMessageType", "TType", "memory_buffer",
           "protocol", "reader", "is_compact"]

_lock = threading.Lock()
_module = None

from thriftpy2.thrift import TApplicationException, TMessageType, TType  # noqa: E402,F401


def load():
    """The IDL as a module (parsed once per process; thread-safe)."""
    global _module
    if _module is None:
        with _lock:
            if _module is None:
                import thriftpy2
                _module = thriftpy2.load(str(IDL), module_name=MODULE_NAME)
    return _module


def is_compact(payload) -> bool:
    """A compact-protocol message starts with 0x82; anything else is read as binary."""
    return payload[:1] == b"\x82"


def memory_buffer():
    """A thriftpy2 memory transport to encode into (the Cython one when built)."""
    from thriftpy2.transport import TMemoryBuffer
    return TMemoryBuffer()


def protocol(trans, compact: bool):
    """A thriftpy2 protocol to encode with: compact, or strict binary (its Cython codec
    when built)."""
    if compact:
        from thriftpy2.protocol import TCompactProtocol
        return TCompactProtocol(trans)
    from thriftpy2.protocol import TBinaryProtocol
    return TBinaryProtocol(trans)


def reader(payload: bytes):
    """A thriftpy2 protocol positioned at the start of ``payload``, a Thrift message from
    a peer (binary, strict or not, or compact, told by its first byte).

    The bytes pass :func:`loadgen.ttheader.wire.check` first (every length and count
    within the message: see there why thriftpy2 needs that), raising
    :class:`~loadgen.ttheader.wire.MalformedMessage`. Binary is then read by the Cython
    codec through a buffered transport over a Python memory buffer, whose short reads
    raise instead of copying past the bytes; compact by the Python codec."""
    wire.check(payload)
    from thriftpy2.transport.memory import TMemoryBuffer as PyMemoryBuffer
    if is_compact(payload):
        from thriftpy2.protocol.compact import TCompactProtocol
        return TCompactProtocol(PyMemoryBuffer(payload))
    from thriftpy2.protocol import TBinaryProtocol
    from thriftpy2.transport import TBufferedTransport
    return TBinaryProtocol(TBufferedTransport(PyMemoryBuffer(payload)), strict_read=False)
