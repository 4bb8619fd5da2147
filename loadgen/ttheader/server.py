"""Reference Thrift service (asyncio, uvloop) speaking Kitex TTHeader, Apache THeader and
framed Thrift: ``frametap serve ttheader``.

No Kitex server is installable here (docs/design.md, "Reference servers in general"), so
this server stands in for one. It serves ``frametap_demo.thrift`` (in this folder: a
user/order service with structs, lists, maps, a declared exception ``NotFound`` and a
oneway ``log``):

* Payloads are decoded and encoded by ``thriftpy2`` from the IDL loaded at run time
  (``loadgen/ttheader/idl.py``: no compiler, no generated code), binary or compact
  protocol as the request uses — never by hand; a payload first passes the shape check
  of :mod:`loadgen.ttheader.wire` (lengths and counts within its bytes: a malformed one
  closes its connection with one log line). :class:`Dispatcher` plays the part of a
  generated processor: an unknown method gets a TApplicationException UNKNOWN_METHOD; a
  call missing an argument (every argument of this service is needed) PROTOCOL_ERROR
  naming it; a handler failure INTERNAL_ERROR. Such a bad call is answered, never a
  traceback: at most one rate-limited log line. Oneway messages are never answered.
* The envelope is written by :mod:`proxy.protocols.ttheader.codec`, answering in the
  request's dialect: a Kitex TTHeader request gets a TTHeader reply (same seq id and
  flags, protocol id as requested, Kitex-style info headers: INFO_INTKEYVALUE
  FROM_SERVICE / TO_METHOD and the request's LOG_ID, and the str key ``biz-status``),
  TTHeaderFramed when the request was; an Apache THeader request a THeader reply
  (same transforms, zlib included); a framed request a framed reply.
* zlib payloads are inflated into at most the frame limit (``max_frame_bytes``, 64 MiB
  by default) per transform: a small frame claiming more (a zip bomb) is refused with a
  log line and its connection closed, before it can grow the server's memory.
* Choices the document leaves open (none of it is public Kitex server code): unframed
  Thrift is not served (one log line, the connection closed); a frame whose envelope
  or payload cannot be read is logged and closes that connection only; replies carry
  a correlation id (the seq id), so each leaves at its own service time
  (``ordered_replies = False``, as Kitex's out-of-order mode allows).
* ``--transport``: restrict the dialects accepted (``any`` by default).
* ``--service-time DIST`` for every method, ``--method-time METHOD=DIST`` per method;
  ``--error-rate P``: that fraction of ``getUser``/``placeOrder`` calls raise the declared
  ``NotFound`` (besides unknown user ids, which always do).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys

from loadgen.servecli import address_arg, serve_main, service_time_arg
from loadgen.serverthread import ServerThread
from loadgen.serverbase import ReferenceServer, ServerConnection, describe_exception
from loadgen.servicetime import ServiceTime, as_service_time
from loadgen.ttheader import idl, wire
from loadgen.ttheader.idl import TApplicationException, TMessageType, TType
from proxy.protocols.ttheader import codec
from proxy.protocols.ttheader.constants import MAX_FRAME_BYTES, PROTO_COMPACT, TAPP_TYPES

__all__ = ["ThriftServer", "ThriftServerThread", "DemoHandler", "Dispatcher", "main"]

log = logging.getLogger("frametap.ttheader.server")
TRANSPORTS = ("any", "ttheader", "theader", "framed")
USERS = 10_000                 # user ids 1..USERS exist
SERVICE_NAME = "frametap.demo.UserService"


class DemoHandler:
    """The service's behaviour: a deterministic in-memory user directory."""

    def __init__(self, gen, error_rate: float = 0.0, rng: random.Random | None = None):
        self.t = gen
        self.error_rate = error_rate
        self.rng = rng or random.Random()
        self.logged = 0
        self.next_order = 1

    def _fail(self) -> bool:
        return self.error_rate > 0 and self.rng.random() < self.error_rate

    def echo(self, message):
        return message

    def getUser(self, id):
        if not 1 <= id <= USERS or self._fail():
            raise self.t.NotFound(message="no user %d" % id, id=id)
        return self.t.User(id=id, name="user-%05d" % id, tags=["tier-%d" % (id % 3), "demo"],
                           attrs={"region": ("eu", "us", "ap")[id % 3], "plan": "basic"})

    def listUsers(self, limit, filter):
        limit = max(0, min(limit, 100))
        return [self.getUser(i) for i in range(1, limit + 1)]

    def placeOrder(self, userId, items):
        if not 1 <= userId <= USERS or self._fail():
            raise self.t.NotFound(message="no user %d" % userId, id=userId)
        order = self.t.Order(id=self.next_order, user_id=userId, items=list(items),
                             total=round(sum(items) * 0.01 + 4.99, 2))
        self.next_order += 1
        return order

    def ping(self):
        pass

    def log(self, line):
        self.logged += 1


