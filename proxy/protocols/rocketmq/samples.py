"""Sample RocketMQ remoting traffic for the parser benchmark (bench/parser_bench.py)."""

import struct

TARGET_FPS = 1_000_000       # compiled parser, frames/s (requests and responses both count)
TARGET_RATIO = 10.0          # compiled / pure-Python

# SEND_MESSAGE_V2 (310) with a realistic ~300-byte JSON header (queue id, opaque to fill)
V2_HEADER = (
    b'{"code":310,"extFields":{"a":"please_rename_unique_group_name","b":"BenchTopic",'
    b'"c":"TBW102","d":"4","e":"%d","f":"0","g":"1732201234567","h":"0",'
    b'"i":"KEYS\\u0001order-000042\\u0002TAGS\\u0001TagA\\u0002WAIT\\u0001true",'
    b'"j":"0","k":"false","m":"false"},"flag":0,"language":"JAVA","opaque":%d,'
    b'"serializeTypeCurrentRPC":"JSON","version":433}')
RESPONSE_HEADER = (
    b'{"code":0,"extFields":{"msgId":"7F00000100002A9F0000000000000%03X","queueId":"%d",'
    b'"queueOffset":"%d"},"flag":1,"language":"JAVA","opaque":%d,'
    b'"serializeTypeCurrentRPC":"JSON","version":433}')


def remoting_frame(header, body=b""):
    """Length u32, serialize type + header length u32, JSON header, body."""
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


def bench_frames(n, size):
    """(description, requests, responses): ``n`` SEND_MESSAGE_V2 requests with
    ``size``-byte bodies and their responses, correlated by opaque."""
    return (f"{n} SEND_MESSAGE_V2 ({len(V2_HEADER) - 4} B JSON header, {size} B body) + "
            f"{n} responses",
            [remoting_frame(V2_HEADER % (i % 4, i), b"x" * size) for i in range(n)],
            [remoting_frame(RESPONSE_HEADER % (i % 4096, i % 4, i, i)) for i in range(n)])
