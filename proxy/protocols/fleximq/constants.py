"""fleximq names and limits shared by the parsers, the codec and the tests
(docs/design.md, "fleximq")."""

from proxy.framing_common import clip_corr

PREFIX = 34                    # version, type, client_id, reserved, header/payload lengths
MAX_HEADER_BYTES = 65536       # §7.1
MAX_FRAME_BYTES = 1 << 30      # §7.1 (route key max_frame_bytes)
VERSION = 1
BROKER_ID = 1
INVALID_STATUS = -1            # a status that is not an unsigned 32-bit integer

# message types, numbered by the frame's `type` byte
JOIN, REQ, REP, NOTIF, BCAST, PUB, SUB, UNSUB, PING, PONG = range(10)
TYPE_NAMES = ("JOIN", "REQ", "REP", "NOTIF", "BCAST", "PUB", "SUB", "UNSUB", "PING", "PONG")

# Correlation namespaces (the `tag` of expect/take): a REQ under the direction it
# travelled, a JOIN under 2 + direction, a PING under 4 + direction + 2 * k where k
# numbers the PINGs that carry the same timestamp (the proxy matches a PONG to the
# oldest unanswered one).
TAG_JOIN = 2
TAG_PING = 4
PING_DUP_MAX = 1 << 20


def opcode_name(code):
    return TYPE_NAMES[code] if 0 <= code < len(TYPE_NAMES) else "unknown_%d" % code


def status_name(code):
    """The status label: the numeric code (docs/design.md, "Prometheus metrics")."""
    return "invalid" if code == INVALID_STATUS else str(code)


def is_ok(status):
    return 200 <= status <= 299


_M = 0xFFFFFFFFFFFFFFFF


def id_key(rid: bytes) -> int:
    """The 64-bit correlation key of a ``reqrep.id`` (its UTF-8 bytes, 8 at a time as
    little-endian words, the last zero-padded, multiplied in and folded, then a final
    mix): requests are matched by it; the frame log shows the id itself
    (log_correlation_id; docs/design.md, "fleximq")."""
    h = 0xCBF29CE484222325 ^ len(rid)
    for i in range(0, len(rid), 8):
        h = ((h ^ int.from_bytes(rid[i:i + 8], "little")) * 0x9E3779B97F4A7C15) & _M
        h ^= h >> 29
    h ^= h >> 32
    h = (h * 0xBF58476D1CE4E5B9) & _M
    return h ^ (h >> 29)


def log_correlation_id(rid=None, ping_ts=None):
    """What the proxy writes as ``correlation_id`` for a JOIN/REQ/REP with this
    reqrep.id (str or bytes): the id itself (at most 128 bytes, framing_common.clip_corr),
    or for a PING/PONG with this timestamp: ``ping:<timestamp>``.  Clients write the
    same, so the analysis joins the two views on it."""
    if ping_ts is not None:
        return "ping:%d" % ping_ts
    if isinstance(rid, str):
        rid = rid.encode()
    return clip_corr(rid).decode("utf-8", "replace")
