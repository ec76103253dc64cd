"""Steps of `llmgw server init` that need no system commands, run on a directory as the machine's root: the CA
taken from the operator (and a different one refused), the certificate kept while it covers the machine and
reissued with the old names when one is new, an existing store given by DSN and migrated. Each step run a second
time changes nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cryptography import x509

from llmgw.adapters.server.init import Init
from llmgw.adapters.server.machine import Machine, first_routable_ipv4
from llmgw.adapters.server.options import InitOptions
from llmgw.adapters.ssh.ca import ClusterCA
from llmgw.adapters.ssh.remote import StepFailed


def _init(
    root: Path, *, ca_from: Path | None = None, addresses: tuple[str, ...] = (), store: str | None = None
) -> Init:
    opts = InitOptions(bin_dir="/opt/llmgw/venv/bin", ca_from=ca_from, addresses=addresses, store=store)
    return Init(Machine(root), opts)


def _sans(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in ext.get_values_for_type(x509.IPAddress)} | set(
        ext.get_values_for_type(x509.DNSName)
    )


def test_an_existing_ca_is_taken_once_and_a_different_one_refused(tmp_path: Path) -> None:
    theirs = ClusterCA.open(tmp_path / "operator-ca")
    root = tmp_path / "root"
    run = _init(root, ca_from=theirs.directory)
    assert asyncio.run(run.ca(run.m))[0] == "changed"
    assert (root / "var/lib/llmgw/controller/ca/ca.crt").read_bytes() == theirs.cert_pem
    assert oct((root / "var/lib/llmgw/controller/ca/ca.key").stat().st_mode & 0o777) == "0o600"
    assert asyncio.run(run.ca(run.m)) == (
        "unchanged",
        f"the CA from {theirs.directory} in /var/lib/llmgw/controller/ca",
    )

    other = ClusterCA.open(tmp_path / "other-ca")
    refused = _init(root, ca_from=other.directory)
    with pytest.raises(StepFailed, match="a different cluster CA is already in /var/lib/llmgw/controller/ca"):
        asyncio.run(refused.ca(refused.m))


def test_certificate_kept_while_it_covers_the_machine_and_reissued_keeping_old_names(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run = _init(root, addresses=("gw.example.net",))
    asyncio.run(run.ca(run.m))
    status, detail = asyncio.run(run.certificates(run.m))
    assert status == "changed" and "gw.example.net" in detail
    served = root / "etc/llmgw/tls/server.crt"
    assert {"gw.example.net", "127.0.0.1", "localhost"} <= _sans(served)
    assert oct((root / "etc/llmgw/tls/server.key").stat().st_mode & 0o777) == "0o640"
    assert asyncio.run(run.certificates(run.m))[0] == "unchanged"

    again = _init(root, addresses=("gw.example.net", "10.9.8.7"))
    assert asyncio.run(again.certificates(again.m))[0] == "changed"
    assert {"gw.example.net", "10.9.8.7"} <= _sans(served)
    assert {"controller", "router"} <= again.dirty  # both serve it: both restart


@pytest.mark.postgres
def test_a_given_store_is_kept_and_migrated(tmp_path: Path, pg_dsn: str) -> None:
    run = _init(tmp_path / "root", store=pg_dsn)
    assert asyncio.run(run.services.store(run.m))[0] == "changed"
    assert (tmp_path / "root/etc/llmgw/secrets/store.dsn").read_text().strip() == pg_dsn
    status, detail = asyncio.run(run.services.migrations(run.m))
    assert status == "changed" and detail.startswith("schema version 0 -> ")
    assert asyncio.run(run.services.store(run.m))[0] == "unchanged"
    assert asyncio.run(run.services.migrations(run.m))[0] == "unchanged"


def test_the_address_others_dial_is_a_routable_ipv4_one() -> None:
    assert first_routable_ipv4(["0.0.0.0", "127.0.0.1", "2001:db8::1", "gw", "10.1.2.3"]) == "10.1.2.3"
    assert first_routable_ipv4(["::1", "localhost"]) == "127.0.0.1"
