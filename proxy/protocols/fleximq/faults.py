"""fleximq error replies for the fault engine (interface: proxy/protocols/fault_replies.py).

A REQ with a ``reqrep.id`` is answered as the broker answers a request it refuses
(docs/design.md, "fleximq"; ``loadgen/fleximq/server.py``): a REP from the broker
(base-header ClientID 1), in the request's framing (its version, zero reserved bytes,
MessagePack header and payload), with header ``routing`` = the requester (the REQ's
base-header ClientID), ``reqrep = {type: "correlation", id: <the REQ's id>}`` and
``status`` = the code; the payload is ``{"error": message}``.

No reply (None): every frame that is not a REQ (JOIN, PING and the one-way types), and a
REQ without ``reqrep.id`` (nothing could match an answer to it).  Statuses are the
document's numeric codes (§5.1; the metrics show them as numbers); the names of §5.1 in
upper snake case (``SERVICE_UNAVAILABLE``) are accepted too.  2xx codes are successes.
Over a WebSocket route, the engine wraps the reply in a binary WebSocket message.
"""

import struct

import msgpack

from proxy.protocols.fault_replies import FaultReplyError, default_message, resolve_status
from proxy.protocols.fleximq.header import REP, REQ, summarize
from proxy.protocols.fleximq.constants import BROKER_ID, PREFIX, VERSION, status_name

__all__ = ["DEFAULT_ERROR", "ERROR_NAMES", "error_status", "error_reply", "is_request"]

PROTOCOL = "fleximq"
DEFAULT_ERROR = "500"
#: §5.1's error codes by name (the ``status`` label shows the number).
ERROR_NAMES = {
    "BAD_REQUEST": 400, "UNAUTHORIZED": 401, "FORBIDDEN": 403, "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405, "REQUEST_TIMEOUT": 408, "CONFLICT": 409,
    "PAYLOAD_TOO_LARGE": 413, "TOO_MANY_REQUESTS": 429,
    "INTERNAL_SERVER_ERROR": 500, "NOT_IMPLEMENTED": 501, "BAD_GATEWAY": 502,
    "SERVICE_UNAVAILABLE": 503, "GATEWAY_TIMEOUT": 504,
    "CLIENT_NOT_FOUND": 600, "TOPIC_NOT_FOUND": 601, "INVALID_ROUTING": 602,
    "SUBSCRIPTION_FAILED": 603, "AUTHENTICATION_FAILED": 604, "JOIN_REJECTED": 605,
}
STATUS_MAX = 0xFFFFFFFF                 # the header's status is an unsigned 32-bit integer

_PREFIX = struct.Struct(">BBI16sIQ")


def error_status(value):
    """``(code, label)`` of a status number (``503``, ``"503"``) or §5.1 name."""
    return resolve_status(PROTOCOL, value, ERROR_NAMES, status_name, 0, STATUS_MAX,
                          success=range(200, 300), hint="; 2xx are successes")


def _request(request):
    """(version, type, client id, Summary of the header) of one whole frame."""
    b = bytes(request)
    n = len(b)
    if n < PREFIX:
        raise FaultReplyError(f"fleximq: a frame has at least {PREFIX} bytes, got {n}")
    version, mtype, cid, _res, hlen, plen = _PREFIX.unpack_from(b)
    if PREFIX + hlen + plen != n:
        raise FaultReplyError(
            f"fleximq: header length {hlen} + payload length {plen} do not describe the "
            f"{n}-byte frame")
    return version, mtype, cid, b[PREFIX:PREFIX + hlen]


def _requester(request):
    """(version, client id, reqrep.id) of a REQ that expects a REP, else None."""
    version, mtype, cid, header = _request(request)
    if mtype != REQ or version != VERSION:
        return None                          # the parsers count other versions as one-way
    s = summarize(header)
    if s.malformed:
        raise FaultReplyError("fleximq: the REQ's header is not a MessagePack map")
    if s.rr_id is None:
        return None
    return version, cid, s.rr_id


def is_request(request):
    """True for a REQ with a ``reqrep.id`` (what :func:`error_reply` answers)."""
    try:
        return _requester(request) is not None
    except ValueError:
        return False


def error_reply(request, code, label="", message=""):
    """The broker's REP with status ``code`` for a REQ (one whole frame), or None."""
    got = _requester(request)
    if got is None:
        return None
    version, cid, rid = got
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= STATUS_MAX:
        raise FaultReplyError(f"fleximq: status {code!r} is not an unsigned 32-bit integer")
    header = msgpack.packb({
        "routing": [{"client_id": cid}],
        "reqrep": {"type": "correlation", "id": rid.decode("utf-8")},
        "status": code}, use_bin_type=True)
    payload = msgpack.packb({"error": default_message(PROTOCOL, label or str(code), message)},
                            use_bin_type=True)
    return _PREFIX.pack(version, REP, BROKER_ID, bytes(16), len(header),
                        len(payload)) + header + payload
