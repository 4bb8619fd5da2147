"""Sample RabbitMQ Stream traffic for the parser benchmark (bench/parser_bench.py)."""

import struct

from proxy.protocols.rabbitmq_stream.constants import PUBLISH, PUBLISH_CONFIRM

TARGET_FPS = 3_000_000       # compiled parser, frames/s (requests and responses both count)
TARGET_RATIO = 20.0          # compiled / pure-Python
MESSAGES = 10                # per Publish
MESSAGE_BYTES = 100


def stream_frame(key, body):
    """RabbitMQ Stream frame: Size u32, Key u16, Version u16 (PROTOCOL.adoc)."""
    return struct.pack(">IHH", len(body) + 4, key, 1) + body


def publish(first_id, count=MESSAGES, size=MESSAGE_BYTES):
    body = struct.pack(">BI", 1, count) + b"".join(
        struct.pack(">QI", first_id + i, size) + b"m" * size for i in range(count))
    return stream_frame(PUBLISH, body)


def publish_confirm(first_id, count=MESSAGES):
    return stream_frame(PUBLISH_CONFIRM, struct.pack(">BI", 1, count) + b"".join(
        struct.pack(">Q", first_id + i) for i in range(count)))


def bench_frames(n, size):
    """(description, requests, responses): ``n`` Publish frames of 10 x 100 B messages
    and one PublishConfirm (10 ids) per Publish; every message is correlated
    publish -> confirm. (``size`` is not used: the message size is fixed.)"""
    return (f"{n} Publish ({MESSAGES} x {MESSAGE_BYTES} B) + {n} PublishConfirm "
            f"({MESSAGES} ids)",
            [publish(MESSAGES * i) for i in range(n)],
            [publish_confirm(MESSAGES * i) for i in range(n)])
