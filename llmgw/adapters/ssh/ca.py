"""The cluster's certificate authority: mutual TLS between agents and the controller.

Layout of the CA directory (in the controller's state dir, created once, never overwritten):

    ca.key, ca.crt            the authority (key 0600)
    controller.key/.crt       the controller's server certificate (SANs: its addresses)
    nodes/NAME.key/.crt       each node's client certificate (CN = node name), kept so a second bootstrap
                              copies the same bytes and changes nothing
    revoked.json              serials revoked, with the node they named

Python's ssl module loads a CRL once, when the context is built, and cannot be told about a revocation made
while the controller runs. So the TLS handshake checks only the chain (CERT_REQUIRED against ca.crt) and the
controller calls `ClusterCA.check_peer(der)` right after the handshake, before it answers the agent: that reads
revoked.json (re-read when its mtime changes) and refuses a revoked serial or a revoked node name.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.core.errors import LlmgwError

CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=397)
# A leaf this close to expiry is reissued by the next bootstrap (or controller start).
RENEW_BEFORE = dt.timedelta(days=30)
CONTROLLER_NAME = "llmgw-controller"
# A router's certificate names `router:NAME`: a colon is never in a node name, so no node certificate can be
# taken for a router's (which opens the router stream and its engine keys), nor the other way round.
ROUTER_PREFIX = "router:"


class CAError(LlmgwError):
    """The CA directory cannot be used as it is (missing, unreadable, inconsistent)."""


class PeerRejected(LlmgwError):
    """An agent's certificate passed the TLS chain check but must not be accepted."""


@dataclass(frozen=True)
class IssuedCert:
    """A certificate and its key, PEM-encoded, with where they are kept."""

    name: str
    cert_pem: bytes
    key_pem: bytes
    serial: int
    cert_path: Path
    key_path: Path


@dataclass(frozen=True)
class PeerIdentity:
    """Who an accepted agent is: the node named in its certificate."""

    node: str
    serial: int


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    """Write a secret file created 0600 from the start (never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _write_public(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def split_host(address: str) -> str:
    """The host part of `host:port`, `[v6]:port`, or a bare host."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    if address.count(":") == 1:
        return address.rsplit(":", 1)[0]
    return address


