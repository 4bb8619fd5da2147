"""loadgen's shared skeletons (issue 24, item 4): the sync clients' one read loop
(loadgen/clientbase.py) over real sockets, the frame log's join key written once
(proxy.addresses.format_peer), and loadgen's module imports without a cycle."""

import ast
import importlib
import pathlib
import socket
import struct
import threading
import time

import pytest

from loadgen.clientbase import SocketClient
from proxy.addresses import format_peer
from tests._support.processes import ROOT

LOADGEN = ROOT / "loadgen"


class LengthPrefixed(SocketClient):
    """The smallest protocol: ``u32 length | payload``, at most 64 bytes of payload."""

    what = "test"

    def __init__(self, sock):
        self._sock = sock
        self._connected(sock)

    def split_frame(self, buf):
        if len(buf) < 4:
            return None
        (length,) = struct.unpack_from(">I", buf)
        if length > 64:
            raise ValueError(f"length {length} over 64")
        if len(buf) < 4 + length:
            return None
        return bytes(buf[4:4 + length]), 4 + length


@pytest.fixture
def pair():
    """A connected TCP pair on 127.0.0.1 (port 0): (client socket, server socket)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=5)
        server, _ = listener.accept()
    yield client, server
    client.close()
    server.close()


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_frames_cut_at_every_split_point_and_byte_by_byte(pair):
    client_sock, server = pair
    payloads = [b"", b"a", b"hello", bytes(range(64))]
    wire = b"".join(frame(p) for p in payloads)
    for cut in list(range(1, len(wire))) + ["bytes"]:
        client = LengthPrefixed(client_sock)
        pieces = [wire[i:i + 1] for i in range(len(wire))] if cut == "bytes" else \
            [wire[:cut], wire[cut:]]
        got = []

        def send():
            for piece in pieces:
                server.sendall(piece)
                time.sleep(0.0005 if cut == "bytes" else 0.002)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 5
        while len(got) < len(payloads):
            got.append(client._read_frame(deadline))
        sender.join()
        assert got == payloads, cut
        assert client.take_frame() is None and client.bytes_received == len(wire)


def test_frames_that_arrive_together_stay_buffered(pair):
    client_sock, server = pair
    client = LengthPrefixed(client_sock)
    server.sendall(frame(b"one") + frame(b"two") + frame(b"thr"))
    assert client._read_frame(time.monotonic() + 5) == b"one"
    assert client.take_frame() == b"two"               # no read: already here
    assert client.frame_bytes == 7
    assert client._read_frame(time.monotonic()) == b"thr"   # deadline passed, buffered


def test_an_oversized_length_is_refused_before_its_payload(pair):
    client_sock, server = pair
    client = LengthPrefixed(client_sock)
    server.sendall(struct.pack(">I", 1 << 30))          # no payload ever follows
    with pytest.raises(ValueError, match="over 64"):
        client._read_frame(time.monotonic() + 5)
    assert client.closed


def test_bad_frame_names_the_protocols_error(pair):
    class Named(LengthPrefixed):
        def bad_frame(self, exc):
            return OSError(f"test: from {self.where}: {exc}")

    client_sock, server = pair
    client = Named(client_sock)
    server.sendall(struct.pack(">I", 100))
    with pytest.raises(OSError, match="test: from 127.0.0.1:[0-9]+: length 100") as info:
        client._read_frame(time.monotonic() + 5)
    assert isinstance(info.value.__cause__, ValueError) and client.closed


def test_eof_mid_frame_closes_with_a_connection_error(pair):
    client_sock, server = pair
    client = LengthPrefixed(client_sock)
    server.sendall(frame(b"whole") + frame(b"cut short")[:6])
    server.close()
    assert client._read_frame(time.monotonic() + 5) == b"whole"
    with pytest.raises(ConnectionError, match="test: 127.0.0.1:[0-9]+ closed the connection"):
        client._read_frame(time.monotonic() + 5)
    assert client.closed
    with pytest.raises(ConnectionError, match="is closed"):
        client._read_frame(time.monotonic() + 5)


def test_a_deadline_is_no_error_and_the_connection_stays(pair):
    client_sock, server = pair
    client = LengthPrefixed(client_sock)
    start = time.monotonic()
    assert client._read_frame(start + 0.1) is None
    assert 0.09 <= time.monotonic() - start < 2 and not client.closed
    assert client._read_frame(time.monotonic() - 1) is None     # passed: no read at all
    server.sendall(frame(b"late"))
    time.sleep(0.05)
    assert client._read_frame(time.monotonic() - 1) is None     # still none: not polled
    assert client._read_frame(time.monotonic() - 1, poll=True) == b"late"   # one read


def test_poll_reads_once_without_waiting(pair):
    client_sock, _server = pair
    client = LengthPrefixed(client_sock)
    start = time.monotonic()
    assert client._read_frame(start, poll=True) is None
    assert time.monotonic() - start < 0.5 and not client.closed


def test_socket_timeout_mode_closes_on_expiry(pair):
    client_sock, _server = pair
    client_sock.settimeout(0.1)
    client = LengthPrefixed(client_sock)
    with pytest.raises(TimeoutError):
        client._read_frame()                # the socket's own timeout: an error
    assert client.closed


@pytest.mark.parametrize("module", ["loadgen.flymq.client", "loadgen.fleximq.client",
                                    "loadgen.rocketmq.client", "loadgen.rabbitmq_stream.client",
                                    "loadgen.ttheader.client"])
def test_the_five_clients_share_the_read_loop(module):
    """Each client says only how to cut a frame (split_frame); none reads or writes its
    socket itself (_read_frame, _send_frame)."""
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    assert ".recv(" not in source and "recv_into" not in source and ".sendall(" not in source
    mod = importlib.import_module(module)
    clients = [c for c in vars(mod).values() if isinstance(c, type)
               and issubclass(c, SocketClient) and c is not SocketClient]
    assert len(clients) == 1
    cls = clients[0]
    assert "split_frame" in vars(cls) and cls.what != SocketClient.what
    assert "_read_frame" not in vars(cls) and "_receive" not in vars(cls)


# ---------------------------------------------------------------------- the join key

@pytest.mark.parametrize("addr, local, text", [
    (("127.0.0.1", 5000), None, "127.0.0.1:5000"),
    (("::1", 5000, 0, 0), None, "[::1]:5000"),
    (("::ffff:10.0.0.1", 7, 0, 0), None, "10.0.0.1:7"),    # IPv4 client, dual-stack listener
    ("", "/tmp/l.sock", "unix:/tmp/l.sock"),               # unnamed Unix client
    (None, None, "?"),
])
def test_format_peer(addr, local, text):
    assert format_peer(addr, local) == text


def test_client_peer_is_the_proxy_peer_of_the_same_connection(pair):
    """The client's local address and the accepting side's peer are one string: the
    frame log's rows join on it."""
    client_sock, server = pair
    client = LengthPrefixed(client_sock)
    assert client.local_address == format_peer(server.getpeername())
    assert client.remote_address == format_peer(server.getsockname())


