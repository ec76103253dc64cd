"""Mutual TLS: the agent presents its client certificate and checks the controller's against the cluster CA."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from support import wait_for

from .fake_controller import FakeController
from .test_daemon import AgentProcs

pytestmark = pytest.mark.integration


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def issue(tmp: Path) -> dict[str, str]:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test-ca"))
        .issuer_name(_name("test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": str(tmp / "ca.pem")}
    Path(paths["ca"]).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who, usage in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name("node-a" if who == "client" else "controller"))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        if who == "server":
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        paths[f"{who}_cert"] = str(tmp / f"{who}.pem")
        paths[f"{who}_key"] = str(tmp / f"{who}.key")
        Path(paths[f"{who}_cert"]).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        Path(paths[f"{who}_key"]).write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return paths


async def test_agent_registers_over_mutual_tls(tmp_path: Path) -> None:
    certs = issue(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certs["ca"])
    server_ctx.load_cert_chain(certs["server_cert"], certs["server_key"])
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    ctl = FakeController()
    await ctl.start(ssl_context=server_ctx)
    agents = AgentProcs(tmp_path)
    try:
        tls = {"cert": certs["client_cert"], "key": certs["client_key"], "ca": certs["ca"]}
        agents.start([ctl.url], tls=tls)
        await wait_for(lambda: ctl.registers, limit_s=30, what="registration over TLS")
        subject = dict(x[0] for x in ctl.peer_certs[-1]["subject"])
        assert subject["commonName"] == "node-a"
    finally:
        agents.cleanup()
        await ctl.stop()