def _san_entry(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _san_hosts(cert: x509.Certificate) -> set[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    hosts = {str(ip) for ip in ext.get_values_for_type(x509.IPAddress)}
    hosts.update(ext.get_values_for_type(x509.DNSName))
    return hosts


def cert_common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    return value if isinstance(value, str) else value.decode()


class ClusterCA:
    """The authority kept in one directory. Create with `ClusterCA.open(directory)`."""

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.directory = directory
        self._key = key
        self._cert = cert
        self._revoked_cache: tuple[float, dict[int, str]] | None = None

    # ------------------------------------------------------------------ authority

    @classmethod
    def open(cls, directory: Path, *, create: bool = True, cluster_name: str = "llmgw") -> ClusterCA:
        """Load the authority in `directory`, creating it the first time (never overwriting one)."""
        key_path, cert_path = directory / "ca.key", directory / "ca.crt"
        if key_path.exists() and cert_path.exists():
            try:
                key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
                cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            except (OSError, ValueError) as exc:
                raise CAError(f"cannot read the cluster CA in {directory}: {exc}") from exc
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise CAError(f"{key_path} is not an EC key; the cluster CA uses P-256")
            return cls(directory, key, cert)
        if key_path.exists() or cert_path.exists():
            raise CAError(
                f"{directory} holds only one of ca.key and ca.crt; restore the other or move both away"
            )
        if not create:
            raise CAError(f"no cluster CA in {directory} (the controller creates it on its first start)")
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster_name} cluster CA")])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write_private(key_path, _key_pem(key))
        _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        return cls(directory, key, cert)

    @property
    def cert_path(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    # ------------------------------------------------------------------ issuing

    def _sign_leaf(
        self, common_name: str, key: ec.EllipticCurvePrivateKey, *, server_hosts: Sequence[str] | None
    ) -> x509.Certificate:
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + LEAF_VALIDITY, self._cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        if server_hosts is not None:
            # The controller's certificate serves agents and also lets it act as a client (a standby
            # talking to the leader), as the earlier implementation found it needed.
            usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            sans = [_san_entry(h) for h in server_hosts]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        else:
            usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        return builder.sign(self._key, hashes.SHA256())

    def _load_leaf(self, cert_path: Path, key_path: Path) -> tuple[x509.Certificate, bytes] | None:
        """A kept certificate still worth using: issued by this CA, not revoked, not near expiry."""
        if not (cert_path.exists() and key_path.exists()):
            return None
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key_pem = key_path.read_bytes()
        except (OSError, ValueError):
            return None
        if cert.issuer != self._cert.subject:
            return None
        try:
            cert.verify_directly_issued_by(self._cert)
        except (ValueError, TypeError, InvalidSignature):
            return None
        if cert.not_valid_after_utc - _now() < RENEW_BEFORE or cert.serial_number in self.revoked():
            return None
        return cert, key_pem

    def _issue(
        self, name: str, cert_path: Path, key_path: Path, server_hosts: Sequence[str] | None
    ) -> IssuedCert:
        kept = self._load_leaf(cert_path, key_path)
        if kept is not None:
            cert, key_pem = kept
            if server_hosts is None or set(server_hosts) <= _san_hosts(cert):
                return IssuedCert(
                    name,
                    cert.public_bytes(serialization.Encoding.PEM),
                    key_pem,
                    cert.serial_number,
                    cert_path,
                    key_path,
                )
            # Reissue with the old names kept, so agents that dial an older address still verify it.
            server_hosts = sorted(set(server_hosts) | _san_hosts(cert))
        key = _new_key()
        cert = self._sign_leaf(name, key, server_hosts=server_hosts)
        key_pem, cert_pem = _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)
        _write_private(key_path, key_pem)
        _write_public(cert_path, cert_pem)
        return IssuedCert(name, cert_pem, key_pem, cert.serial_number, cert_path, key_path)

    def controller_cert(self, addresses: Iterable[str]) -> IssuedCert:
        """The controller's server certificate covering every address agents dial (`host:port` or host).

        Kept and returned unchanged while it covers them; reissued (old names kept) when one is new."""
        hosts = sorted({split_host(a) for a in addresses} | {"127.0.0.1", "localhost"})
        d = self.directory
        return self._issue(CONTROLLER_NAME, d / "controller.crt", d / "controller.key", hosts)

    def node_cert(self, node: str) -> IssuedCert:
        """The client certificate of `node` (CN = node name), issued once and reused until near expiry."""
        if node == CONTROLLER_NAME or "/" in node or node.startswith("."):
            raise CAError(f"cannot issue a node certificate named {node!r}")
        d = self.directory / "nodes"
        return self._issue(node, d / f"{node}.crt", d / f"{node}.key", None)

    def router_cert(self, name: str) -> IssuedCert:
        """The client certificate of router `name` (CN = `router:NAME`): the role `/router/v1` asks for."""
        if not name or "/" in name or name.startswith(".") or ":" in name:
            raise CAError(f"cannot issue a router certificate named {name!r}")
        d = self.directory / "routers"
        return self._issue(ROUTER_PREFIX + name, d / f"{name}.crt", d / f"{name}.key", None)

    # ------------------------------------------------------------------ revocation

    @property
    def revoked_path(self) -> Path:
        return self.directory / "revoked.json"

    def revoked(self) -> dict[int, str]:
        """Revoked serials and the node each named. Re-read when the file changed, so edits apply live."""
        try:
            mtime = self.revoked_path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        if self._revoked_cache is not None and self._revoked_cache[0] == mtime:
            return self._revoked_cache[1]
        try:
            raw = json.loads(self.revoked_path.read_text())
            entries = {int(item["serial"]): str(item["node"]) for item in raw["revoked"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Failing closed: an unreadable list must not let revoked agents back in.
            raise CAError(f"cannot read {self.revoked_path}: {exc}") from exc
        self._revoked_cache = (mtime, entries)
        return entries

    def revoke(self, node: str) -> list[int]:
        """Revoke every certificate kept for `node` and forget its key. Returns serials newly revoked."""
        entries = dict(self.revoked())
        newly: list[int] = []
        cert_path = self.directory / "nodes" / f"{node}.crt"
        if cert_path.exists():
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            if cert.serial_number not in entries:
                entries[cert.serial_number] = node
                newly.append(cert.serial_number)
        if newly:
            doc = {"revoked": [{"serial": str(s), "node": n} for s, n in sorted(entries.items())]}
            _write_public(self.revoked_path, json.dumps(doc, indent=2).encode() + b"\n")
            self._revoked_cache = None
        for path in (cert_path, cert_path.with_suffix(".key")):
            path.unlink(missing_ok=True)
        return newly

    def check_peer(self, der: bytes | None) -> PeerIdentity:
        """Decide on an agent's certificate after the TLS handshake verified its chain.

        `der` is `ssl_object.getpeercert(binary_form=True)`. Raises PeerRejected with the reason to log
        (and to send the agent as Refused)."""
        if not der:
            raise PeerRejected("no client certificate presented")
        cert = x509.load_der_x509_certificate(der)
        node = cert_common_name(cert)
        if cert.issuer != self._cert.subject:
            raise PeerRejected(f"certificate for {node!r} is not from this cluster's CA")
        if cert.serial_number in self.revoked():
            raise PeerRejected(f"certificate for node {node!r} (serial {cert.serial_number:x}) is revoked")
        if not node or node == CONTROLLER_NAME or node.startswith(ROUTER_PREFIX):
            raise PeerRejected(f"certificate names {node!r}, not a node")
        return PeerIdentity(node=node, serial=cert.serial_number)

    def check_router(self, der: bytes | None) -> str:
        """The router a client certificate names (its role checked, not revoked), or PeerRejected."""
        if not der:
            raise PeerRejected("no client certificate presented (the router stream needs a router's)")
        cert = x509.load_der_x509_certificate(der)
        name = cert_common_name(cert)
        if cert.issuer != self._cert.subject:
            raise PeerRejected(f"certificate for {name!r} is not from this cluster's CA")
        if not name.startswith(ROUTER_PREFIX):
            raise PeerRejected(f"certificate names {name!r}, not a router (a router's names router:NAME)")
        if cert.serial_number in self.revoked():
            raise PeerRejected(f"certificate for {name!r} (serial {cert.serial_number:x}) is revoked")
        return name.removeprefix(ROUTER_PREFIX)

    # ------------------------------------------------------------------ TLS contexts

    def server_context(self, addresses: Iterable[str]) -> ssl.SSLContext:
        """The controller's agent-hub context: its certificate, client certificates required."""
        issued = self.controller_cert(addresses)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.cert_path))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(str(issued.cert_path), str(issued.key_path))
        return ctx


def client_context(cert_file: Path, key_file: Path, ca_file: Path) -> ssl.SSLContext:
    """An agent's (or a test's) context for dialing the controller: the cluster CA, its own cert."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx
