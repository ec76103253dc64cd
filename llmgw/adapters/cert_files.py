"""A certificate file's expiry, for `llmgw doctor`: read with cryptography, errors said in a sentence."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509


def not_after(path: Path) -> tuple[float | None, str | None]:
    """(Unix time the first certificate in the PEM file stops being valid, None) or (None, why it cannot be read)."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"{path}: not a PEM certificate ({exc})"
    return cert.not_valid_after_utc.timestamp(), None
