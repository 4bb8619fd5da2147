"""The reference Thrift service (``frametap serve ttheader``): every dialect and protocol
answered with thriftpy2-encoded payloads (the IDL loaded at run time: no ``thrift``
compiler, no Apache library), declared and application exceptions, bad calls answered
with an exception reply and no traceback, the zlib inflate capped at the frame limit,
the error rate, per-method service time, bad input, and Apache's own THeader and framed
clients calling it through the proxy (those skip without Apache Thrift)."""

import os
import re
import socket
import struct
import subprocess
import sys
import time
import zlib

import pytest

from loadgen.ttheader import idl
from loadgen.ttheader.client import TApplicationException, ThriftClient
from loadgen.ttheader.server import ThriftServerThread
from proxy.protocols.ttheader import codec
from proxy.protocols.ttheader.constants import MAGIC_THEADER, MAX_FRAME_BYTES, ZLIB
from tests.test_ttheader_apache import Proxy
from tests.thrift_real import client as apache_client, thrift_or_skip
from tests._support.processes import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gen():
    """Apache's generated code (the independent peer): skips without Apache Thrift."""
    return thrift_or_skip()


@pytest.mark.parametrize("transport", ["ttheader", "theader", "framed"])
@pytest.mark.parametrize("protocol", ["binary", "compact"])
def test_every_dialect(transport, protocol):
    demo = idl.load()
    with ThriftServerThread() as srv:
        c = ThriftClient("127.0.0.1", srv.port, transport, protocol,
                         zlib=transport == "theader")
        assert c.call("echo", "x") == "x" and c.last_status == "OK"
        user = c.call("getUser", 42)
        assert (user.id, user.name, user.tags) == (42, "user-00042", ["tier-0", "demo"])
        assert [u.id for u in c.call("listUsers", 4, {"region": "eu"})] == [1, 2, 3, 4]
        assert c.call("placeOrder", 7, [100, 200]).items == [100, 200]
        assert c.call("ping") is None and c.call("log", "line") is None
        with pytest.raises(demo.NotFound):
            c.call("getUser", 0)
        assert c.last_status == "EXCEPTION"
        with pytest.raises(TApplicationException):
            c.call("retired")
        assert c.last_status == "UNKNOWN_METHOD"
        with pytest.raises(TApplicationException, match=r"argument 1 \(id\) is missing"):
            c.call("getUser")
        assert c.last_status == "PROTOCOL_ERROR"
        assert c.call("echo", "still") == "still"
        c.close()
        assert srv.server.handler.logged == 1


def test_kitex_reply_headers_and_seq_ids():
    with ThriftServerThread() as srv:
        s = socket.create_connection(("127.0.0.1", srv.port), 5)
        call = codec.ttheader(codec.binary_message("ping", codec.CALL, 77, b"\x00"), seq=77,
                              flags=1, intinfo={2: "log-9", 9: "ping"}, inner_framed=True)
        s.sendall(call)
        transport, fields, payload = codec.split(codec.read_frame(s))
        s.close()
    assert transport == "ttheader" and fields["seq"] == 77 and fields["flags"] == 1
    assert fields["intinfo"][9] == "ping" and fields["intinfo"][2] == "log-9"
    assert fields["strinfo"] == {"biz-status": "0"} and fields.get("inner_framed")
    assert codec.parse_message_header(payload) == ("ping", codec.REPLY, 77)


def test_error_rate_and_method_time():
    with ThriftServerThread(error_rate=1.0, method_times={"echo": "30ms"}, seed=1) as srv:
        c = ThriftClient("127.0.0.1", srv.port)
        t0 = time.perf_counter()
        c.call("echo", "slow")
        assert time.perf_counter() - t0 >= 0.025
        t0 = time.perf_counter()
        c.call("ping")
        assert time.perf_counter() - t0 < 0.025
        failures = 0
        for i in range(5):
            try:
                c.call("getUser", i + 1)
            except Exception:
                failures += 1
        assert failures == 5 and c.last_status == "EXCEPTION"
        c.close()


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\n\r\n", b"\x80\x01\x00\x01junk",
                                     b"\x00\x00\x00\x08\x10\x00\x00\x00\x00\x00\x00\x00"])
