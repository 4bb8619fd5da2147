"""Pass-through TCP proxy on uvloop: the baseline frametap is measured against.

It does what any byte-shuffling proxy must and nothing more: each accepted
connection gets one upstream connection; bytes from either side are written
to the other unchanged; when one side's send buffer fills, reading from the
other side pauses until it drains; a FIN from one side is passed on as a FIN
(half-close) and the pair is closed once both directions have ended.

    python bench/passthrough.py --listen 127.0.0.1:9100 --upstream 127.0.0.1:9092

Prints ``ready`` on stdout once it is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys

WRITE_HIGH = 256 * 1024
WRITE_LOW = 64 * 1024


class _Side(asyncio.Protocol):
    """One end of a proxied pair; ``peer`` is the other end."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.eof = False  # this side has sent us its FIN

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # the same write-buffer limits as proxy/relay.py, so the baseline is comparable
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        # The hot path: hand the bytes straight to the other side.
        self.peer.transport.write(data)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.transport.is_closing():
            return False
        if peer.eof:
            # Both directions have ended: close both.
            peer.transport.close()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()
        return True  # keep our transport open to carry the other direction

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            peer.transport.close()

    # Backpressure: our send buffer is full, so stop reading from the peer.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class UpstreamSide(_Side):
    """The connection to the real server."""

    def __init__(self, client: "ClientSide") -> None:
        super().__init__()
        self.peer = client


class ClientSide(_Side):
    """An accepted client connection; dials the upstream on arrival."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self.upstream = upstream
        self.early: list[bytes] = []  # bytes that arrived before the upstream did

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # Read no more until the upstream is there to take it.  uvloop may
        # still deliver a first read, which waits in ``early``.
        transport.pause_reading()  # type: ignore[attr-defined]
        asyncio.get_running_loop().create_task(self._dial())

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None:
            self.early.append(data)
            self.transport.pause_reading()  # type: ignore[union-attr]
            return
        peer.transport.write(data)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        if self.peer is None:
            self.eof = True
            return True  # passed on once the upstream is connected
        return super().eof_received()

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.upstream
        try:
            _, upstream = await loop.create_connection(lambda: UpstreamSide(self), host, port)
        except OSError as exc:
            print(f"passthrough: cannot reach upstream {host}:{port}: {exc}", file=sys.stderr)
            self.transport.close()  # type: ignore[union-attr]
            return
        if self.transport.is_closing():  # type: ignore[union-attr]
            upstream.transport.close()
            return
        self.peer = upstream
        if self.early:
            upstream.transport.write(b"".join(self.early))
            self.early.clear()
        if self.eof:
            upstream.transport.write_eof()
        else:
            self.transport.resume_reading()  # type: ignore[union-attr]


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


async def serve(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: ClientSide(upstream), listen[0], listen[1], reuse_address=True, backlog=1024
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()
    await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=parse_addr, required=True, help="HOST:PORT to accept on")
    ap.add_argument("--upstream", type=parse_addr, required=True, help="HOST:PORT to forward to")
    args = ap.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        print("passthrough: uvloop is not installed (pip install uvloop); the baseline "
              "must run on the same event loop as frametap", file=sys.stderr)
        return 2
    uvloop.run(serve(args.listen, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
