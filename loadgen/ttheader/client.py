"""Sync Thrift RPC client over Kitex TTHeader (default), Apache THeader or framed Thrift,
on a plain socket (gevent-friendly), for the Locust users and the tests.

Arguments and results are encoded by ``thriftpy2`` from ``frametap_demo.thrift``
loaded at run time (``loadgen/ttheader/idl.py``: no compiler, no generated code); the
envelope by :mod:`proxy.protocols.ttheader.codec`. TTHeader requests carry Kitex-style
info headers: INFO_INTKEYVALUE FROM_SERVICE (3), TO_SERVICE (6), TO_METHOD (9), LOG_ID
(2) and a str key ``trace-id``.

Every call gets its own seq id (1, 2, ... per connection, in the message and the header):
the id the proxy correlates on and the client-side frame log's ``correlation_id``
(:class:`loadgen.clientbase.SocketClient`). ``call()`` returns the result; a declared
exception is raised as the IDL's exception class (``client.gen.NotFound``), an exception
reply as thriftpy2's :class:`TApplicationException` (re-exported here);
``last_status`` is the proxy's status name of the answer (``OK``, ``EXCEPTION``,
``UNKNOWN_METHOD``...).
"""

from __future__ import annotations

import itertools
import os

from loadgen import clientbase
from loadgen.ttheader import idl, wire
from loadgen.ttheader.idl import TApplicationException, TMessageType
from proxy.protocols.ttheader import codec
from proxy.protocols.ttheader.constants import (MAX_FRAME_BYTES, PROTO_BINARY, PROTO_COMPACT,
                                               TAPP_TYPES, ZLIB)

__all__ = ["ThriftClient", "TApplicationException", "parse_host", "TRANSPORTS", "PROTOCOLS"]

DEFAULT_PORT = 8888
TRANSPORTS = ("ttheader", "theader", "framed")
PROTOCOLS = ("binary", "compact")
_LOG_IDS = itertools.count(1)


def parse_host(host: str | None) -> tuple[str, int]:
    """Locust's ``--host``: ``ttheader://HOST:PORT``, ``thrift://…``, ``HOST:PORT`` or ``HOST``."""
    return clientbase.parse_host(host, ("ttheader", "thrift"), DEFAULT_PORT,
                                 "no host: pass --host ttheader://HOST:PORT")


def _tapp_status(t) -> str:
    t = t or 0
    return TAPP_TYPES[t] if 0 <= t < len(TAPP_TYPES) else "TYPE_%d" % t


class ThriftClient(clientbase.SocketClient):
    """One connection to a Thrift service (see the module docstring)."""

    what = "ttheader"
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, host: str, port: int, transport: str = "ttheader",
                 protocol: str = "binary", timeout: float = 10.0, zlib: bool = False,
                 service: str = "LegacyUserService", from_service: str = "frametap.locust",
                 to_service: str = "frametap.demo.UserService"):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}: expected binary or compact")
        self.gen = idl.load()
        self.service = getattr(self.gen, service)
        self.transport, self.protocol, self.zlib = transport, protocol, zlib
        self.from_service, self.to_service = from_service, to_service
        self.timeout = timeout
        self._sock = clientbase.connect_tcp(host, port, timeout)
        self._connected(self._sock)
        self._trace = int.from_bytes(os.urandom(8), "big")
        self.seq = 0
        self.method = ""
        self.last_status: str | None = None
        self.last_response_bytes = 0

    # ---- socket ------------------------------------------------------------------

    def split_frame(self, buf):
        return wire.split_frame(buf, self.max_frame_bytes)

    def _recv_frame(self) -> bytes:
        frame = self._read_frame()             # within the socket's timeout
        self.last_response_bytes = len(frame)
        return frame

    # ---- payloads and envelopes --------------------------------------------------

    def encode_call(self, method: str, args, oneway: bool) -> bytes:
        """The Thrift message of one call (``args``: the ``<method>_args`` struct)."""
        buf = idl.memory_buffer()
        proto = idl.protocol(buf, self.protocol == "compact")
        proto.write_message_begin(method, TMessageType.ONEWAY if oneway else TMessageType.CALL,
                                  self.seq)
        args.write(proto)
        proto.write_message_end()
        return buf.getvalue()

    def envelope(self, payload: bytes) -> bytes:
        """``payload`` in this client's framing, with this call's seq id and headers."""
        seq = self.seq
        compact = self.protocol == "compact"
        if self.transport == "ttheader":
            return codec.ttheader(
                payload, seq=seq, flags=0x01, proto=PROTO_COMPACT if compact else PROTO_BINARY,
                strinfo={"trace-id": "%016x" % (self._trace ^ seq)},
                intinfo={3: self.from_service, 6: self.to_service, 9: self.method,
                         2: "%d" % next(_LOG_IDS)})
        if self.transport == "theader":
            return codec.theader(payload, seq=seq, proto=PROTO_COMPACT if compact else 0,
                                 transforms=(ZLIB,) if self.zlib else (),
                                 info={"client": "frametap"})
        return codec.framed(payload)

    def _read_reply(self, method: str, result):
        """Read the reply frame of the call in flight into ``result``; returns the
        TApplicationException of an exception reply, else None."""
        _, _, payload = codec.split(self._recv_frame())
        proto = idl.reader(payload)
        name, mtype, seq = proto.read_message_begin()
        if seq != self.seq or name != method:
            raise codec.FrameError("reply %s (seq id %d) to call %s (seq id %d)" % (
                name, seq, method, self.seq))
        if mtype == TMessageType.EXCEPTION:
            exc = TApplicationException()
            exc.read(proto)
            return exc
        if mtype != TMessageType.REPLY:
            raise codec.FrameError("message type %d in answer to %s" % (mtype, method))
        result.read(proto)
        return None

    # ---- calls -------------------------------------------------------------------

    def call(self, method: str, *args, **kwargs):
        """Call ``method`` with ``args`` (positional in IDL order, or by name; an argument
        left out is not sent); returns its result (None for void and oneway)."""
        self.seq = (self.seq % 0x7FFFFFFF) + 1
        self.method = method
        try:
            args_cls = getattr(self.service, method + "_args")
            result = getattr(self.service, method + "_result")()
        except AttributeError:
            raise ValueError(f"{method!r} is not a method of "
                             f"{self.service.__name__}") from None
        names = [spec[1] for spec in args_cls.thrift_spec.values()]
        if len(args) > len(names):
            raise TypeError(f"{method}() takes {len(names)} arguments, {len(args)} given")
        call_args = args_cls(**dict(zip(names, args)), **kwargs)
        oneway = bool(result.oneway)
        frame = self.envelope(self.encode_call(method, call_args, oneway))
        self.last_status = None
        self.last_response_bytes = 0
        sent = self._sent(str(self.seq), -1, method, "oneway" if oneway else "request")
        try:
            self._send_frame(frame)
            if oneway:
                return None
            tapp = self._read_reply(method, result)
        except Exception:
            self.close()                       # the stream's state is unknown now
            raise
        if tapp is not None:
            self.last_status = sent.status = _tapp_status(tapp.type)
            raise tapp
        self.last_status = sent.status = "OK"
        success = getattr(result, "success", None)
        if success is not None:
            return success
        for fid, spec in result.thrift_spec.items():
            exc = getattr(result, spec[1]) if fid != 0 else None
            if exc is not None:
                self.last_status = sent.status = "EXCEPTION"
                raise exc
        if 0 in result.thrift_spec:            # not void, yet no result: as the proxy,
            raise TApplicationException(       # an empty reply is status OK
                TApplicationException.MISSING_RESULT, f"{method} failed: unknown result")
        return None
