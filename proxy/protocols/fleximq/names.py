"""fleximq names and limits shared by the parsers, the codec and the tests
(docs/design.md, "fleximq")."""

from proxy.protocols.fleximq.header import TYPE_NAMES

PREFIX = 34                    # version, type, client_id, reserved, header/payload lengths
MAX_HEADER_BYTES = 65536       # §7.1
MAX_FRAME_BYTES = 1 << 30      # §7.1 (route key max_frame_bytes)
VERSION = 1
BROKER_ID = 1
INVALID_STATUS = -1            # a status that is not an unsigned 32-bit integer

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


FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def id_key(rid: bytes) -> int:
    """The 64-bit correlation key of a ``reqrep.id`` (FNV-1a over its UTF-8 bytes): the
    frame log's ``correlation_id`` of a REQ/REP is ``str(id_key(id))`` (the core keeps
    integer ids only; see docs/design.md, "fleximq")."""
    h = FNV_OFFSET
    for c in rid:
        h = ((h ^ c) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def log_correlation_id(rid=None, ping_ts=None):
    """What the proxy writes as ``correlation_id`` for a request with this reqrep.id
    (str or bytes), or for a PING with this timestamp: clients write the same."""
    if ping_ts is not None:
        return str(ping_ts)
    if isinstance(rid, str):
        rid = rid.encode()
    return str(id_key(rid))