def test_garbage_closes_that_connection_only(garbage):
    with ThriftServerThread() as srv:
        good = ThriftClient("127.0.0.1", srv.port)
        bad = socket.create_connection(("127.0.0.1", srv.port), 5)
        bad.sendall(garbage)
        bad.settimeout(5)
        assert bad.recv(10) == b""
        bad.close()
        assert good.call("echo", "ok") == "ok"
        good.close()


@pytest.mark.parametrize("mode", ["header-binary", "header-compact", "header-zlib",
                                  "framed-binary", "framed-compact"])
def test_apache_clients_through_proxy_to_reference_service(gen, tmp_path, mode):
    """Apache's THeader client (and its framed client) against our service via frametap."""
    from thrift.Thrift import TApplicationException as ApacheTApplicationException
    with ThriftServerThread() as srv:
        proxy = Proxy(srv.port, tmp_path)
        try:
            c, _, trans = apache_client(gen, proxy.port, mode, service="LegacyUserService")
            for i in range(5):
                assert c.getUser(i + 1).id == i + 1
            with pytest.raises(gen.ttypes.NotFound):
                c.getUser(-5)
            with pytest.raises(ApacheTApplicationException):
                c.retired()
            c.log("x")
            c.ping()
            trans.close()
            assert proxy.value("frametap_responses_total", opcode="getUser", status="OK") == 5
            assert proxy.value("frametap_responses_total", opcode="getUser",
                               status="EXCEPTION") == 1
            assert proxy.value("frametap_responses_total", opcode="retired",
                               status="UNKNOWN_METHOD") == 1
            assert proxy.value("frametap_frames_total", direction="c2s", opcode="log") == 1
            assert proxy.value("frametap_request_duration_seconds_count", opcode="ping",
                               outcome="ok") == 1
            assert proxy.errors() == {}
        finally:
            proxy.close()


