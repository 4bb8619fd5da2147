"""Throwaway certificates for ``frametap demo --tls`` and the TLS tests, made with the
``openssl`` program (the ``cryptography`` package is not a dependency).

:func:`make_ca` makes a CA (EC P-256, valid 7 days); :func:`issue` a certificate signed by
it for ``localhost`` and ``127.0.0.1`` (server and client use), optionally one that
already expired (``openssl ca`` with explicit dates: ``x509 -req`` cannot back-date).
Nothing here is for production: the keys are unencrypted files.
"""

import os
import shutil
import subprocess

__all__ = ["CertError", "have_openssl", "make_ca", "issue", "throwaway"]


class CertError(RuntimeError):
    """openssl is missing or failed (the message has its last line)."""


def have_openssl():
    return shutil.which("openssl") is not None


def _run(args, cwd):
    exe = shutil.which("openssl")
    if exe is None:
        raise CertError("the `openssl` program is not on PATH (Debian: apt-get install openssl)")
    r = subprocess.run([exe] + args, cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        lines = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise CertError(f"openssl {args[0]} failed: {lines[-1] if lines else r.returncode}")


_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc"]


def make_ca(directory, name="ca", subject="frametap throwaway CA"):
    """``(cert, key)`` paths of a new self-signed CA in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    cert, key = (os.path.join(directory, f"{name}.{ext}") for ext in ("pem", "key"))
    _run(["req", "-x509", *_EC, "-keyout", key, "-out", cert, "-days", "7",
          "-subj", f"/CN={subject}", "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], directory)
    return cert, key


def issue(directory, ca, name, dns=("localhost",), ips=("127.0.0.1",), days=7,
          expired=False):
    """``(cert, key)`` of a certificate for ``dns`` names and ``ips`` signed by ``ca``
    (a ``(cert, key)`` pair); ``expired``: valid in 2020 only."""
    ca_cert, ca_key = ca
    cert, key, csr, ext = (os.path.join(directory, f"{name}.{e}")
                           for e in ("pem", "key", "csr", "ext"))
    _run(["req", *_EC, "-keyout", key, "-out", csr, "-subj", f"/CN={name}"], directory)
    san = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
    with open(ext, "w") as f:
        f.write("[ext]\n"
                + (f"subjectAltName = {san}\n" if san else "")
                + "basicConstraints = CA:FALSE\n"
                  "keyUsage = critical,digitalSignature\n"
                  "extendedKeyUsage = serverAuth,clientAuth\n"
                  "subjectKeyIdentifier = hash\n"
                  "authorityKeyIdentifier = keyid\n")
    if not expired:
        _run(["x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
              "-CAcreateserial", "-days", str(days), "-out", cert, "-extfile", ext,
              "-extensions", "ext"], directory)
        return cert, key
    db = os.path.join(directory, f"{name}.db")
    open(db, "w").close()
    serial = os.path.join(directory, f"{name}.serial")
    with open(serial, "w") as f:
        f.write("1000\n")
    cnf = os.path.join(directory, f"{name}.cnf")
    with open(cnf, "w") as f:
        f.write(f"[ca]\ndefault_ca = d\n[d]\ndatabase = {db}\nnew_certs_dir = {directory}\n"
                f"serial = {serial}\ndefault_md = sha256\npolicy = p\nunique_subject = no\n"
                "email_in_dn = no\n[p]\ncommonName = supplied\n")
    _run(["ca", "-batch", "-notext", "-config", cnf, "-cert", ca_cert, "-keyfile", ca_key,
          "-in", csr, "-out", cert, "-startdate", "20200101000000Z",
          "-enddate", "20200102000000Z", "-extfile", ext, "-extensions", "ext"], directory)
    return cert, key


def throwaway(directory):
    """A CA and a ``localhost``/``127.0.0.1`` certificate signed by it:
    ``{"ca": path, "cert": path, "key": path}`` (what ``frametap demo --tls`` uses)."""
    ca = make_ca(directory)
    cert, key = issue(directory, ca, "localhost")
    return {"ca": ca[0], "cert": cert, "key": key}
