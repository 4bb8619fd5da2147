"""Sample FlyMQ traffic for the parser benchmark (bench/parser_bench.py).

Every protocol's ``samples`` module offers the same three names: ``bench_frames``,
``TARGET_FPS`` and ``TARGET_RATIO``.
"""

import struct

from proxy.protocols.flymq.constants import FLAG_BINARY, MAGIC, PRODUCE, VERSION

TARGET_FPS = 10_000_000      # compiled parser, frames/s (requests and responses both count)
TARGET_RATIO = 20.0          # compiled / pure-Python


def frame(opcode, payload):
    """Header per docs/design.md, "FlyMQ" (wire format)."""
    return struct.pack(">BBBBI", MAGIC, VERSION, opcode, FLAG_BINARY, len(payload)) + payload


def produce_request(size):
    # topic "bench", no key, value filling the rest, partition -1 ("PRODUCE (0x01)")
    value = b"v" * (size - 19)
    return frame(PRODUCE, b"\x00\x05bench" + struct.pack(">I", 0) + struct.pack(">I", len(value))
                 + value + struct.pack(">i", -1))


def produce_response(offset):
    # RecordMetadata: topic, partition, offset, timestamp, key_size, value_size
    return frame(PRODUCE, b"\x00\x05bench" + struct.pack(">iQqii", 0, offset, 1705123456000, -1, 45))


def bench_frames(n, size):
    """(description, requests, responses): ``n`` PRODUCE requests with ``size``-byte
    payloads and their ``n`` responses, response i answering request i."""
    return (f"{n} PRODUCE ({size} B payload) + {n} responses",
            [produce_request(size)] * n, [produce_response(i) for i in range(n)])
