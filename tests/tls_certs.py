"""Certificates made by the tests (loadgen.tlscerts, the ``openssl`` program): a CA and a
``localhost``/``127.0.0.1`` certificate it signs, a second CA with its own certificate
(the "wrong CA"), an expired certificate of the first CA, and a client certificate.

Import the fixture with ``from tests.tls_certs import certs  # noqa: F401``. Without
``openssl`` the tests skip (``FRAMETAP_CI=1``: fail) with one line.
"""

import os
import ssl
import types

import pytest

from loadgen.tlscerts import CertError, have_openssl, issue, make_ca


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    if not have_openssl():
        msg = "the `openssl` program is not installed (apt-get install openssl)"
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    d = str(tmp_path_factory.mktemp("tls"))
    try:
        ca = make_ca(d, "ca")
        other_ca = make_ca(d, "other-ca", "another throwaway CA")
        server = issue(d, ca, "localhost")
        other = issue(d, other_ca, "other")
        expired = issue(d, ca, "expired", expired=True)
        client = issue(d, ca, "client", dns=("client",), ips=())
    except CertError as exc:
        pytest.fail(str(exc), pytrace=False)
    return types.SimpleNamespace(dir=d, ca=ca[0], ca_key=ca[1], cert=server[0], key=server[1],
                                 other_ca=other_ca[0], other_cert=other[0], other_key=other[1],
                                 expired_cert=expired[0], expired_key=expired[1],
                                 client_cert=client[0], client_key=client[1])


def server_context(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


def client_context(ca, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx
