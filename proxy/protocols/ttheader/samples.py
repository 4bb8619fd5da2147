"""Sample Kitex TTHeader traffic for the parser benchmark (bench/parser_bench.py)."""

from proxy.protocols.ttheader.codec import CALL, REPLY, binary_message, ttheader

TARGET_FPS = 3_000_000       # compiled parser, frames/s (calls and replies both count)
TARGET_RATIO = 20.0          # compiled / pure-Python

INFO = {"strinfo": {"trace-id": "4bf92f3577b34da6"},
        "intinfo": {3: "bench.client", 9: "GetUser"}}


def _args(i):
    """A ~200-byte binary-protocol argument struct: id i64, name string, tags list."""
    name = b"user-%08d" % i + b"x" * 120
    return (b"\x0a\x00\x01" + i.to_bytes(8, "big") +
            b"\x0b\x00\x02" + len(name).to_bytes(4, "big") + name +
            b"\x0f\x00\x03\x0b\x00\x00\x00\x02" + b"\x00\x00\x00\x04gold" +
            b"\x00\x00\x00\x06silver" + b"\x00" * 14 + b"\x00")


def bench_frames(n, size):
    """(description, calls, replies): ``n`` Kitex TTHeader calls with 3 info headers and
    a ~200-byte binary payload (``size`` is ignored: the payload is the issue's), and
    their replies, correlated by seq id."""
    calls = [ttheader(binary_message("GetUser", CALL, i, _args(i)), seq=i, flags=1, **INFO)
             for i in range(n)]
    replies = [ttheader(binary_message("GetUser", REPLY, i,
                                       b"\x0b\x00\x00\x00\x00\x00\x08user-ok!\x00"),
                        seq=i, flags=1) for i in range(n)]
    return (f"{n} TTHeader calls (3 info headers, {len(calls[0])} B) + {n} replies",
            calls, replies)
