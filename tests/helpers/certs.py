"""Test certificates made with the openssl command: a CA, a server certificate for 127.0.0.1, a client one
(`make_certs`), and an expired client certificate (`expired_client`). Two days of validity: throwaway."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(d: Path) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
                 "-out", str(d / f"{name}.csr"))
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
                 str(d / "ca.key"), "-CAcreateserial", "-days", "2", "-out", str(d / f"{name}.crt"), "-extfile",
                 str(d / f"{name}.ext"))
        (d / f"{name}.key").chmod(0o600)
    return {k: str(d / k) for k in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def expired_client(d: Path) -> str:
    """A client certificate of `d`'s CA (made by `make_certs(d)`) that expired a day ago."""
    _openssl("x509", "-req", "-in", str(d / "client.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "-1", "-out", str(d / "expired.crt"), "-extfile", str(d / "client.ext"))
    return str(d / "expired.crt")


def client_cert(d: Path, name: str) -> tuple[str, str]:
    """One more client certificate of `d`'s CA (made by `make_certs(d)`): a member's own (cert, key)."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
             "-out", str(d / f"{name}.csr"))
    _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "2", "-out", str(d / f"{name}.crt"), "-extfile", str(d / "client.ext"))
    (d / f"{name}.key").chmod(0o600)
    return str(d / f"{name}.crt"), str(d / f"{name}.key")
