"""WebSocket transport for the reference servers and the sync clients (fleximq §6.1:
``ws://host:port/path``), on the ``websockets`` library's Sans-I/O protocol objects.

A fleximq frame travels as one binary message; what arrives is read as the
concatenation of the binary messages' payloads (the proxy reads it the same way,
proxy/websocket.py), so a peer that packs several frames in one message, or splits one
frame across messages, is understood too.  No extension is offered or accepted
(permessage-deflate would hide the frames from the proxy).  Pings are answered by the
protocol object; text messages are ignored.

* :func:`server_streams` turns an accepted ``(reader, writer)`` pair into a pair with the
  same interface the reference servers' read loop uses (``read()`` returns payload
  bytes, ``write(frame)`` sends one binary message), doing the upgrade first.
* :class:`ClientWebSocket` wraps a connected blocking socket for the sync clients
  (gevent can patch it, like the plain-socket clients).
"""

from __future__ import annotations

import logging
import socket

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidURI
from websockets.frames import Opcode
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

# The protocol objects log every connection opened at INFO: a load run opens thousands.
_LOG = logging.getLogger("frametap.websockets")
_LOG.setLevel(logging.WARNING)


class _Payloads:
    """Binary payload bytes out of a protocol object's frame events."""

    def __init__(self):
        self.text = False             # the message being received is a text message

    def collect(self, events, out: bytearray):
        for ev in events:
            op = getattr(ev, "opcode", None)
            if op is Opcode.TEXT:
                self.text = not ev.fin
            elif op is Opcode.BINARY:
                self.text = False
                out += ev.data
            elif op is Opcode.CONT and not self.text:
                out += ev.data
            elif op is Opcode.CONT and ev.fin:
                self.text = False


class ServerReader:
    """The read side of a server WebSocket connection: ``await read(n)`` returns binary
    payload bytes (b"" at the end), after answering the upgrade."""

    def __init__(self, reader, writer: "ServerWriter", path: str):
        self.reader = reader
        self.writer = writer
        self.proto = writer.proto
        self.path = path
        self.payloads = _Payloads()

    async def read(self, n: int) -> bytes:
        proto = self.proto
        out = bytearray()
        while not out:
            data = await self.reader.read(n)
            if not data:
                proto.receive_eof()
                self.writer.flush()
                return b""
            proto.receive_data(data)
            events = proto.events_received()
            if events and isinstance(events[0], Request):
                req = events.pop(0)
                if self.path not in ("/", req.path.split("?")[0]):
                    resp = proto.reject(404, "no WebSocket endpoint at %s\n" % req.path)
                else:
                    resp = proto.accept(req)
                proto.send_response(resp)
                self.writer.flush()
                if resp.status_code != 101:
                    return b""
            self.payloads.collect(events, out)
            self.writer.flush()
            if proto.close_rcvd is not None or proto.handshake_exc is not None:
                if not out:
                    return b""
        return bytes(out)


class ServerWriter:
    """The write side: ``write(frame)`` sends one binary message."""

    def __init__(self, writer, max_size: int):
        self.raw = writer
        self.proto = ServerProtocol(max_size=max_size, logger=_LOG)

    def flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.raw.write(chunk)
            elif self.raw.can_write_eof() and not self.raw.is_closing():
                self.raw.write_eof()

    def write(self, frame: bytes) -> None:
        if self.proto.state.name != "OPEN":
            return
        self.proto.send_binary(frame)
        self.flush()

    @property
    def transport(self):
        return self.raw.transport

    def is_closing(self) -> bool:
        return self.raw.is_closing()

    def close(self) -> None:
        self.raw.close()

    async def wait_closed(self) -> None:
        await self.raw.wait_closed()

    async def drain(self) -> None:
        await self.raw.drain()

    def get_extra_info(self, name, default=None):
        return self.raw.get_extra_info(name, default)


def server_streams(reader, writer, path: str = "/", max_size: int | None = None):
    """(reader, writer) speaking WebSocket on an accepted connection (see the module
    docstring); ``path``: the endpoint (``/`` accepts any)."""
    w = ServerWriter(writer, max_size)
    return ServerReader(reader, w, path), w


class ClientWebSocket:
    """A WebSocket client over a connected blocking socket: :meth:`handshake`, then
    :meth:`send` (one binary message) and :meth:`receive` (payload bytes)."""

    def __init__(self, sock: socket.socket, url: str, max_size: int | None = None):
        try:
            uri = parse_uri(url)
        except InvalidURI as exc:
            raise ValueError(str(exc)) from None
        self.sock = sock
        self.proto = ClientProtocol(uri, max_size=max_size, logger=_LOG)
        self.payloads = _Payloads()
        self.pending = bytearray()

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def handshake(self) -> None:
        """Send the upgrade and read the answer; ConnectionError when refused."""
        self.proto.send_request(self.proto.connect())
        self._flush()
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("WebSocket: the server closed the connection during "
                                      "the upgrade")
            self.proto.receive_data(data)
            events = self.proto.events_received()
            if events and isinstance(events[0], Response):
                if self.proto.handshake_exc is not None:
                    exc = self.proto.handshake_exc
                    raise ConnectionError("WebSocket upgrade refused: %s" % exc) from (
                        exc if isinstance(exc, InvalidHandshake) else None)
                self.payloads.collect(events[1:], self.pending)
                self._flush()
                return

    def take_pending(self) -> bytes:
        """Payload bytes that came with the upgrade's answer."""
        out, self.pending = bytes(self.pending), bytearray()
        return out

    def send(self, data: bytes) -> None:
        self.proto.send_binary(data)
        self._flush()

    def receive(self, data: bytes) -> bytes:
        """Bytes read from the socket -> the binary payload bytes they complete (b"" when
        none); pongs and close answers are sent here."""
        out, self.pending = self.pending, bytearray()
        self.proto.receive_data(data)
        self.payloads.collect(self.proto.events_received(), out)
        self._flush()
        return bytes(out)

    def close(self) -> None:
        try:
            if self.proto.state.name == "OPEN":
                self.proto.send_close(1000)
                self._flush()
        except OSError:
            pass
