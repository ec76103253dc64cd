"""The cluster CA: issue, verify over a real TLS handshake on loopback, revoke while running."""

from __future__ import annotations

import asyncio
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from llmgw.adapters.ssh.ca import CAError, ClusterCA, PeerIdentity, PeerRejected, client_context


def test_created_once_and_reopened(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "ca")
    again = ClusterCA.open(tmp_path / "ca")
    assert again.cert_pem == ca.cert_pem
    assert stat.S_IMODE((tmp_path / "ca" / "ca.key").stat().st_mode) == 0o600


def test_half_a_ca_is_refused(tmp_path: Path) -> None:
    ClusterCA.open(tmp_path / "ca")
    (tmp_path / "ca" / "ca.key").unlink()
    with pytest.raises(CAError, match="only one of"):
        ClusterCA.open(tmp_path / "ca")


def test_node_cert_is_kept_and_names_the_node(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path)
    first = ca.node_cert("gpu-1")
    second = ca.node_cert("gpu-1")
    assert (first.serial, first.cert_pem, first.key_pem) == (second.serial, second.cert_pem, second.key_pem)
    cert = x509.load_pem_x509_certificate(first.cert_pem)
    assert cert.subject.rfc4514_string() == "CN=gpu-1"
    assert stat.S_IMODE(first.key_path.stat().st_mode) == 0o600


def test_controller_cert_reissued_with_old_names_kept(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path)
    first = ca.controller_cert(["10.0.0.1:7070"])
    assert ca.controller_cert(["10.0.0.1:7070"]).serial == first.serial
    second = ca.controller_cert(["ctl.example:7070"])
    assert second.serial != first.serial
    san = x509.load_pem_x509_certificate(second.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    names = {str(v) for v in san.value.get_values_for_type(x509.IPAddress)}
    names |= set(san.value.get_values_for_type(x509.DNSName))
    assert {"10.0.0.1", "ctl.example", "127.0.0.1"} <= names


async def _handshake(ca: ClusterCA, client: ssl.SSLContext) -> PeerIdentity:
    """A real TLS server on loopback with the controller's context; returns what check_peer decided."""
    decided: asyncio.Future[PeerIdentity] = asyncio.get_running_loop().create_future()

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        try:
            decided.set_result(ca.check_peer(der))
        except PeerRejected as exc:
            decided.set_exception(exc)
        writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0, ssl=ca.server_context(["127.0.0.1:0"]))
    port = server.sockets[0].getsockname()[1]
    async with server:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        try:
            return await asyncio.wait_for(decided, 10)
        finally:
            writer.close()


async def test_mutual_tls_accepts_a_node_then_refuses_it_once_revoked(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path)
    issued = ca.node_cert("cpu-1")
    client = client_context(issued.cert_path, issued.key_path, ca.cert_path)
    peer = await _handshake(ca, client)
    assert peer.node == "cpu-1" and peer.serial == issued.serial

    # Revoked while the server's context stays the same: the check after the handshake sees it.
    assert ca.revoke("cpu-1") == [issued.serial]
    assert not issued.key_path.exists()
    with pytest.raises(PeerRejected, match="revoked"):
        await _handshake(ca, client)
    # A second revoke has nothing left to do.
    assert ca.revoke("cpu-1") == []
    # Another controller process reading the same directory sees the revocation too.
    with pytest.raises(PeerRejected, match="revoked"):
        der = x509.load_pem_x509_certificate(issued.cert_pem).public_bytes(Encoding.DER)
        ClusterCA.open(tmp_path).check_peer(der)


async def test_certificate_from_another_ca_fails_the_handshake(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "ours")
    other = ClusterCA.open(tmp_path / "theirs")
    issued = other.node_cert("intruder")
    client = client_context(issued.cert_path, issued.key_path, ca.cert_path)
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.TimeoutError)):
        await asyncio.wait_for(_handshake(ca, client), 5)


def test_check_peer_without_certificate(tmp_path: Path) -> None:
    with pytest.raises(PeerRejected, match="no client certificate"):
        ClusterCA.open(tmp_path).check_peer(None)