class BadCall(Exception):
    """A call answered with the TApplicationException ``.tapp`` instead of a result."""

    def __init__(self, tapp: TApplicationException, detail: str | None = None):
        super().__init__(tapp.message)
        tapp.__traceback__ = None       # a handler's exception is written, not kept
        self.tapp = tapp
        self.detail = detail or tapp.message    # for the log line


class Dispatcher:
    """What a generated processor does, over thriftpy2's service classes: read one call
    message, run the handler, write the reply message (or none for a oneway message).

    ``process(payload)`` returns ``(reply payload or None, method, seq id, problem)``;
    ``problem`` is a one-line text when the call was answered with a
    TApplicationException (unknown method, missing argument, handler failure), else None.
    A payload that is not a readable call message raises (the connection is closed).
    """

    def __init__(self, service, handler):
        self.service = service
        self.handler = handler
        self.methods = frozenset(service.thrift_services)

    def process(self, payload: bytes):
        compact = idl.is_compact(payload)
        iprot = idl.reader(payload)
        name, mtype, seq = iprot.read_message_begin()
        oneway = mtype == TMessageType.ONEWAY
        problem = None
        try:
            if mtype not in (TMessageType.CALL, TMessageType.ONEWAY):
                iprot.skip(TType.STRUCT)
                raise BadCall(TApplicationException(
                    TApplicationException.INVALID_MESSAGE_TYPE,
                    "%s: message type %d is not a call" % (name, mtype)))
            if name not in self.methods:
                iprot.skip(TType.STRUCT)
                raise BadCall(TApplicationException(TApplicationException.UNKNOWN_METHOD,
                                                    "Unknown function %s" % name))
            args = getattr(self.service, name + "_args")()
            args.read(iprot)
            result = getattr(self.service, name + "_result")()
            oneway = oneway or result.oneway
            values = []
            for fid, spec in args.thrift_spec.items():
                value = getattr(args, spec[1])
                if value is None:
                    raise BadCall(TApplicationException(
                        TApplicationException.PROTOCOL_ERROR,
                        "%s: argument %d (%s) is missing" % (name, fid, spec[1])))
                values.append(value)
            try:
                result.success = getattr(self.handler, name)(*values)
            except TApplicationException as exc:
                raise BadCall(exc) from None
            except Exception as exc:  # noqa: BLE001 - declared, or answered INTERNAL_ERROR
                if not self._declared(exc, result):
                    raise BadCall(TApplicationException(
                        TApplicationException.INTERNAL_ERROR,
                        "%s failed: %s: %s" % (name, type(exc).__name__, exc)),
                        describe_exception(exc)) from None
            mtype_out, body = TMessageType.REPLY, result
        except BadCall as bad:
            t = bad.tapp.type or 0
            problem = "%s (seq id %d): %s %s" % (
                name, seq, TAPP_TYPES[t] if 0 <= t < len(TAPP_TYPES) else "TYPE_%d" % t,
                bad.detail)
            mtype_out, body = TMessageType.EXCEPTION, bad.tapp
        if oneway:
            return None, name, seq, problem
        out = idl.memory_buffer()
        oprot = idl.protocol(out, compact)
        oprot.write_message_begin(name, mtype_out, seq)
        body.write(oprot)
        oprot.write_message_end()
        return out.getvalue(), name, seq, problem

    @staticmethod
    def _declared(exc: Exception, result) -> bool:
        """Put ``exc`` in ``result``'s field when the IDL declares it (``throws``)."""
        for fid, spec in result.thrift_spec.items():
            if fid != 0 and isinstance(exc, spec[2]):
                setattr(result, spec[1], exc)
                return True
        return False


class _ThriftConnection(ServerConnection):
    """One client: length-prefixed frames (TTHeader, THeader or framed Thrift)."""

    def split_frame(self, buf):
        return wire.split_frame(buf, self.server.max_frame_bytes)

    def frame_received(self, frame, received: float) -> None:
        try:
            reply, method = self.server.handle_frame(frame)
        except Exception as exc:  # noqa: BLE001 - a peer's bytes: one log line, never a traceback
            why = str(exc) if isinstance(exc, codec.FrameError) else \
                f"unreadable Thrift message: {type(exc).__name__}: {exc}"   # text: no cycle
            self.server.log_peer(logging.WARNING, "%s: closing connection from %s: %s",
                                 self.name, self.peer, why)
            self.abort()
            return
        if reply is not None:
            self.send(reply, self.server.reply_due(method, received))


