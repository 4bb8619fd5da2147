"""TLS for the load generator: the Locust users' client side and the reference servers.

Clients (every sync client connects through :func:`loadgen.clientbase.connect_tcp`, which
wraps the socket when TLS is on): Locust options, or the same settings as environment
variables (what a worker on another machine reads too):

==========================  ===============================  ====================================
option                      variable                         meaning
==========================  ===============================  ====================================
``--tls``                   ``FRAMETAP_TLS=1``               speak TLS to the host
``--tls-ca FILE``           ``FRAMETAP_TLS_CA``              CA bundle (PEM) to verify the server
                                                             (default: the system's store)
``--tls-insecure``          ``FRAMETAP_TLS_INSECURE=1``      do not verify the server at all
``--tls-server-name NAME``  ``FRAMETAP_TLS_SERVER_NAME``     name to verify and send as SNI
                                                             (default: the host connected to)
``--tls-client-cert FILE``  ``FRAMETAP_TLS_CLIENT_CERT``     client certificate (PEM) ...
``--tls-client-key FILE``   ``FRAMETAP_TLS_CLIENT_KEY``      ... and its key
==========================  ===============================  ====================================

(Locust's own ``--tls-cert``/``--tls-key`` serve its web UI over HTTPS; they are not these.)
Any of the ``--tls-*`` options implies ``--tls``.  A bad file is one line and exit status 2.

Servers: ``frametap serve P --tls-cert FILE --tls-key FILE`` (every reference server,
:func:`loadgen.servecli.serve_main`).
"""

from __future__ import annotations

import os
import ssl
import sys

from loadgen.pluginbase import install_once

__all__ = ["ClientTLS", "default", "configure", "from_env", "server_context", "install"]


class ClientTLS:
    """How a client speaks TLS: ``wrap(sock, host)`` -> a connected ``ssl.SSLSocket``
    (handshake done, within the socket's timeout)."""

    def __init__(self, ca=None, insecure=False, server_name=None, cert=None, key=None):
        try:
            if insecure:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                ctx = ssl.create_default_context(cafile=ca)
            if cert or key:
                if not (cert and key):
                    raise ValueError("a client certificate needs both --tls-client-cert and "
                                     "--tls-client-key")
                ctx.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            what = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
            raise ValueError(f"TLS: cannot load {ca or cert}: {what}") from None
        self.context = ctx
        self.server_name = server_name
        self.ca, self.insecure = ca, insecure

    def wrap(self, sock, host):
        return self.context.wrap_socket(sock, server_hostname=self.server_name or host)


def _flag(text):
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def from_env(env=None):
    """The ClientTLS the FRAMETAP_TLS* variables ask for, or None (ValueError, one line)."""
    env = os.environ if env is None else env
    ca = env.get("FRAMETAP_TLS_CA") or None
    cert = env.get("FRAMETAP_TLS_CLIENT_CERT") or None
    key = env.get("FRAMETAP_TLS_CLIENT_KEY") or None
    name = env.get("FRAMETAP_TLS_SERVER_NAME") or None
    insecure = _flag(env.get("FRAMETAP_TLS_INSECURE"))
    if not (_flag(env.get("FRAMETAP_TLS")) or ca or cert or key or name or insecure):
        return None
    return ClientTLS(ca, insecure, name, cert, key)


_UNSET = object()
_default = _UNSET


def default():
    """The process's client TLS (the options or FRAMETAP_TLS*), or None for plain TCP."""
    global _default
    if _default is _UNSET:
        _default = from_env()
    return _default


def configure(tls):
    """Set the process's client TLS (a ClientTLS, or None for plain TCP)."""
    global _default
    _default = tls


def server_context(cert, key):
    """A reference server's SSLContext (ValueError, one line, for a bad file)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        what = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: cannot load them: {what}") \
            from None
    return ctx


# ---- the Locust plugin (loadgen.plugins.install) -------------------------------------------

def add_arguments(parser) -> None:
    group = parser.add_argument_group(
        "frametap TLS (the users' connections; see loadgen/tlsopts.py)")
    group.add_argument("--tls", action="store_true", default=False,
                       help="speak TLS to the host (also FRAMETAP_TLS=1)")
    group.add_argument("--tls-ca", metavar="FILE", default=None,
                       help="CA bundle (PEM) that signs the server's certificate "
                            "(default: the system's trust store)")
    group.add_argument("--tls-insecure", action="store_true", default=False,
                       help="do not verify the server's certificate")
    group.add_argument("--tls-server-name", metavar="NAME", default=None,
                       help="name to verify the certificate against and send as SNI "
                            "(default: the host connected to)")
    group.add_argument("--tls-client-cert", metavar="FILE", default=None,
                       help="client certificate (PEM), with --tls-client-key")
    group.add_argument("--tls-client-key", metavar="FILE", default=None,
                       help="the client certificate's key (PEM)")


class _Plugin:
    LISTENERS = {"init": "on_init"}

    def on_init(self, environment, **_kwargs) -> None:
        opts = environment.parsed_options
        if opts is None:
            return
        ca, cert = getattr(opts, "tls_ca", None), getattr(opts, "tls_client_cert", None)
        key, name = getattr(opts, "tls_client_key", None), getattr(opts, "tls_server_name", None)
        insecure = getattr(opts, "tls_insecure", False)
        if not (getattr(opts, "tls", False) or ca or cert or key or name or insecure):
            return                      # FRAMETAP_TLS* (default()) still apply
        try:
            configure(ClientTLS(ca, insecure, name, cert, key))
        except ValueError as exc:
            sys.stderr.write(f"locust: {exc}\n")
            sys.exit(2)


def install(events=None) -> None:
    install_once(_Plugin, add_arguments, events)
