"""FlyMQ wire constants and opcode names (the FlyMQ seed document's operation codes;
docs/design.md, "FlyMQ").

The names are the spec's own; they become the ``opcode`` label of every metric.
"""

MAGIC = 0xAF
VERSION = 0x01
HEADER_SIZE = 8
MAX_FRAME_BYTES = 32 * 1024 * 1024  # MAX_MESSAGE_SIZE: limit on the payload length field

FLAG_BINARY = 0x01
# Bits 1-3 of the flags byte name the compression (docs/design.md, "FlyMQ").
COMPRESSION_MASK = 0x0E
COMPRESSION_SHIFT = 1

PRODUCE = 0x01
CONSUME = 0x02
CREATE_TOPIC = 0x03
METADATA = 0x04
SUBSCRIBE = 0x05
COMMIT = 0x06
FETCH = 0x07
LIST_TOPICS = 0x08
DELETE_TOPIC = 0x09
CONSUME_ZERO_COPY = 0x0A
FETCH_BINARY = 0x0B
AUTH = 0x70
AUTH_RESPONSE = 0x71
WHOAMI = 0x72
ERROR = 0xFF

OPCODES = {
    0x01: "PRODUCE",
    0x02: "CONSUME",
    0x03: "CREATE_TOPIC",
    0x04: "METADATA",
    0x05: "SUBSCRIBE",
    0x06: "COMMIT",
    0x07: "FETCH",
    0x08: "LIST_TOPICS",
    0x09: "DELETE_TOPIC",
    0x0A: "CONSUME_ZERO_COPY",
    0x0B: "FETCH_BINARY",
    0x10: "REGISTER_SCHEMA",
    0x11: "GET_SCHEMA",
    0x12: "LIST_SCHEMAS",
    0x13: "VALIDATE_SCHEMA",
    0x14: "PRODUCE_WITH_SCHEMA",
    0x15: "DELETE_SCHEMA",
    0x20: "FETCH_DLQ",
    0x21: "REPLAY_DLQ",
    0x22: "PURGE_DLQ",
    0x30: "PRODUCE_DELAYED",
    0x31: "CANCEL_DELAYED",
    0x35: "PRODUCE_WITH_TTL",
    0x40: "TXN_BEGIN",
    0x41: "TXN_COMMIT",
    0x42: "TXN_ROLLBACK",
    0x43: "TXN_PRODUCE",
    0x50: "CLUSTER_JOIN",
    0x51: "CLUSTER_LEAVE",
    0x52: "CLUSTER_STATUS",
    0x60: "GET_OFFSET",
    0x61: "RESET_OFFSET",
    0x62: "LIST_GROUPS",
    0x63: "DESCRIBE_GROUP",
    0x64: "GET_LAG",
    0x65: "DELETE_GROUP",
    0x66: "SEEK_TO_TIMESTAMP",
    0x70: "AUTH",
    0x71: "AUTH_RESPONSE",
    0x72: "WHOAMI",
    0x73: "USER_CREATE",
    0x74: "USER_DELETE",
    0x75: "USER_UPDATE",
    0x76: "USER_LIST",
    0x77: "USER_GET",
    0x78: "ACL_SET",
    0x79: "ACL_GET",
    0x7A: "ACL_DELETE",
    0x7B: "ACL_LIST",
    0x7C: "PASSWORD_CHANGE",
    0x7D: "ROLE_LIST",
    0xFF: "ERROR",
}


#: Requests that name a topic (the frame log's ``resource``), per the real server's
#: request decoders (firefly-oss/flymq ``internal/protocol/binary.go``, audited at
#: v1.26.11): opcode -> how many u16-length strings come before the topic (TXN_PRODUCE
#: leads with its transaction id; every other one starts with the topic).  AUTH and the
#: user-management requests (passwords) are deliberately absent: their fields are never
#: read.
TOPIC_FIELD = {op: 0 for op in (
    PRODUCE, CONSUME, CREATE_TOPIC, METADATA, SUBSCRIBE, COMMIT, FETCH, DELETE_TOPIC,
    CONSUME_ZERO_COPY, FETCH_BINARY,
    0x11, 0x12, 0x14, 0x15,             # GET_SCHEMA, LIST_SCHEMAS, PRODUCE_WITH_SCHEMA, DELETE_SCHEMA
    0x20, 0x21, 0x22,                   # FETCH_DLQ, REPLAY_DLQ, PURGE_DLQ
    0x30, 0x35,                         # PRODUCE_DELAYED, PRODUCE_WITH_TTL
    0x60, 0x61, 0x63, 0x64, 0x65,       # GET_OFFSET, RESET_OFFSET, DESCRIBE_GROUP, GET_LAG, DELETE_GROUP
    0x78, 0x79, 0x7A)}                  # ACL_SET, ACL_GET, ACL_DELETE
TOPIC_FIELD[0x43] = 1                   # TXN_PRODUCE: txn_id, then topic


def opcode_name(code: int) -> str:
    """Spec name of ``code``, or ``unknown_<n>`` (docs/design.md, "Prometheus metrics")."""
    return OPCODES.get(code, f"unknown_{code}")


# Statuses: FlyMQ has no status codes on the wire; a response is OK unless it is ERROR
# (0xFF). These are the parsers' status slots (ST_*, not the ERROR opcode above).
ST_OK = 0
ST_ERROR = 1
STATUS_NAMES = {ST_OK: "OK", ST_ERROR: "ERROR"}


def status_name(code: int) -> str:
    return STATUS_NAMES.get(code, f"unknown_{code}")
