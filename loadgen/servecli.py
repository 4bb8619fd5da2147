"""The ``frametap serve <protocol>`` command line every reference server shares.

A server's ``main(argv)`` builds its ``argparse`` parser (argument types
:func:`address_arg`, :func:`user_arg`, :func:`service_time_arg`) and returns
:func:`serve_main`, which adds ``--ready-file`` and ``--tls-cert``/``--tls-key``, builds
the server, prints its banner once it listens and serves until SIGINT/SIGTERM. A usage
error found after parsing is a :class:`CommandLineError`: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable

from loadgen.serverthread import new_event_loop
from loadgen.servicetime import ServiceTime, parse_service_time
from loadgen.tlsopts import server_context
from proxy.readyfile import remove_ready_file, write_ready_file

__all__ = ["address_arg", "user_arg", "service_time_arg", "CommandLineError", "serve_main",
           "READY_FILE_HELP"]


def address_arg(text: str, example_port: int) -> tuple[str, int]:
    """argparse ``HOST:PORT`` -> ``(host, port)``; the error names ``example_port``."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected HOST:PORT with PORT 0..65535, e.g. 127.0.0.1:{example_port}")
    return host.strip("[]"), int(port_text)


def user_arg(text: str) -> tuple[str, str]:
    """argparse ``NAME:PASSWORD`` -> ``(name, password)``."""
    name, sep, password = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{name or text!r}: expected NAME:PASSWORD")
    return name, password


def service_time_arg(text: str) -> ServiceTime:
    """argparse service-time distribution (:func:`loadgen.servicetime.parse_service_time`)."""
    try:
        return parse_service_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class CommandLineError(Exception):
    """A usage error found after parsing; :func:`serve_main` prints it and exits 2."""


async def _serve_until_signalled(server, banner: Callable[[object], str],
                                 ready_file: str | None = None, name: str = "") -> None:
    await server.start()
    print(banner(server), flush=True)
    if ready_file is not None:
        _write_ready_file(server, ready_file, name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        await stop.wait()
    finally:
        if ready_file is not None:
            remove_ready_file(ready_file)
        await server.close()


def _write_ready_file(server, path: str, name: str) -> None:
    """``--ready-file``: the server's bound listeners (see :mod:`proxy.readyfile`)."""
    bound = server.bound_addresses()
    try:
        write_ready_file(path, {"pid": os.getpid(), "server": name,
                                "listen": [address for _role, address in bound],
                                "roles": {role: address for role, address in bound if role}})
    except OSError as exc:
        raise CommandLineError(f"--ready-file {path}: cannot write: "
                               f"{exc.strerror or exc}") from None


READY_FILE_HELP = ("once every listener is bound, write JSON naming them to PATH (atomically; "
                   "removed on exit): {\"pid\": N, \"server\": NAME, \"listen\": [ADDR, ...], "
                   "\"roles\": {ROLE: ADDR}}. With port 0 in a listen address the kernel "
                   "picks a free port and this file says which")


def serve_main(parser: argparse.ArgumentParser, argv: list[str] | None,
               make_server: Callable[[argparse.Namespace], tuple[object, str]],
               banner: Callable[[object], str]) -> int:
    """``frametap serve <protocol>``: parse ``argv``, set up logging, build the server
    with ``make_server(args)`` -> ``(server, listen text)``, print ``banner(server)`` once
    it listens (and write ``--ready-file``, which this adds to every server's options)
    and serve until SIGINT/SIGTERM. Returns the exit status: 0 (also for
    ``--help``), 2 for a bad argument, a :class:`CommandLineError` or a listen address
    that cannot be bound (docs/design.md, "Command line")."""
    if not any("--ready-file" in action.option_strings for action in parser._actions):
        parser.add_argument("--ready-file", metavar="PATH", default=None,
                            help=READY_FILE_HELP)
    if not any("--tls-cert" in action.option_strings for action in parser._actions):
        parser.add_argument("--tls-cert", metavar="FILE", default=None,
                            help="serve TLS with this certificate (PEM; with --tls-key)")
        parser.add_argument("--tls-key", metavar="FILE", default=None,
                            help="the certificate's private key (PEM)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2, message already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server, listen = make_server(args)
        if args.tls_cert or args.tls_key:
            if not (args.tls_cert and args.tls_key):
                raise CommandLineError("--tls-cert and --tls-key go together")
            try:
                server.ssl_context = server_context(args.tls_cert, args.tls_key)
            except ValueError as exc:
                raise CommandLineError(str(exc)) from None
    except CommandLineError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(_serve_until_signalled(server, banner, args.ready_file,
                                              parser.prog.rpartition(" ")[2]))
    except OSError as exc:
        print(f"{parser.prog}: cannot listen on {listen}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2  # a port in use is a user error (docs/design.md, "Command line")
    except CommandLineError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