def test_serve_command_help_and_bad_arguments():
    r = subprocess.run([sys.executable, "-m", "proxy", "serve", "ttheader", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--transport" in r.stdout and "--method-time" in r.stdout
    r = subprocess.run([sys.executable, "-m", "proxy", "serve", "ttheader", "--error-rate",
                        "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "expected a fraction" in r.stderr
    assert "Traceback" not in r.stderr


# ---- the service without Apache Thrift ------------------------------------------------

def test_service_client_and_users_need_no_apache_thrift(tmp_path):
    """A fresh process where Apache's ``thrift`` package cannot be imported and no
    ``thrift`` compiler is on PATH: the service, the client and the Locust users' module
    load and work (thriftpy2 reads the IDL at run time)."""
    script = (
        "import sys; sys.modules['thrift'] = None    # import thrift: ImportError\n"
        "from loadgen.ttheader.server import ThriftServerThread\n"
        "from loadgen.ttheader.client import ThriftClient\n"
        "with ThriftServerThread() as srv:\n"
        "    c = ThriftClient('127.0.0.1', srv.port, 'theader', 'compact', zlib=True)\n"
        "    print(c.call('getUser', 7).name, c.call('echo', 'ok'))\n"
        "    c.close()\n"
        "import loadgen.ttheader.users\n"
        "print(sorted(m for m in sys.modules if m.startswith('thrift.')))\n")
    env = dict(os.environ, PATH=str(tmp_path), PYTHONPATH=str(ROOT))     # no `thrift` binary
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["user-00007 ok", "[]"], r.stdout


# ---- bad calls and zip bombs against `frametap serve ttheader` --------------------------

class ServeProcess:
    """``frametap serve ttheader`` in a child process on a port it picks (port 0)."""

    def __init__(self, tmp_path, *args):
        self.errpath = tmp_path / "server.log"
        self.err = open(self.errpath, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "ttheader", "--listen", "127.0.0.1:0",
             "--log-level", "INFO", *args], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if not m:
            self.stop()
            raise AssertionError(f"no banner: {line!r}; log: {self.log()[-2000:]}")
        self.port = int(m.group(1))

    def status(self, key):
        """A /proc/PID/status memory figure in bytes (VmRSS, VmHWM)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def log(self):
        if not self.err.closed:
            self.err.flush()
        return self.errpath.read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        return self.log()


def zlib_zeros(n):
    """A zlib stream inflating to ``n`` zero bytes (n a multiple of 1 MiB), built without
    compressing them: repeated full-flush deflate blocks, zlib header and Adler-32."""
    mib = b"\0" * (1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(mib) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(mib) + c.flush(zlib.Z_FULL_FLUSH)
    adler = ((n % 65521) << 16) | 1                  # Adler-32 of n zero bytes
    return b"\x78\xda" + first + block * ((n >> 20) - 1) + c.flush() + \
        adler.to_bytes(4, "big")


def theader_raw(payload, transforms):
    """A THeader frame listing ``transforms`` over ``payload`` as given (not applied)."""
    h = codec.varint(0) + codec.varint(len(transforms)) + \
        b"".join(codec.varint(t) for t in transforms)
    h += b"\0" * (-len(h) % 4)
    return struct.pack(">IHHiH", 10 + len(h) + len(payload), MAGIC_THEADER, 0, 1,
                       len(h) // 4) + h + payload


def test_zlib_inflate_is_capped_at_the_frame_limit():
    """codec.split inflates each zlib transform into at most max_bytes."""
    call = codec.binary_message("echo", codec.CALL, 3, b"\x0b\x00\x01" +
                                struct.pack(">i", 2000) + b"x" * 2000 + b"\x00")
    frame = codec.theader(call, seq=3, transforms=(ZLIB,))
    assert codec.split(frame, max_bytes=len(call))[2] == call     # exactly at the limit
    with pytest.raises(codec.InflateLimitError, match="inflates past the frame limit of 2000"):
        codec.split(frame, max_bytes=2000)
    twice = codec.theader(call, seq=3, transforms=(ZLIB, ZLIB))
    assert codec.split(twice)[2] == call
    with pytest.raises(codec.FrameError, match="zlib payload"):
        codec.split(theader_raw(zlib.compress(call)[:-6], (ZLIB,)))    # truncated stream
    with pytest.raises(codec.FrameError, match="zlib payload"):
        codec.split(theader_raw(b"not zlib at all", (ZLIB,)))
    assert codec.inflate(zlib_zeros(4 << 20), 4 << 20) == b"\0" * (4 << 20)
    with pytest.raises(codec.InflateLimitError):
        codec.inflate(zlib_zeros(4 << 20), (4 << 20) - 1)


def test_zip_bomb_is_refused_without_memory_growth(tmp_path):
    """THeader frames whose zlib payload inflates to 1 GiB (a 1 MiB frame; and a 2.5 KB
    frame listing zlib twice, as in the report of 2.1 GB): the server inflates at most the
    frame limit (64 MiB), logs one line, closes that connection, and serves on."""
    bomb = zlib_zeros(1 << 30)
    frames = {"1 MiB frame, zlib once": theader_raw(bomb, (ZLIB,)),
              "small frame, zlib twice": theader_raw(zlib.compress(bomb, 9), (ZLIB, ZLIB))}
    assert len(frames["small frame, zlib twice"]) < 4096
    srv = ServeProcess(tmp_path)
    try:
        with ThriftClient("127.0.0.1", srv.port, "theader", zlib=True) as c:   # warm up
            assert c.call("echo", "x" * 10000) == "x" * 10000
        base = srv.status("VmRSS")
        for label, frame in frames.items():
            s = socket.create_connection(("127.0.0.1", srv.port), 10)
            s.sendall(frame)
            s.settimeout(30)
            assert s.recv(100) == b"", label                  # refused: closed
            s.close()
            assert srv.status("VmRSS") - base < 16 << 20, label   # nothing kept either
        peak = srv.status("VmHWM")
        assert peak - base < MAX_FRAME_BYTES + (32 << 20), (base, peak)   # not 1 GiB
        with ThriftClient("127.0.0.1", srv.port, "theader", zlib=True) as c:
            assert c.call("echo", "after") == "after"
    finally:
        log = srv.stop()
    assert log.count("inflates past the frame limit of %d bytes" % MAX_FRAME_BYTES) == 2, log
    assert "Traceback" not in log


def test_get_user_without_id_is_an_exception_reply_without_traceback(tmp_path):
    """getUser with no id, 2,000 times on one connection (by the client and as raw
    bytes): each is answered with TApplicationException PROTOCOL_ERROR naming the
    argument, the connection stays usable, and the log holds no traceback and only a
    rate-limited handful of lines."""
    srv = ServeProcess(tmp_path)
    try:
        with ThriftClient("127.0.0.1", srv.port, "ttheader", "compact") as c:
            for _ in range(1000):
                with pytest.raises(TApplicationException) as e:
                    c.call("getUser")
                assert e.value.type == TApplicationException.PROTOCOL_ERROR
                assert c.last_status == "PROTOCOL_ERROR"
            assert str(e.value) == "getUser: argument 1 (id) is missing"
            assert c.call("getUser", 5).id == 5
        s = socket.create_connection(("127.0.0.1", srv.port), 10)
        for seq in range(1, 1001):
            s.sendall(codec.framed(codec.binary_message("getUser", codec.CALL, seq)))
            _, _, payload = codec.split(codec.read_frame(s))
            assert codec.parse_message_header(payload) == ("getUser", codec.EXCEPTION, seq)
            assert payload.endswith(codec.tapp_exception(7, "getUser: argument 1 (id) is "
                                                            "missing")), payload
        s.close()
    finally:
        log = srv.stop()
    assert "Traceback" not in log and "Error" not in log, log[-3000:]
    lines = log.splitlines()
    assert any("answered a bad call: getUser" in ln and "PROTOCOL_ERROR" in ln
               for ln in lines), log
    assert len(lines) < 200, len(lines)


# ---- hostile payloads: thriftpy2 decodes only what passed loadgen.ttheader.wire --------

def _bin_call(name, body):
    return codec.binary_message(name, codec.CALL, 1, body)


HOSTILE = {
    # a string claiming 2 GB in a 30-byte message (crashed thriftpy2's Cython codec)
    "name claims 2 GB": b"\x80\x01\x00\x01\x7f\xff\xff\xf0ping\x00\x00\x00\x01\x00",
    "string claims 2 GB": _bin_call("echo", b"\x0b\x00\x01\x7f\xff\xff\xf0hi\x00"),
    "non-strict name claims 1 GB": b"\x40\x00\x00\x00echo\x01\x00\x00\x00\x01\x00",
    # containers of 2^31 elements of a type that reads nothing (a CPU spin)
    "binary list of STOP": _bin_call("placeOrder", b"\x0f\x00\x02\x00\x7f\xff\xff\xff\x00"),
    "binary map of VOID": _bin_call("listUsers", b"\x0d\x00\x02\x01\x01\x7f\xff\xff\xff\x00"),
    "binary list of i64, 2^31": _bin_call("placeOrder", b"\x0f\x00\x02\x0a\x7f\xff\xff\xff"
                                                        b"\x00"),
    "compact list of STOP": codec.compact_message("placeOrder", codec.CALL, 1,
                                                  b"\x29\xf0\xff\xff\xff\xff\x07\x00"),
    "compact map of 2^31": codec.compact_message("listUsers", codec.CALL, 1,
                                                 b"\x2b\xff\xff\xff\xff\x07\x88\x00"),
    "structs 100,000 deep": _bin_call("echo", b"\x0c\x00\x01" * 100000),
    "compact structs 100,000 deep": codec.compact_message("echo", codec.CALL, 1,
                                                          b"\x1c" * 100000),
    "cut short": _bin_call("getUser", b"\x0a\x00\x01\x00\x00"),
}


def test_hostile_payloads_close_that_connection_quickly(tmp_path):
    """Each payload closes its connection within a second, with a log line; the server
    process neither crashes nor grows, and serves the next client."""
    srv = ServeProcess(tmp_path)
    try:
        base = srv.status("VmRSS")
        for label, payload in HOSTILE.items():
            s = socket.create_connection(("127.0.0.1", srv.port), 10)
            t0 = time.monotonic()
            s.sendall(codec.framed(payload))
            s.settimeout(10)
            assert s.recv(100) == b"", label
            assert time.monotonic() - t0 < 1.0, label
            s.close()
            assert srv.proc.poll() is None, (label, srv.log()[-2000:])
        assert srv.status("VmHWM") - base < 32 << 20
        with ThriftClient("127.0.0.1", srv.port, "framed") as c:
            assert c.call("echo", "alive") == "alive"
    finally:
        log = srv.stop()
    suppressed = sum(int(n) for n in re.findall(r"(\d+) similar log lines suppressed", log))
    assert log.count("malformed Thrift message") + suppressed == len(HOSTILE), log
    assert "Traceback" not in log


def test_mutated_calls_never_crash_the_decoder():
    """Random byte flips, cuts and insertions in every method's call (binary and
    compact): the dispatcher answers or raises an ordinary exception, quickly."""
    import random
    from loadgen.ttheader.server import DemoHandler, Dispatcher
    demo = idl.load()
    d = Dispatcher(demo.UserService, DemoHandler(demo))
    seeds = []
    for compact in (False, True):
        for method, args in (("getUser", {"id": 3}), ("echo", {"message": "hi"}),
                             ("listUsers", {"limit": 3, "filter": {"a": "b"}}),
                             ("placeOrder", {"userId": 2, "items": [1, 2, 3]}),
                             ("ping", {}), ("log", {"line": "x"})):
            buf = idl.memory_buffer()
            p = idl.protocol(buf, compact)
            p.write_message_begin(method, codec.CALL, 7)
            getattr(demo.UserService, method + "_args")(**args).write(p)
            seeds.append(buf.getvalue())
    rng = random.Random(21)
    answered = 0
    for _ in range(20000):
        p = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            if not p:
                break
            k = rng.randrange(len(p))
            op = rng.random()
            if op < 0.6:
                p[k] = rng.randrange(256)
            elif op < 0.8:
                del p[k:k + rng.randint(1, 4)]
            else:
                p[k:k] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        t0 = time.perf_counter()
        try:
            d.process(bytes(p))
            answered += 1
        except Exception:          # noqa: BLE001 - any ordinary exception closes the peer
            pass
        assert time.perf_counter() - t0 < 0.5, bytes(p)
    assert answered > 1000


@pytest.mark.parametrize("compact", [False, True])
def test_wire_check_accepts_what_apache_writes(gen, compact):
    """Every call Apache's generated client writes and every reply its processor writes
    (results, the declared NotFound, INTERNAL_ERROR, UNKNOWN_METHOD) passes the shape
    check, and thriftpy2 reads the same values from it."""
    from thrift.protocol import TBinaryProtocol, TCompactProtocol
    from thrift.transport.TTransport import TMemoryBuffer
    from loadgen.ttheader import wire
    from tests.thrift_real import Handler
    proto = TCompactProtocol.TCompactProtocol if compact else TBinaryProtocol.TBinaryProtocol
    demo = idl.load()
    calls = [("echo", ("héllo",)), ("getUser", (5,)), ("getUser", (-5,)),
             ("listUsers", (3, {"k": "v", "é": ""})), ("placeOrder", (1, [1, 2, 1 << 40])),
             ("placeOrder", (1, [])), ("ping", ()), ("log", ("line",)), ("retired", ())]
    for method, args in calls:
        out = TMemoryBuffer()
        client = gen.LegacyUserService.Client(proto(out))
        getattr(client, "send_" + method)(*args)
        call = out.getvalue()
        wire.check(call)
        name, mtype, seq = idl.reader(call).read_message_begin()
        assert name == method and mtype == (codec.ONEWAY if method == "log" else codec.CALL)
        if method != "retired":
            got = getattr(demo.UserService, method + "_args")()
            r = idl.reader(call)
            r.read_message_begin()
            got.read(r)
            assert [getattr(got, s[1]) for s in got.thrift_spec.values()] == list(args)
        reply = TMemoryBuffer()
        gen.UserService.Processor(Handler(gen)).process(proto(TMemoryBuffer(call)),
                                                         proto(reply))
        if reply.getvalue():
            wire.check(reply.getvalue())
            assert idl.reader(reply.getvalue()).read_message_begin()[0] == method


def test_handler_failure_is_internal_error_without_traceback(caplog):
    """A handler that fails unexpectedly: INTERNAL_ERROR reply naming the failure, one
    log line saying where (no traceback), and the connection goes on."""
    with caplog.at_level("INFO"), ThriftServerThread() as srv:
        srv.server.handler.echo = lambda message: 1 // 0
        with ThriftClient("127.0.0.1", srv.port) as c:
            with pytest.raises(TApplicationException,
                               match="echo failed: ZeroDivisionError") as e:
                c.call("echo", "x")
            assert e.value.type == TApplicationException.INTERNAL_ERROR
            assert c.last_status == "INTERNAL_ERROR"
            assert c.call("ping") is None and c.last_status == "OK"
    bad = [r for r in caplog.records if "answered a bad call" in r.getMessage()]
    assert len(bad) == 1 and "ZeroDivisionError" in bad[0].getMessage()
    assert "test_ttheader_server.py" in bad[0].getMessage()           # where it failed
    assert not [r for r in caplog.records if r.exc_info]
