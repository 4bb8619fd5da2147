"""FlyMQ error replies for the fault engine (interface: proxy/protocols/fault_replies.py).

The real server answers a failed request with ``WriteError`` (firefly-oss/flymq
``internal/protocol/protocol.go``): ``WriteMessage(w, OpError, []byte(err.Error()))`` —
magic 0xAF, version 0x01, opcode 0xFF, flags 0, the message's plain bytes.  FlyMQ has no
correlation id: the client takes the next frame as the answer to its oldest request, so
the engine must write the reply in the request's place in the connection's FIFO order
(after the answers to the requests before it).  Every c2s frame is a request, so every
well-formed frame gets a reply.  The only status is ``ERROR``: the error frame carries no
code.
"""

import struct

from proxy.protocols.fault_replies import FaultReplyError, default_message, resolve_status
from proxy.protocols.flymq.constants import ERROR, HEADER_SIZE, MAGIC, MAX_FRAME_BYTES, VERSION
from proxy.protocols.flymq.constants import ST_ERROR, status_name

__all__ = ["DEFAULT_ERROR", "ERROR_NAMES", "error_status", "error_reply", "is_request"]

PROTOCOL = "flymq"
DEFAULT_ERROR = "ERROR"
ERROR_NAMES = {"ERROR": ST_ERROR}

_HEAD = struct.Struct(">BBBBI")


def error_status(value):
    """``(code, label)`` of ``ERROR``, the one status a FlyMQ error frame has."""
    return resolve_status(PROTOCOL, value, ERROR_NAMES, status_name, 1, 0)


def _check(request):
    b = bytes(request)
    n = len(b)
    if n < HEADER_SIZE:
        raise FaultReplyError(f"flymq: a frame has at least {HEADER_SIZE} bytes, got {n}")
    magic, _version, _op, _flags, length = _HEAD.unpack_from(b)
    if magic != MAGIC:
        raise FaultReplyError(f"flymq: bad magic 0x{magic:02X} at offset 0 (expected 0xAF)")
    if HEADER_SIZE + length != n:
        raise FaultReplyError(
            f"flymq: payload length {length} does not describe the {n}-byte frame "
            f"(expected {n - HEADER_SIZE})")


def is_request(request):
    """True for every well-formed frame: all c2s FlyMQ frames are requests."""
    try:
        _check(request)
    except ValueError:
        return False
    return True


def error_reply(request, code=ST_ERROR, label="ERROR", message=""):
    """The server's ERROR frame for ``request`` (one whole frame)."""
    _check(request)
    text = default_message(PROTOCOL, label, message).encode("utf-8")[:MAX_FRAME_BYTES]
    return _HEAD.pack(MAGIC, VERSION, ERROR, 0, len(text)) + text