def test_no_second_peer_formatting_in_loadgen():
    """Addresses become text through format_peer only (the join key written once)."""
    offenders = []
    for path in LOADGEN.rglob("*.py"):
        text = path.read_text()
        for needle in ('f"[{', '"[%s]:%'):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []


# ---------------------------------------------------------------------- imports

def _loadgen_imports(path: pathlib.Path) -> set:
    """The loadgen modules ``path`` imports, at any level, outside its ``__main__`` block
    (run as ``python -m``, that block belongs to a module of its own)."""
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body
                 if not (isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "loadgen":
                out |= {"loadgen." + a.name for a in node.names}
            elif node.module.startswith("loadgen."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("loadgen.")}
    return out


def test_loadgen_imports_have_no_cycle():
    modules = {}
    for path in LOADGEN.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph = {name: {m for m in _loadgen_imports(path) if m in modules} - {name}
             for name, path in modules.items()}
    assert graph["loadgen.clientlog"] >= {"loadgen.pluginbase"}     # the check sees edges
    done, cycles = set(), []

    def visit(name, path):
        for nxt in sorted(graph[name]):
            if nxt in path:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert cycles == []


def test_plugin_modules_import_the_base_not_the_installer():
    for name in ("clientlog", "locustmetrics", "tlsopts", "faultplugin"):
        imports = _loadgen_imports(LOADGEN / f"{name}.py")
        assert "loadgen.pluginbase" in imports and "loadgen.plugins" not in imports, name


def test_old_common_names_still_import():
    """Users' locustfiles written against loadgen.common keep working."""
    from loadgen import common, clientbase, userbase, servecli, serverthread
    assert common.RequestReporter is userbase.RequestReporter
    assert common.SocketClient is clientbase.SocketClient
    assert common.serve_main is servecli.serve_main
    assert common.ServerThread is serverthread.ServerThread
    assert common.format_address is format_peer
