"""Admin HTTP on the event loop: GET /metrics, /healthz, /readyz.

Served by the proxy's own loop so a scrape reads the counters between two
callbacks, never in the middle of one.  Requests are tiny GETs; anything else
gets 404/405, oversized or slow requests are cut off.
"""

import asyncio
import logging

from proxy.acceptor import Acceptor, listen_sockets

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("frametap.admin")

MAX_REQUEST = 16384
READ_TIMEOUT = 10.0


class AdminServer:
    """``reserve`` (proxy.acceptor.FdReserve): descriptors the routes leave alone, spent
    here when an accept hits the fd limit so that /metrics still answers there."""

    def __init__(self, registry, is_ready, host="127.0.0.1", port=9400, reserve=None):
        self.registry = registry
        self.is_ready = is_ready       # callable -> bool
        self.host, self.port = host, port
        self.reserve = reserve
        self.acceptors = []
        self.loop = None

    @property
    def address(self):
        return self.acceptors[0].sock.getsockname()[:2]

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self.acceptors = [Acceptor(self.loop, sock, self._accepted, reserve=self.reserve,
                                   name="admin")
                          for sock in listen_sockets(self.host, self.port)]

    def close(self):
        for acceptor in self.acceptors:
            acceptor.close()

    def _accepted(self, sock):
        self.loop.create_task(self._serve(sock))

    async def _serve(self, sock):
        reader = asyncio.StreamReader(limit=MAX_REQUEST * 2)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await self.loop.connect_accepted_socket(lambda: protocol, sock)
        except (OSError, RuntimeError):
            sock.close()
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, self.loop)
        try:
            await self._handle(reader, writer)
            await writer.wait_closed()
        except (OSError, ConnectionError):
            pass
        finally:
            if self.reserve is not None:
                self.reserve.fill()    # what a scrape at the limit spent comes back

    async def _handle(self, reader, writer):
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
                except (asyncio.IncompleteReadError, asyncio.TimeoutError,
                        asyncio.LimitOverrunError, ConnectionError):
                    return
                if len(head) > MAX_REQUEST:
                    await self._send(writer, 431, b"request header too large\n", close=True)
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split()
                if len(parts) != 3:
                    await self._send(writer, 400, b"bad request line\n", close=True)
                    return
                method, target, version = parts
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                close = (version == "HTTP/1.0" or headers.get("connection", "").lower() == "close")
                path = target.split("?", 1)[0]
                if method not in ("GET", "HEAD"):
                    await self._send(writer, 405, b"only GET\n", close=True)
                    return
                if path == "/metrics":
                    body = generate_latest(self.registry)
                    await self._send(writer, 200, body, CONTENT_TYPE_LATEST, close,
                                     head_only=method == "HEAD")
                elif path == "/healthz":
                    await self._send(writer, 200, b"ok\n", close=close)
                elif path == "/readyz":
                    ready = self.is_ready()
                    await self._send(writer, 200 if ready else 503,
                                     b"ready\n" if ready else b"not ready\n", close=close)
                else:
                    await self._send(writer, 404, b"not found: try /metrics, /healthz, /readyz\n",
                                     close=close)
                if close:
                    return
        except Exception:  # never let one scrape take the proxy down
            log.exception("admin request failed")
        finally:
            writer.close()

    async def _send(self, writer, status, body, ctype="text/plain; charset=utf-8", close=False,
                    head_only=False):
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  431: "Request Header Fields Too Large", 503: "Service Unavailable"}[status]
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n"
                f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n").encode()
        writer.write(head if head_only else head + body)
        await writer.drain()
