"""Apache Thrift's own Python library as an independent peer, for the tests only: the
demo IDL compiled by Apache's ``thrift`` compiler (Debian ``thrift-compiler``) with the
PyPI ``thrift`` library, an Apache THeader server (THeaderProtocol accepting THeader,
framed and unframed clients) and clients in every dialect the parser reads.

frametap itself never needs the compiler (its service, client and users load the IDL at
run time with thriftpy2). ``.ci/run`` installs both; elsewhere the tests that use them
skip with one line saying what is missing (``FRAMETAP_CI=1``: they fail instead).
"""

import hashlib
import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from loadgen.ttheader.idl import IDL

MODES = ("header-binary", "header-compact", "header-zlib", "framed-binary",
         "framed-compact", "unframed-binary")


class Unavailable(RuntimeError):
    """Apache Thrift (compiler or library) is missing, or compiling the IDL failed."""


def _cache_dir():
    base = os.environ.get("FRAMETAP_THRIFT_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "frametap", "thrift")
    return Path(base) / hashlib.sha256(IDL.read_bytes()).hexdigest()[:16]


def _generate():
    """Compile the IDL with ``thrift --gen py`` (once per IDL version, cached); returns
    the directory to put on sys.path."""
    out = _cache_dir()
    if (out / "frametap_demo" / "UserService.py").exists():
        return out
    thrift = shutil.which("thrift")
    if thrift is None:
        raise Unavailable("Apache's `thrift` compiler is not on PATH (Debian: apt-get "
                          "install thrift-compiler; .ci/run installs it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    try:
        r = subprocess.run([thrift, "--gen", "py", "-out", str(tmp), str(IDL)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
            raise Unavailable("thrift --gen py failed: %s" % (msg[-1] if msg else r.returncode))
        try:
            tmp.rename(out)
        except OSError:                      # another process won the race
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_apache():
    """Apache's generated package ``frametap_demo`` (``.ttypes``, ``.UserService``,
    ``.LegacyUserService``); raises :class:`Unavailable`."""
    try:
        import thrift  # noqa: F401
    except ImportError:
        raise Unavailable("Apache's Python library `thrift` is not installed (pip install "
                          "thrift; .ci/run installs it)") from None
    path = str(_generate())
    if path not in sys.path:
        sys.path.insert(0, path)
    pkg = importlib.import_module("frametap_demo")
    for sub in ("ttypes", "UserService", "LegacyUserService"):
        importlib.import_module("frametap_demo." + sub)
    return pkg


def thrift_or_skip():
    """Apache's generated ``frametap_demo`` package; fails in CI (``FRAMETAP_CI``) when
    the compiler or the ``thrift`` library is missing, skips with one line elsewhere."""
    try:
        return load_apache()
    except Unavailable as e:
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(f"Apache Thrift peer must be available in CI: {e}")
        pytest.skip(f"Apache Thrift peer not available: {e}")


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
    """Apache's TThreadedServer with THeaderProtocolFactory on 127.0.0.1; ``port`` 0 (the
    default) binds a port the kernel picks, read back into :attr:`port` by :meth:`start`.
    ``transport`` replaces the plain server socket (a ``TSSLServerSocket``),
    ``client_types`` the THeader client types it accepts.

    Its accept loop is this class's, not ``TThreadedServer.serve()``: that loop never
    ends, and once the socket is closed under it, it logs a traceback per turn for ever.
    One test's server left spinning so ate a core for the rest of a ``make test`` run, and
    its tracebacks (CPython 3.11 parses source lines for their ``^^^`` marks) raced
    pytest's own ``ast.parse``: "AST constructor recursion depth mismatch", an
    INTERNALERROR that ended the run. :meth:`stop` ends the loop and waits for it."""

    ALL_CLIENTS = ("HEADERS", "FRAMED_BINARY", "FRAMED_COMPACT", "UNFRAMED_BINARY")

    def __init__(self, gen, port=0, transport=None, client_types=ALL_CLIENTS):
        from thrift.protocol.THeaderProtocol import THeaderProtocolFactory
        from thrift.server import TServer
        from thrift.transport import TSocket, TTransport
        from thrift.transport.THeaderTransport import THeaderClientType as CT
        self.handler = Handler(gen)
        self.port = port
        self.transport = transport or TSocket.TServerSocket(host="127.0.0.1", port=port)
        self.server = TServer.TThreadedServer(
            gen.UserService.Processor(self.handler), self.transport,
            TTransport.TTransportFactoryBase(),
            THeaderProtocolFactory(allowed_client_types=tuple(
                getattr(CT, name) for name in client_types)),
            daemon=True)
        self.accept_errors = []
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True,
                                       name="apache-thrift-accept")

    def _serve(self):
        while not self._stopping.is_set():
            try:
                client = self.transport.accept()
            except Exception as exc:       # stop() shut the socket, or a real accept error
                if self._stopping.is_set():
                    return
                self.accept_errors.append(exc)
                time.sleep(0.01)
                continue
            if client is not None:         # None: a TLS handshake that failed
                threading.Thread(target=self.server.handle, args=(client,),
                                 daemon=True).start()

    def start(self):
        # bind and listen here: the port is known (and taken), and connections wait in the
        # backlog until the thread accepts them
        self.transport.listen()
        self.port = self.transport.handle.getsockname()[1]
        self.thread.start()
        return self

    def stop(self):
        """End the accept loop (a shut-down listening socket wakes its accept()), wait for
        it, close the socket. Raises when the loop did not end."""
        self._stopping.set()
        handle = self.transport.handle
        if handle is not None:
            try:
                handle.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(10)
        try:
            self.transport.close()
        except Exception:
            pass
        if self.thread.is_alive():
            raise RuntimeError("the Apache Thrift server's accept loop did not end")


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
