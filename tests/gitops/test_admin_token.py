"""A malformed admin token is a clear error naming where it came from, before any request is made.

Without the check, a line break inside the token reached urllib and crashed with `ValueError: Invalid header
value b'Bearer ...'` (the token in the traceback); a non-UTF-8 file crashed with UnicodeDecodeError.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli import admin_client
from llmgw.cli.admin_client import AdminError, resolve_token
from llmgw.cli.main import app

SECRET = "s3cret-part"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (f"{SECRET}\nsecond-line\n".encode(), "has a line break inside the token"),
        (f"{SECRET}\r\nmore".encode(), "has a line break inside the token"),
        (b"", "is empty"),
        (b" \n\n", "is empty"),
        (f"{SECRET}\tx".encode(), "U+0009"),
        (f"{SECRET}\u00e9".encode(), "U+00E9"),
        (b"\xff\xfe" + SECRET.encode(), "is not UTF-8 text"),
    ],
)
def test_a_bad_token_file_names_the_file_and_the_fault(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "admin-token"
    path.write_bytes(content)
    with pytest.raises(AdminError) as caught:
        resolve_token(path, {}, [])
    message = str(caught.value)
    assert f"--token-file {path}" in message and says in message
    assert SECRET not in message


def test_the_generated_token_files_and_the_environment_are_checked_too(tmp_path: Path) -> None:
    generated = tmp_path / "admin-token"
    generated.write_text(f"{SECRET}\nleftover\n")
    with pytest.raises(AdminError, match=r"the controller.s token file .* line break"):
        resolve_token(None, {}, [generated])
    with pytest.raises(AdminError, match=r"\$LLMGW_TOKEN has a line break"):
        resolve_token(None, {admin_client.TOKEN_ENV: f"{SECRET}\nx"}, [])
    # A trailing newline (as editors and `echo` leave) is not part of the token.
    generated.write_text(f"{SECRET}\n")
    assert resolve_token(None, {}, [generated]).value == SECRET


def test_the_cli_reports_it_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"{SECRET}\nsecond-line\n")
    # Port 9 on loopback: nothing listens, but the token is refused before any connection is tried.
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        app, ["status", "--controller", "http://127.0.0.1:9", "--token-file", str(path)]
    )
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "line break inside the token" in result.output and str(path) in result.output
    assert SECRET not in result.output and "Traceback" not in result.output
