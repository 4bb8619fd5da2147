"""The reference-server base (loadgen/serverbase.py) with a toy protocol, over real sockets.

Toy protocol: a frame is ``u32 length | payload`` (length <= 1024); the server answers each
frame with the same frame. Garbage = a length over the limit.
"""

import logging
import socket
import struct
import time

import pytest

from loadgen.serverthread import ServerThread
from loadgen.serverbase import ReferenceServer, ServerConnection
from proxy.errors import FrameError

LIMIT = 1024


class ToyError(FrameError, ValueError):
    pass


class EchoConnection(ServerConnection):
    def split_frame(self, buf):
        if len(buf) < 4:
            return None
        (length,) = struct.unpack_from(">I", buf)
        if length > LIMIT:
            raise ToyError(f"toy: length {length} exceeds the limit {LIMIT}")
        if len(buf) < 4 + length:
            return None
        return bytes(buf[:4 + length]), 4 + length

    def frame_received(self, frame, received):
        self.send(frame, self.reply_due(received))

    def connection_lost(self):
        self.server.lost.append(self.peer)


class EchoServer(ReferenceServer):
    what = "toy server"
    log = logging.getLogger("frametap.test.toy")
    connection_class = EchoConnection

    def __init__(self, ordered=True, service_time=None):
        super().__init__(service_time)
        self.ordered_replies = ordered
        self.host, self.port = "127.0.0.1", 0
        self.lost = []

    async def start(self):
        self.port = await self.listen(self.host, self.port)


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def read_frames(sock, n, timeout=5.0):
    sock.settimeout(timeout)
    buf, out = b"", []
    while len(out) < n:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(out)} of {n} frames"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
            size = 4 + struct.unpack_from(">I", buf)[0]
            out.append(buf[4:size])
            buf = buf[size:]
    return out


def closed_by_peer(sock):
    sock.settimeout(5)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def test_frames_split_across_reads_and_packed_in_one_are_all_answered():
    with ServerThread(EchoServer()) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            data = b"".join(frame(b"m%d" % i) for i in range(50))
            for i in range(0, len(data), 7):  # odd split points
                s.sendall(data[i:i + 7])
                time.sleep(0.0005)
            assert read_frames(s, 50) == [b"m%d" % i for i in range(50)]
        assert srv.call(lambda: srv.server.connections_total) == 1
        assert srv.call(lambda: srv.server.frames_received) == 50


def test_oversized_frame_closes_that_connection_with_one_log_line(caplog):
    caplog.set_level(logging.DEBUG, logger="frametap.test.toy")
    with ServerThread(EchoServer()) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as good, \
                socket.create_connection(("127.0.0.1", srv.port)) as bad:
            bad.sendall(struct.pack(">I", LIMIT + 1))  # the header alone is refused
            assert closed_by_peer(bad)
            good.sendall(frame(b"still here"))
            assert read_frames(good, 1) == [b"still here"]
    lines = [r for r in caplog.records if r.name == "frametap.test.toy"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "closing connection from 127.0.0.1:" in lines[0].getMessage()
    assert "exceeds the limit 1024" in lines[0].getMessage()
    assert lines[0].exc_info is None  # no traceback for bad input


def test_eof_mid_frame_and_reset_are_quiet(caplog):
    caplog.set_level(logging.DEBUG, logger="frametap.test.toy")
    with ServerThread(EchoServer()) as srv:
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(struct.pack(">I", 10) + b"abc")  # half a frame, then EOF
        s.close()
        r = socket.create_connection(("127.0.0.1", srv.port))
        r.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        r.sendall(frame(b"x"))
        r.close()  # RST
        deadline = time.time() + 5
        while srv.call(lambda: len(srv.server.lost)) < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert srv.call(lambda: len(srv.server.lost)) == 2
        assert srv.call(lambda: len(srv.server.connections)) == 0
    assert not [r for r in caplog.records
                if r.name == "frametap.test.toy" and r.levelno >= logging.WARNING]


def test_service_time_holds_replies_and_eof_lets_them_leave():
    with ServerThread(EchoServer(service_time="80ms")) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            started = time.perf_counter()
            s.sendall(frame(b"a") + frame(b"b"))
            s.shutdown(socket.SHUT_WR)  # EOF right away: the held replies still come
            assert read_frames(s, 2) == [b"a", b"b"]
            assert time.perf_counter() - started >= 0.075
            assert closed_by_peer(s)


def test_ordered_replies_keep_request_order_under_random_service_time():
    with ServerThread(EchoServer(service_time="exp:5ms")) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            for i in range(40):
                s.sendall(frame(b"%d" % i))
            assert read_frames(s, 40) == [b"%d" % i for i in range(40)]


def test_unordered_replies_leave_at_their_own_time():
    server = EchoServer(ordered=False, service_time="1ms")
    with ServerThread(server) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            conn = None
            deadline = time.time() + 5
            while conn is None and time.time() < deadline:
                conn = srv.call(lambda: next(iter(server.connections), None))

            def send_two():  # a slow answer first, a fast one second: the fast one wins
                now = conn._loop.time()
                conn.send(frame(b"slow"), now + 0.2)
                conn.send(frame(b"fast"), now + 0.01)
            srv.call(send_two)
            assert read_frames(s, 2) == [b"fast", b"slow"]


def test_close_drops_connections_and_stops_listening():
    thread = ServerThread(EchoServer(service_time="10s")).start()
    port = thread.port
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(frame(b"never answered"))
    time.sleep(0.05)
    started = time.monotonic()
    thread.stop()
    assert time.monotonic() - started < 3  # held replies do not hold up the stop
    assert closed_by_peer(s)
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
