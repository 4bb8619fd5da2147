"""Test helpers: an in-process proxy, a fault-injecting FlyMQ upstream, raw clients.
(Processes, Locust and Prometheus: tests/_support/.)

The upstream answers each FlyMQ request frame with a response of the same opcode,
and can be told to stall (stop reading), reset mid-frame or close after N bytes,
like asyncpg's _testbase fuzzer: real sockets on 127.0.0.1, faults on demand.
"""

import asyncio
import socket
import struct

import uvloop

from proxy.app import ProxyApp
from proxy.config import config_from_dict
from tests._support import loopcheck


def run(coro, timeout=60):
    """Run ``coro`` on a fresh uvloop loop (the proxy's loop in production). Errors the
    loop reports to its exception handler fail the test (tests/_support/loopcheck.py)."""
    async def guarded():
        loopcheck.install(asyncio.get_running_loop())
        return await asyncio.wait_for(coro, timeout)
    return uvloop.run(guarded())


def frame(op, payload=b"", version=1, flags=1, magic=0xAF):
    return bytes([magic, version, op, flags]) + struct.pack(">I", len(payload)) + payload


def request(i=0, size=16):
    return frame(0x01, struct.pack(">I", i) + b"x" * max(0, size - 4))


async def read_frame(reader):
    head = await reader.readexactly(8)
    n = struct.unpack(">I", head[4:])[0]
    return head[2], await reader.readexactly(n)


class FaultyUpstream:
    """A FlyMQ-ish upstream: echoes each request's first 4 payload bytes in a response.

    Attributes set by tests: ``stall`` (stop reading), ``reset_after`` (RST once this
    many bytes were received), ``response_size`` (payload bytes per response),
    ``flood`` (bytes to send unprompted on connect, for backpressure tests).
    """

    def __init__(self):
        self.stall = False
        self.reset_after = None
        self.response_size = 8
        self.flood = 0
        self.received = bytearray()
        self.eof_seen = asyncio.Event()
        self.connections = 0
        self.writers = []
        self.server = None
        self.got_bytes = asyncio.Event()

    async def start(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    @property
    def address(self):
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader, writer):
        self.connections += 1
        self.writers.append(writer)
        try:
            if self.flood:
                chunk = frame(0x01, b"f" * 65528)
                sent = 0
                while sent < self.flood:
                    writer.write(chunk)
                    sent += len(chunk)
                    await writer.drain()      # blocks once the proxy stops reading
                return
            buf = bytearray()
            while True:
                if self.stall:
                    await asyncio.sleep(3600)
                data = await reader.read(65536)
                if not data:
                    self.eof_seen.set()
                    # answer what is complete, then close our side too (unless a reset
                    # closed the transport already: write_eof() would raise)
                    if not writer.is_closing():
                        writer.write_eof()
                    return
                self.received += data
                self.got_bytes.set()
                if self.reset_after is not None and len(self.received) >= self.reset_after:
                    # half a response frame, then a reset
                    writer.write(frame(0x01, b"r" * 100)[:20])
                    await writer.drain()
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                buf += data
                while len(buf) >= 8:
                    n = struct.unpack(">I", buf[4:8])[0]
                    if len(buf) < 8 + n:
                        break
                    op, tag = buf[2], bytes(buf[8:12])
                    del buf[:8 + n]
                    writer.write(frame(op, tag + b"r" * max(0, self.response_size - 4)))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def close(self):
        self.server.close()
        for w in self.writers:
            w.transport.abort()


async def start_proxy(upstream, admin=False, **route):
    """An in-process ProxyApp with one FlyMQ route listening on a free port."""
    table = {"name": "t", "protocol": "flymq", "listen": "127.0.0.1:0", "upstream": upstream}
    table.update(route)
    data = {"routes": [table], "proxy": {"shutdown_timeout": 2.0}}
    if admin:
        data["admin"] = {"listen": "127.0.0.1:0"}
    app = ProxyApp(config_from_dict(data))
    await app.start()
    return app


def proxy_port(app, i=0):
    return app.routes[i].address[1]


def sample(app, name, **labels):
    """Read one sample from a private registry holding the app's collector."""
    from prometheus_client.registry import CollectorRegistry

    from proxy.metrics import FrametapCollector
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FrametapCollector(lambda: app.routes, lambda: getattr(app, "framelog", None)))
    return reg.get_sample_value(name, labels)


async def wait_for(predicate, timeout=5.0, what="condition"):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
