"""Reference servers under hostile input, over real sockets on 127.0.0.1: random and
mutated frames never make them log a traceback or die, a well-behaved client is served
afterwards, peer-triggered logs are rate-limited, and unsent answers are bounded."""

import json
import logging
import random
import socket
import struct
import time

import pytest

from loadgen.flymq.client import FlyMQClient
from loadgen.flymq.server import FlyMQServerThread
from loadgen.rocketmq.server import RocketMQServerThread
from proxy.protocols.flymq.codec import FetchRequest, ProduceRequest, SubscribeRequest


def _blast(port: int, payloads, seed: int) -> None:
    rng = random.Random(seed)
    for data in payloads:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(data)
                if rng.random() < 0.5:
                    sock.shutdown(socket.SHUT_WR)
                sock.settimeout(0.05)
                try:
                    while sock.recv(65536):
                        pass
                except OSError:
                    pass
        except OSError:
            pass


def _mutations(frames, rng, count):
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(frames))
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            if kind < 0.5 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif kind < 0.7:
                del data[rng.randrange(len(data) + 1):]
            else:
                data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        out.append(bytes(data))
    out += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) for _ in range(count // 4)]
    return out


def _no_tracebacks(caplog):
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert "Traceback" not in record.getMessage()


FLYMQ_FRAMES = [
    ProduceRequest("t", b"v", b"k").to_frame(),
    FetchRequest("t", 0, 0, 1_000_000, "v").to_frame(),
    SubscribeRequest("t", "g", 0, "commit").to_frame(),
    bytes([0xAF, 1, 0x03, 1, 0, 0, 0, 6]) + b"\x00\x01t\x00\x00\x00\x02",
    bytes([0xAF, 1, 0x70, 1, 0, 0, 0, 4]) + b"\x00\x00\x00\x00",
    bytes([0xAF, 1, 0x01, 3, 0, 0, 0, 4]) + b"\x1f\x8b\x08\x00",
]


@pytest.mark.slow
def test_flymq_fuzz_never_tracebacks_and_keeps_serving(caplog):
    caplog.set_level(logging.DEBUG)
    rng = random.Random(8)
    with FlyMQServerThread() as srv:
        _blast(srv.port, _mutations(FLYMQ_FRAMES, rng, 400), 8)
        with FlyMQClient("127.0.0.1", srv.port, timeout=5) as client:
            client.create_topic("ok", 1)
            assert client.produce("ok", b"x").offset == 0
            assert client.consume("ok", 0, 0).value == b"x"
    _no_tracebacks(caplog)


def _rocketmq_frame(header: dict, body: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return struct.pack(">iI", 4 + len(h) + len(body), len(h)) + h + body


ROCKETMQ_FRAMES = [
    _rocketmq_frame({"code": 310, "flag": 0, "opaque": 1, "language": "JAVA", "version": 1,
                     "extFields": {"a": "g", "b": "T", "c": "TBW102", "d": "4", "e": "0",
                                   "f": "0", "g": "1", "h": str(2 ** 40)}}, b"hello"),
    _rocketmq_frame({"code": 105, "flag": 2 ** 40, "opaque": 2 ** 40, "language": "JAVA",
                     "extFields": {"topic": "T"}}),
    _rocketmq_frame({"code": 11, "opaque": 3, "extFields": {"topic": "T", "queueId": "0",
                     "queueOffset": "99999999999999999999", "maxMsgNums": "-5",
                     "sysFlag": "7", "consumerGroup": "g"}}),
    struct.pack(">iI", 4 + 13 + 8, 0x01000000 | (13 + 8))
    + struct.pack(">hBhii", 105, 0, 1, 7, 0) + b"\x00\x00\x00\x00\x00\x00\x00\x00",
]


@pytest.mark.slow
def test_rocketmq_fuzz_never_tracebacks_and_keeps_serving(caplog):
    caplog.set_level(logging.DEBUG)
    rng = random.Random(8)
    with RocketMQServerThread() as srv:
        server = srv.server
        frames = _mutations(ROCKETMQ_FRAMES, rng, 300) + ROCKETMQ_FRAMES
        _blast(server.broker_port, frames, 1)
        _blast(server.namesrv_port, frames[:150], 2)
        # well-behaved: GET_ROUTEINFO_BY_TOPIC still answered
        with socket.create_connection(("127.0.0.1", server.namesrv_port), timeout=5) as s:
            s.sendall(_rocketmq_frame({"code": 105, "opaque": 9, "language": "JAVA",
                                       "extFields": {"topic": "T"}}))
            head = b""
            while len(head) < 8:
                head += s.recv(8 - len(head))
            assert struct.unpack(">i", head[:4])[0] > 4
    _no_tracebacks(caplog)


def test_rocketmq_message_flag_wider_than_32_bits_is_a_clean_error(caplog):
    caplog.set_level(logging.DEBUG)
    with RocketMQServerThread() as srv:
        with socket.create_connection(("127.0.0.1", srv.server.broker_port), timeout=5) as s:
            s.sendall(ROCKETMQ_FRAMES[0])
            data = b""
            while len(data) < 8 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
                data += s.recv(65536)
        header = json.loads(data[8:8 + (struct.unpack(">I", data[4:8])[0] & 0xFFFFFF)])
        assert header["code"] == 1 and "does not fit" in header["remark"]
    _no_tracebacks(caplog)


def test_peer_triggered_logs_are_rate_limited(caplog):
    caplog.set_level(logging.DEBUG, logger="frametap.flymq.server")
    with FlyMQServerThread() as srv:
        _blast(srv.port, [b"GET / HTTP/1.0\r\n\r\n"] * 60, 3)
        time.sleep(1.3)  # the timer reports what was suppressed
        suppressed = srv.server.log_lines_suppressed
    closing = [r for r in caplog.records if "closing connection" in r.getMessage()]
    assert suppressed > 0
    assert len(closing) + suppressed == 60
    assert len(closing) <= 2 * srv.server.log_lines_per_second
    assert any("suppressed" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_flymq_client_that_never_reads_does_not_grow_server_memory():
    with FlyMQServerThread() as srv:
        with FlyMQClient("127.0.0.1", srv.port, timeout=5) as client:
            client.create_topic("big", 1)
            for _ in range(40):
                client.produce("big", b"x" * 200_000)
        fetch = FetchRequest("big", 0, 0, 1000).to_frame()
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # pipeline FETCHes (8 MB answers), never read
            try:
                sent += sock.send(fetch * 100)
            except BlockingIOError:
                time.sleep(0.01)
        conn = next(iter(srv.server.connections))
        unsent = srv.call(lambda: conn.unsent_bytes()) if hasattr(srv, "call") else \
            conn.unsent_bytes()
        # bound + one answer (a FETCH answer is at most ~8 MB) + slack
        assert unsent < srv.server.write_high_water + 9 * 1024 * 1024
        assert sent // len(fetch) > 50  # the client did pipeline far more than that
        sock.close()
