"""TLS termination for hosts that get credentials: a per-session CA, leaf certificates on demand.

The CA is made when the proxy is made; its private key exists only in this process's memory (it
is never serialized). Its certificate carries a name constraint listing exactly the credential
hosts, so even a sandbox that trusts it cannot be shown a certificate for any other name by it.
Leaf keys are handed to OpenSSL through an anonymous memory file (``memfd``): ``ssl`` loads
certificates only from paths, and this keeps them off every filesystem.

Upstream TLS is verified against the system store plus ``egress_ca_file``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable
from pathlib import Path

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - the import error is raised when a CA is needed
    x509 = None  # type: ignore[assignment]

_LEAF_DAYS = 30
_CA_DAYS = 365


class InterceptUnavailable(RuntimeError):
    """Credentials for HTTPS hosts need the ``cryptography`` package."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _load_chain(context: ssl.SSLContext, pem: bytes) -> None:
    fd = os.memfd_create("toolseam-egress-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


class SessionCA:
    """A CA for one proxy's life, constrained to ``hosts``; leaf contexts cached per host."""

    def __init__(self, hosts: Iterable[str], name: str = "toolseam egress session CA") -> None:
        if x509 is None:
            raise InterceptUnavailable(
                "egress_credentials need the cryptography package (the per-session CA): "
                "pip install 'cryptography>=42'")
        self.hosts = sorted(set(hosts))
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        permitted: list[x509.GeneralName] = [x509.DNSName(host) for host in self.hosts]
        now = _now()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.NameConstraints(permitted_subtrees=permitted or None,
                                                excluded_subtrees=None if permitted else
                                                [x509.DNSName("invalid")]), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self._contexts: dict[str, ssl.SSLContext] = {}

    def ca_pem(self) -> str:
        """The session CA certificate (PEM) — what the sandbox must trust. Never the key."""
        return self._cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side context presenting a leaf for ``host`` signed by this CA (cached)."""
        context = self._contexts.get(host)
        if context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            _load_chain(context, self._leaf_pem(host))
            self._contexts[host] = context
        return context

    def _leaf_pem(self, host: str) -> bytes:
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cert.public_bytes(serialization.Encoding.PEM) + self._cert.public_bytes(
            serialization.Encoding.PEM) + key_pem


def upstream_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verifies upstream servers against the system store plus ``ca_file``."""
    context = ssl.create_default_context()  # loads the system store
    if ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
    context.set_alpn_protocols(["http/1.1"])
    return context


def ca_bundle(session_ca_pem: str, roots: Iterable[str] = ()) -> str:
    """A bundle for the sandbox: the given roots (the image's own, PEM texts) then the session CA."""
    parts = [root.strip() + "\n" for root in roots if root.strip()]
    parts.append(session_ca_pem.strip() + "\n")
    return "".join(parts)