class ThriftServer(ReferenceServer):
    """The reference Thrift service on one listening socket (see the module docstring)."""

    what = "ttheader server"
    log = log
    connection_class = _ThriftConnection
    ordered_replies = False          # replies carry the seq id: each leaves when due

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 service_time: ServiceTime | str | None = None, method_times=None,
                 error_rate: float = 0.0, transport: str = "any",
                 max_frame_bytes: int = MAX_FRAME_BYTES, seed: int | None = None):
        super().__init__(service_time)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error rate {error_rate}: expected 0..1")
        self.host, self.port = host, port
        self.transport = transport
        self.max_frame_bytes = max_frame_bytes
        self.method_times = {m: as_service_time(t) for m, t in (method_times or {}).items()}
        self.gen = idl.load()
        self.handler = DemoHandler(self.gen, error_rate, random.Random(seed))
        self.dispatcher = Dispatcher(self.gen.UserService, self.handler)
        self.calls = 0
        self.bad_calls = 0             # answered with a TApplicationException

    async def start(self) -> None:
        self.port = await self.listen(self.host, self.port)
        log.info("ttheader server listening on %s:%d", self.host, self.port)

    def reply_due(self, method: str, received: float):
        dist = self.method_times.get(method, self.service_time)
        return None if dist is None else received + dist.sample()

    def handle_frame(self, frame: bytes):
        """One request frame -> (reply frame or None for oneway, method name)."""
        transport, fields, payload = codec.split(frame, self.max_frame_bytes)
        if self.transport != "any" and transport != self.transport:
            raise codec.FrameError(f"{transport} frame, but this server serves "
                                   f"{self.transport} only")
        compact = idl.is_compact(payload)
        out, method, _, problem = self.dispatcher.process(payload)
        self.calls += 1
        if problem is not None:
            self.bad_calls += 1
            self.log_peer(logging.INFO, "%s: answered a bad call: %s", self.what, problem)
        if not out:
            return None, method                      # oneway: no reply
        if transport == "ttheader":
            intinfo = {3: SERVICE_NAME, 9: method}
            log_id = fields["intinfo"].get(2)
            if log_id is not None:
                intinfo[2] = log_id
            reply = codec.ttheader(out, seq=fields["seq"], flags=fields["flags"],
                                   proto=fields["proto"], strinfo={"biz-status": "0"},
                                   intinfo=intinfo, inner_framed=fields.get("inner_framed",
                                                                            False))
        elif transport == "theader":
            reply = codec.theader(out, seq=fields["seq"], flags=fields["flags"],
                                  proto=PROTO_COMPACT if compact else fields["proto"],
                                  transforms=fields["transforms"])
        else:
            reply = codec.framed(out)
        return reply, method


class ThriftServerThread(ServerThread):
    """Run a :class:`ThriftServer` on its own event loop in a background thread."""

    thread_name = "ttheader-server"
    what = "ttheader server"
    cancel_pending_tasks = False

    def __init__(self, **server_kwargs):
        super().__init__(ThriftServer(**server_kwargs))


# ---------------------------------------------------------------------- command line

def _listen_arg(text: str) -> tuple[str, int]:
    return address_arg(text, 8888)


def _method_time_arg(text: str) -> tuple[str, ServiceTime]:
    name, sep, dist = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected METHOD=DIST, e.g. getUser=2ms")
    return name.strip(), service_time_arg(dist)


def _rate_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a fraction 0..1, e.g. 0.01")
    return value


def build_parser(prog: str = "frametap serve ttheader") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the reference Thrift service (Kitex TTHeader, Apache THeader, "
                    "framed) until SIGINT/SIGTERM.")
    parser.add_argument("--listen", type=_listen_arg, default=("127.0.0.1", 8888),
                        metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8888)")
    parser.add_argument("--transport", choices=TRANSPORTS, default="any",
                        help="dialects accepted (default any: TTHeader, THeader and framed)")
    parser.add_argument("--service-time", type=service_time_arg, default=None, metavar="DIST",
                        help="delay each reply: '0', '500us', '2ms±1ms', '2ms+-1ms', 'exp:2ms'")
    parser.add_argument("--method-time", type=_method_time_arg, action="append", default=[],
                        metavar="METHOD=DIST", help="service time of one method (repeatable)")
    parser.add_argument("--error-rate", type=_rate_arg, default=0.0, metavar="P",
                        help="fraction of getUser/placeOrder calls answered with the declared "
                             "NotFound exception (default 0)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _make_server(args: argparse.Namespace):
    host, port = args.listen
    server = ThriftServer(host, port, service_time=args.service_time,
                          method_times=dict(args.method_time), error_rate=args.error_rate,
                          transport=args.transport)
    return server, f"{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    """``frametap serve ttheader`` entry point; returns the exit status."""
    return serve_main(build_parser(), argv, _make_server,
                      lambda server: f"ttheader: listening on {server.host}:{server.port}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
