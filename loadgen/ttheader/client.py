"""Sync Thrift RPC client over Kitex TTHeader (default), Apache THeader or framed Thrift,
on a plain socket (gevent-friendly), for the Locust users and the tests.

Arguments and results are encoded by Apache's ``thrift`` library (the code generated from
``frametap_demo.thrift``); the envelope by :mod:`proxy.protocols.ttheader.codec`. TTHeader
requests carry Kitex-style info headers: INFO_INTKEYVALUE FROM_SERVICE (3), TO_SERVICE
(6), TO_METHOD (9), LOG_ID (2) and a str key ``trace-id``.

Every call gets its own seq id (1, 2, ... per connection, in the message and the header):
the id the proxy correlates on and the client-side frame log's ``correlation_id``
(:class:`loadgen.common.SocketClient`). ``call()`` returns the result; a declared
exception is raised as the IDL's exception class, a TApplicationException as itself;
``last_status`` is the proxy's status name of the answer (``OK``, ``EXCEPTION``,
``UNKNOWN_METHOD``...).
"""

from __future__ import annotations

import itertools
import os

from loadgen import common
from loadgen.ttheader import idl
from proxy.protocols.ttheader import codec
from proxy.protocols.ttheader.names import PROTO_BINARY, PROTO_COMPACT, TAPP_TYPES, ZLIB

__all__ = ["ThriftClient", "parse_host", "TRANSPORTS", "PROTOCOLS"]

DEFAULT_PORT = 8888
TRANSPORTS = ("ttheader", "theader", "framed")
PROTOCOLS = ("binary", "compact")
_LOG_IDS = itertools.count(1)


def parse_host(host: str | None) -> tuple[str, int]:
    """Locust's ``--host``: ``ttheader://HOST:PORT``, ``thrift://…``, ``HOST:PORT`` or ``HOST``."""
    return common.parse_host(host, ("ttheader", "thrift"), DEFAULT_PORT,
                             "no host: pass --host ttheader://HOST:PORT")


class _Envelope:
    """A Thrift transport (duck-typed TTransportBase) that sends each flushed message in
    one TTHeader / THeader / framed frame and reads replies frame by frame."""

    def __init__(self, client: "ThriftClient"):
        self.c = client
        self.wbuf = bytearray()
        self.rbuf = memoryview(b"")

    def isOpen(self):
        return not self.c.closed

    def write(self, data):
        self.wbuf += data

    def flush(self):
        c = self.c
        payload, self.wbuf = bytes(self.wbuf), bytearray()
        seq = c.seq
        if c.transport == "ttheader":
            frame = codec.ttheader(
                payload, seq=seq, flags=0x01,
                proto=PROTO_COMPACT if c.protocol == "compact" else PROTO_BINARY,
                strinfo={"trace-id": "%016x" % (c._trace ^ seq)},
                intinfo={3: c.from_service, 6: c.to_service, 9: c.method,
                         2: "%d" % next(_LOG_IDS)})
        elif c.transport == "theader":
            frame = codec.theader(payload, seq=seq,
                                  proto=PROTO_COMPACT if c.protocol == "compact" else 0,
                                  transforms=(ZLIB,) if c.zlib else (),
                                  info={"client": "frametap"})
        else:
            frame = codec.framed(payload)
        c._send(frame)

    def read(self, n):
        if not self.rbuf:
            _, _, payload = codec.split(self.c._recv_frame())
            self.rbuf = memoryview(payload)
        out = bytes(self.rbuf[:n])
        self.rbuf = self.rbuf[n:]
        return out

    def readAll(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.read(n - len(buf))
            if not chunk:
                raise EOFError("short Thrift payload")
            buf += chunk
        return buf


class ThriftClient(common.SocketClient):
    """One connection to a Thrift service (see the module docstring)."""

    def __init__(self, host: str, port: int, transport: str = "ttheader",
                 protocol: str = "binary", timeout: float = 10.0, zlib: bool = False,
                 service: str = "LegacyUserService", from_service: str = "frametap.locust",
                 to_service: str = "frametap.demo.UserService"):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}: expected binary or compact")
        from thrift.protocol import TBinaryProtocol, TCompactProtocol
        self.gen = idl.load()
        self.transport, self.protocol, self.zlib = transport, protocol, zlib
        self.from_service, self.to_service = from_service, to_service
        self.timeout = timeout
        self._sock = common.connect_tcp(host, port, timeout)
        self._connected(self._sock)
        self._trace = int.from_bytes(os.urandom(8), "big")
        self.seq = 0
        self.method = ""
        self.last_status: str | None = None
        self.last_response_bytes = 0
        self._env = _Envelope(self)
        proto = (TCompactProtocol.TCompactProtocol if protocol == "compact"
                 else TBinaryProtocol.TBinaryProtocol)(self._env)
        self._client = getattr(self.gen, service).Client(proto)
        self._oneway = {"log"}

    # ---- socket ------------------------------------------------------------------

    def _send(self, frame: bytes) -> None:
        if self._sock is None:
            raise ConnectionError("connection closed")
        try:
            self._sock.sendall(frame)
        except OSError:
            self.close()
            raise

    def _recv_frame(self) -> bytes:
        if self._sock is None:
            raise ConnectionError("connection closed")
        try:
            frame = codec.read_frame(self._sock)
        except (OSError, codec.FrameError):
            self.close()
            raise
        if frame is None:
            self.close()
            raise ConnectionError("server closed the connection")
        self.last_response_bytes = len(frame)
        return frame

    # ---- calls -------------------------------------------------------------------

    def call(self, method: str, *args):
        """Call ``method`` with ``args``; returns its result (None for void and oneway)."""
        from thrift.Thrift import TApplicationException
        self.seq = (self.seq % 0x7FFFFFFF) + 1
        self.method = method
        self._client._seqid = self.seq
        oneway = method in self._oneway
        sent = self._sent(str(self.seq), -1, method, "oneway" if oneway else "request")
        self.last_status = None
        self.last_response_bytes = 0
        self._env.rbuf = memoryview(b"")
        try:
            result = getattr(self._client, method)(*args)
        except TApplicationException as exc:
            if exc.type == TApplicationException.UNKNOWN and exc.message and \
                    "failed: unknown result" in exc.message:
                self.last_status = "OK"        # a reply without its result field
            else:
                t = exc.type
                self.last_status = TAPP_TYPES[t] if 0 <= t < len(TAPP_TYPES) else "TYPE_%d" % t
            sent.status = self.last_status
            raise
        except self.gen.ttypes.NotFound:
            self.last_status = sent.status = "EXCEPTION"
            raise
        except Exception:
            self.close()                       # the stream's state is unknown now
            raise
        if not oneway:
            self.last_status = sent.status = "OK"
        return result
