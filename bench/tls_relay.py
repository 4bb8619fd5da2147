"""A bare uvloop TLS relay: bench/passthrough.py with uvloop's SSL on either side.

The baseline frametap's TLS routes are measured against (bench/tls_bench.py), and the
TLS end in front of a plain backend in that benchmark. Nothing but the relay: each
accepted connection (TLS when ``--cert``/``--key``) gets one upstream connection (TLS
when ``--ca``, verified against that CA, SNI/name = ``--server-name`` or the upstream
host), bytes are handed over unchanged, the same write-buffer limits and backpressure.

    python bench/tls_relay.py --listen 127.0.0.1:9101 --upstream 127.0.0.1:9092 \\
        --cert server.pem --key server.key [--ca ca.pem]

Prints ``ready`` on stdout once it is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passthrough import ClientSide, UpstreamSide, parse_addr  # noqa: E402


class TLSClientSide(ClientSide):
    """ClientSide whose upstream connection speaks TLS when ``client_ctx`` is set."""

    client_ctx: ssl.SSLContext | None = None
    server_name: str | None = None

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.upstream
        kw = {}
        if self.client_ctx is not None:
            kw = {"ssl": self.client_ctx, "server_hostname": self.server_name or host}
        try:
            _, upstream = await loop.create_connection(lambda: UpstreamSide(self), host, port,
                                                       **kw)
        except OSError as exc:
            print(f"tls_relay: cannot reach upstream {host}:{port}: {exc}", file=sys.stderr)
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
            upstream.transport.close()
        else:
            self.transport.resume_reading()  # type: ignore[union-attr]


async def serve(args) -> None:
    loop = asyncio.get_running_loop()
    server_ctx = None
    if args.cert:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(args.cert, args.key)
    if args.ca:
        TLSClientSide.client_ctx = ssl.create_default_context(cafile=args.ca)
        TLSClientSide.server_name = args.server_name
    server = await loop.create_server(
        lambda: TLSClientSide(args.upstream), args.listen[0], args.listen[1],
        reuse_address=True, backlog=1024, ssl=server_ctx)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=parse_addr, required=True, help="HOST:PORT to accept on")
    ap.add_argument("--upstream", type=parse_addr, required=True, help="HOST:PORT to forward to")
    ap.add_argument("--cert", help="serve TLS with this certificate (PEM)")
    ap.add_argument("--key", help="the certificate's key (PEM)")
    ap.add_argument("--ca", help="speak TLS upstream, verified against this CA (PEM)")
    ap.add_argument("--server-name", default=None, help="upstream name to verify (SNI)")
    args = ap.parse_args(argv)
    if bool(args.cert) != bool(args.key):
        ap.error("--cert and --key go together")
    import uvloop
    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
