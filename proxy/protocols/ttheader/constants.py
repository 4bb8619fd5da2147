"""TTHeader / THeader / Thrift constants and label names shared by both parser twins,
the codec, the reference server and the tests (docs/design.md, "TTHeader")."""

MAX_FRAME_BYTES = 64 << 20          # per-route default; Kitex's own hard cap is 0x3FFFFFFF
HEADER_LIMIT = 128 << 10            # bytes a parser may look at before counting a frame
TT_MAX_HEADER = 65536               # Kitex MaxHeaderSize: TTHeader info section, bytes
NAME_MAX = 4096                     # longest Thrift method name read (longer: not a message)
ZOUT_MAX = 8192                     # zlib payloads: decompressed prefix the parser reads

# framing magics (u16 after LENGTH)
MAGIC_TTHEADER = 0x1000             # Kitex TTHeader: info counts/lengths are u16
MAGIC_THEADER = 0x0FFF              # Apache THeader: varints

# header protocol ids
PROTO_BINARY, PROTO_COMPACT, PROTO_PROTOBUF = 0, 2, 3
# transform ids
ZLIB, SNAPPY = 0x01, 0x03
# info ids
INFO_PADDING, INFO_KEYVALUE, INFO_INTKEYVALUE, INFO_ACL_TOKEN = 0x00, 0x01, 0x10, 0x11

# INFO_INTKEYVALUE keys (Kitex transmeta); others are logged as their decimal number
INT_KEYS = {1: "TRANSPORT_TYPE", 2: "LOG_ID", 3: "FROM_SERVICE", 4: "FROM_CLUSTER",
            5: "FROM_IDC", 6: "TO_SERVICE", 7: "TO_CLUSTER", 8: "TO_IDC", 9: "TO_METHOD",
            10: "ENV", 11: "DEST_ADDRESS", 12: "RPC_TIMEOUT", 13: "READ_TIMEOUT"}
INT_KEY_NAMES = tuple(INT_KEYS.get(i, "") for i in range(14))    # by key, "" = unnamed
TO_METHOD = 9

# Thrift message types
CALL, REPLY, EXCEPTION, ONEWAY = 1, 2, 3, 4

# Status codes as the parser reports them (frametap_responses_total{status}):
# TApplicationException types are their own code; these are negative so they never clash.
ST_OK = -1                          # reply carrying the success field (id 0) or a void reply
ST_EXCEPTION = -2                   # reply carrying a declared (IDL `throws`) exception
ST_UNDECODED = -3                   # reply whose payload the parser cannot read (snappy...)
TAPP_TYPES = ("UNKNOWN", "UNKNOWN_METHOD", "INVALID_MESSAGE_TYPE", "WRONG_METHOD_NAME",
              "BAD_SEQUENCE_ID", "MISSING_RESULT", "INTERNAL_ERROR", "PROTOCOL_ERROR",
              "INVALID_TRANSFORM", "INVALID_PROTOCOL", "UNSUPPORTED_CLIENT_TYPE")

UNKNOWN_NAME = b"unknown"           # opcode of frames whose method cannot be read


def status_name(code):
    """Label of a status code (docs/design.md, "Prometheus metrics": Thrift)."""
    if code == ST_OK:
        return "OK"
    if code == ST_EXCEPTION:
        return "EXCEPTION"
    if code == ST_UNDECODED:
        return "UNDECODED"
    if 0 <= code < len(TAPP_TYPES):
        return TAPP_TYPES[code]
    return "TYPE_%d" % code


def opcode_name(code):
    """Numeric opcodes are never used (methods are interned names)."""
    return "unknown_%d" % code


def int_key_name(key):
    return INT_KEYS.get(key, str(key))
