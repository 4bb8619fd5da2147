"""Sample fleximq traffic for the parser benchmark (bench/parser_bench.py)."""

from proxy.protocols.fleximq import codec

TARGET_FPS = 2_000_000       # compiled parser, frames/s (requests and responses both count)
TARGET_RATIO = 20.0          # compiled / pure-Python


def bench_frames(n, size):
    """(description, requests, responses): ``n`` REQs with a ~100-byte header (one
    routing entry with a path, reqrep with a ULID) and ``size``-byte payloads, and their
    REPs.  The payload is at least 256 bytes, the size the fleximq issue benchmarks."""
    size = max(size, 256)
    ids = [codec.ulid(1703123456789 + i) for i in range(n)]
    body = b"\xc5" + (size - 3).to_bytes(2, "big") + b"x" * (size - 3)   # bin16: size bytes
    reqs = [codec.encode(codec.REQ, 1000, {"routing": [{"client_id": 1001,
                                                        "path": "/api/users/get"}],
                                           "reqrep": {"type": "request", "id": rid}},
                         raw_payload=body) for rid in ids]
    reps = [codec.rep(1001, 1000, rid, status=200, path="/api/users/get") for rid in ids]
    hl = int.from_bytes(reqs[0][22:26], "big")
    return (f"{n} REQ ({hl} B MessagePack header, {size} B payload) + {n} REP", reqs, reps)
