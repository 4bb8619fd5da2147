"""RabbitMQ Stream protocol constants (docs/design.md, "RabbitMQ Stream": the real
server's deps/rabbitmq_stream/docs/PROTOCOL.adoc wins over the seed draft).

Frame: Size u32 (bytes after the size field), Key u16 (bit 15 set = response),
Version u16, then per command: CorrelationId u32 for request/response commands.
"""

DEFAULT_PORT = 5552
MAX_FRAME_BYTES = 8 * 1024 * 1024   # default cap until Tune negotiates (RabbitMQ default frame_max 1 MiB)
MIN_FRAME_SIZE = 4                  # Key + Version: the smallest valid Size
RESPONSE_BIT = 0x8000

DECLARE_PUBLISHER = 1
PUBLISH = 2
PUBLISH_CONFIRM = 3
PUBLISH_ERROR = 4
QUERY_PUBLISHER_SEQUENCE = 5
DELETE_PUBLISHER = 6
SUBSCRIBE = 7
DELIVER = 8
CREDIT = 9
STORE_OFFSET = 10
QUERY_OFFSET = 11
UNSUBSCRIBE = 12
CREATE = 13
DELETE = 14
METADATA = 15
METADATA_UPDATE = 16
PEER_PROPERTIES = 17
SASL_HANDSHAKE = 18
SASL_AUTHENTICATE = 19
TUNE = 20
OPEN = 21
CLOSE = 22
HEARTBEAT = 23
ROUTE = 24
PARTITIONS = 25
CONSUMER_UPDATE = 26
EXCHANGE_COMMAND_VERSIONS = 27
STREAM_STATS = 28

COMMANDS = {
    1: "DeclarePublisher", 2: "Publish", 3: "PublishConfirm", 4: "PublishError",
    5: "QueryPublisherSequence", 6: "DeletePublisher", 7: "Subscribe", 8: "Deliver",
    9: "Credit", 10: "StoreOffset", 11: "QueryOffset", 12: "Unsubscribe", 13: "Create",
    14: "Delete", 15: "Metadata", 16: "MetadataUpdate", 17: "PeerProperties",
    18: "SaslHandshake", 19: "SaslAuthenticate", 20: "Tune", 21: "Open", 22: "Close",
    23: "Heartbeat", 24: "Route", 25: "Partitions", 26: "ConsumerUpdate",
    27: "ExchangeCommandVersions", 28: "StreamStats",
}

#: Commands without a correlation id (docs/design.md, "RabbitMQ Stream"): one-way frames.
NO_CORRELATION = frozenset({TUNE, PUBLISH, PUBLISH_CONFIRM, PUBLISH_ERROR, DELIVER, CREDIT,
                            STORE_OFFSET, HEARTBEAT, METADATA_UPDATE})
#: Requests the server sends to the client (correlated in the s2c direction).
SERVER_REQUESTS = frozenset({CLOSE, CONSUMER_UPDATE})
#: Responses that carry no response code right after the correlation id.
NO_RESPONSE_CODE = frozenset({METADATA})
#: The Credit response (sent only on errors) has no correlation id:
#: ResponseCode u16, SubscriptionId u8.

RESPONSE_CODES = {
    0x01: "OK",
    0x02: "STREAM_DOES_NOT_EXIST",
    0x03: "SUBSCRIPTION_ID_ALREADY_EXISTS",
    0x04: "SUBSCRIPTION_ID_DOES_NOT_EXIST",
    0x05: "STREAM_ALREADY_EXISTS",
    0x06: "STREAM_NOT_AVAILABLE",
    0x07: "SASL_MECHANISM_NOT_SUPPORTED",
    0x08: "AUTHENTICATION_FAILURE",
    0x09: "SASL_ERROR",
    0x0A: "SASL_CHALLENGE",
    0x0B: "SASL_AUTHENTICATION_FAILURE_LOOPBACK",
    0x0C: "VIRTUAL_HOST_ACCESS_FAILURE",
    0x0D: "UNKNOWN_FRAME",
    0x0E: "FRAME_TOO_LARGE",
    0x0F: "INTERNAL_ERROR",
    0x10: "ACCESS_REFUSED",
    0x11: "PRECONDITION_FAILED",
    0x12: "PUBLISHER_DOES_NOT_EXIST",
    0x13: "NO_OFFSET",
}
OK = 0x01
STREAM_DOES_NOT_EXIST = 0x02
SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
STREAM_ALREADY_EXISTS = 0x05
STREAM_NOT_AVAILABLE = 0x06
SASL_MECHANISM_NOT_SUPPORTED = 0x07
AUTHENTICATION_FAILURE = 0x08
SASL_ERROR = 0x09
SASL_CHALLENGE = 0x0A
SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
VIRTUAL_HOST_ACCESS_FAILURE = 0x0C
UNKNOWN_FRAME = 0x0D
FRAME_TOO_LARGE = 0x0E
INTERNAL_ERROR = 0x0F
ACCESS_REFUSED = 0x10
PRECONDITION_FAILED = 0x11
PUBLISHER_DOES_NOT_EXIST = 0x12
NO_OFFSET = 0x13

#: Frame-log ``resource``: where a request's stream is, as the fields its body starts
#: with (PROTOCOL.adoc): ``pub`` / ``sub`` a publisher / subscription id (u8), ``skip`` a
#: string passed over (a reference, a routing key), ``skip2`` a u16 passed over, ``one``
#: an array count that must be 1 (Metadata of a single stream), ``stream`` the stream
#: name (remembered for the id read before it: Publish, PublishConfirm, PublishError and
#: Deliver carry it), ``recall`` the stream of the id read before it, ``forget`` the same
#: and the id is forgotten.  SASL, PeerProperties and Open are never read.
RESOURCE_PROGRAMS = {
    DECLARE_PUBLISHER: ("pub", "skip", "stream"),
    QUERY_PUBLISHER_SEQUENCE: ("skip", "stream"),
    DELETE_PUBLISHER: ("pub", "forget"),
    SUBSCRIBE: ("sub", "stream"),
    CREDIT: ("sub", "recall"),
    STORE_OFFSET: ("skip", "stream"),
    QUERY_OFFSET: ("skip", "stream"),
    UNSUBSCRIBE: ("sub", "forget"),
    CREATE: ("stream",),
    DELETE: ("stream",),
    METADATA: ("one", "stream"),
    METADATA_UPDATE: ("skip2", "stream"),
    ROUTE: ("skip", "stream"),                  # the super stream
    PARTITIONS: ("stream",),                    # the super stream
    CONSUMER_UPDATE: ("sub", "recall"),
    STREAM_STATS: ("stream",),
}
RESOURCE_OPS = ("end", "pub", "sub", "skip", "skip2", "one", "stream", "recall", "forget")

#: Subscribe offset types.
OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT, OFFSET_OFFSET, OFFSET_TIMESTAMP = 1, 2, 3, 4, 5

#: Osiris chunk header (Deliver): 48 bytes; NumRecords is the u32 at offset 4.
CHUNK_HEADER_SIZE = 48
CHUNK_MAGIC_VERSION = 0x50   # magic 0x5 in the high nibble, version 0 (osiris_log.erl)


def command_name(key: int) -> str:
    """Name of a command key (response bit ignored), or ``unknown_<n>``."""
    return COMMANDS.get(key & 0x7FFF, f"unknown_{key & 0x7FFF}")


def status_name(code: int) -> str:
    return RESPONSE_CODES.get(code, f"unknown_{code}")
