"""Apache Thrift's own Python library as a real peer: the demo IDL compiled by Debian's
``thrift`` compiler, an Apache THeader server (THeaderProtocol accepting THeader,
framed and unframed clients) and clients in every dialect the parser reads."""

import os
import socket
import threading
import time

import pytest

from loadgen.ttheader import idl

MODES = ("header-binary", "header-compact", "header-zlib", "framed-binary",
         "framed-compact", "unframed-binary")


def thrift_or_skip():
    """The generated ``frametap_demo`` package; fails in CI when the compiler or the
    ``thrift`` library is missing, skips (saying why) elsewhere."""
    try:
        import thrift  # noqa: F401
        return idl.load()
    except (ImportError, idl.IDLError) as e:
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(f"Apache Thrift must be available in CI: {e}")
        pytest.skip(f"Apache Thrift not available: {e}")


class Handler:
    """The service's behaviour for the tests: getUser(id < 0) raises the declared
    NotFound; placeOrder with no items fails unexpectedly (INTERNAL_ERROR)."""

    def __init__(self, gen):
        self.t = gen.ttypes
        self.logged = []

    def echo(self, message):
        return message

    def getUser(self, id):
        if id < 0:
            raise self.t.NotFound(message="no user %d" % id, id=id)
        return self.t.User(id=id, name="user-%d" % id, tags=["a", "b"], attrs={"k": "v"})

    def listUsers(self, limit, filter):
        return [self.getUser(i) for i in range(limit)]

    def placeOrder(self, userId, items):
        if not items:
            raise ValueError("an order needs items")
        return self.t.Order(id=1, user_id=userId, items=items, total=9.5)

    def ping(self):
        pass

    def log(self, line):
        self.logged.append(line)


class ApacheServer:
    """Apache's TThreadedServer with THeaderProtocolFactory on 127.0.0.1."""

    def __init__(self, gen, port):
        from thrift.protocol.THeaderProtocol import THeaderProtocolFactory
        from thrift.server import TServer
        from thrift.transport import TSocket, TTransport
        from thrift.transport.THeaderTransport import THeaderClientType as CT
        self.handler = Handler(gen)
        self.port = port
        processor = gen.UserService.Processor(self.handler)
        self.server = TServer.TThreadedServer(
            processor, TSocket.TServerSocket(host="127.0.0.1", port=port),
            TTransport.TTransportFactoryBase(),
            THeaderProtocolFactory(allowed_client_types=(
                CT.HEADERS, CT.FRAMED_BINARY, CT.FRAMED_COMPACT, CT.UNFRAMED_BINARY)),
            daemon=True)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        try:
            self.server.serve()
        except Exception:            # closed at teardown
            pass

    def start(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("Apache Thrift server did not start")

    def stop(self):
        try:
            self.server.serverTransport.close()
        except Exception:
            pass


def client(gen, port, mode, service="UserService"):
    """(client, protocol, transport) speaking ``mode`` to 127.0.0.1:port."""
    from thrift.protocol import TBinaryProtocol, TCompactProtocol
    from thrift.protocol.THeaderProtocol import THeaderProtocol
    from thrift.transport import TSocket, TTransport
    from thrift.transport.THeaderTransport import (THeaderClientType, THeaderSubprotocolID,
                                                   THeaderTransformID)
    sock = TSocket.TSocket("127.0.0.1", port)
    sock.setTimeout(10000)
    if mode.startswith("header"):
        trans = sock
        proto = THeaderProtocol(sock, [THeaderClientType.HEADERS],
                                THeaderSubprotocolID.COMPACT if mode == "header-compact"
                                else THeaderSubprotocolID.BINARY)
        if mode == "header-zlib":
            proto.add_transform(THeaderTransformID.ZLIB)
    else:
        trans = TTransport.TFramedTransport(sock) if mode.startswith("framed") \
            else TTransport.TBufferedTransport(sock)
        proto = TCompactProtocol.TCompactProtocol(trans) if mode.endswith("compact") \
            else TBinaryProtocol.TBinaryProtocol(trans)
    trans.open()
    return getattr(gen, service).Client(proto), proto, trans
