"""A small client for the controller's admin API (`/api/v1/...`), for `llmgw plan`, `apply` and friends.

Synchronous (urllib): a CLI makes a handful of requests, one at a time, and needs no event loop.

Where the admin token comes from, first found wins:
1. `--token-file FILE`;
2. the environment variable `LLMGW_TOKEN`;
3. the file the controller generates when it is given no `--admin-token-file`: `<state_dir>/admin-token`, with
   the controller's default state dir `.llmgw/controller` (relative to where it was started). Looked for under
   the working directory, then under the cluster repo's directory, so against a controller started by
   `llmgw up` (or `llmgw controller` with its defaults) from either place, no flag is needed.

The token is never printed: error messages say where it came from, not what it is.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.fleet import LiveState

TOKEN_ENV = "LLMGW_TOKEN"
CONTROLLER_ENV = "LLMGW_CONTROLLER"
# Must match llmgw.controller.settings.ControllerSettings.state_dir's default and the file name
# llmgw.controller.core.admin_token_from generates: a test checks they agree.
DEFAULT_STATE_DIR = Path(".llmgw") / "controller"
TOKEN_FILE_NAME = "admin-token"


class AdminError(Exception):
    """Talking to the controller failed; the message says what happened and what to try."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class Token:
    value: str
    source: str  # where it came from, for messages (never the value)

    def __repr__(self) -> str:  # keep the value out of tracebacks and logs
        return f"Token(source={self.source!r})"


def default_token_files(repo: Path | None, cwd: Path) -> list[Path]:
    """Where `llmgw up` / `llmgw controller` leave the admin token they generate, in the order looked at."""
    places = [cwd / DEFAULT_STATE_DIR / TOKEN_FILE_NAME]
    if repo is not None:
        base = repo.parent if repo.is_file() else repo
        places.append(base / DEFAULT_STATE_DIR / TOKEN_FILE_NAME)
    out: list[Path] = []
    for p in places:
        resolved = p.resolve()
        if resolved not in out:
            out.append(resolved)
    return out


def resolve_token(token_file: Path | None, env: Mapping[str, str], candidates: Sequence[Path]) -> Token:
    """The admin token (see the module doc for the order); AdminError saying every place looked."""
    if token_file is not None:
        return Token(_read_token(token_file, "--token-file"), f"--token-file {token_file}")
    if env.get(TOKEN_ENV, "").strip():
        return Token(_checked(env[TOKEN_ENV].strip(), f"${TOKEN_ENV}"), f"${TOKEN_ENV}")
    for path in candidates:
        if path.is_file():
            return Token(_read_token(path, "the controller's token file"), str(path))
    looked = ", ".join(str(p) for p in candidates)
    raise AdminError(
        f"no admin token: give --token-file FILE or set {TOKEN_ENV} "
        f"(looked for the token a local controller generates in: {looked})"
    )


def _read_token(path: Path, what: str) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AdminError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise AdminError(
            f"{what} {path} is not UTF-8 text (byte {exc.start}): it should hold the token on one line"
        ) from None
    if not value:
        raise AdminError(f"{what} {path} is empty: it should hold the token on one line")
    return _checked(value, f"{what} {path}")


def _checked(value: str, where: str) -> str:
    """The token as it goes into the Authorization header, which takes one line of printable ASCII (a bad
    one would fail deep in urllib with a ValueError that shows the token)."""
    if "\n" in value or "\r" in value:
        raise AdminError(
            f"{where} has a line break inside the token: a token is one line (in a file, a trailing newline "
            "is fine)"
        )
    bad = next((i for i, c in enumerate(value) if not " " <= c <= "~"), None)
    if bad is not None:
        raise AdminError(
            f"{where}: character {bad + 1} of the token is U+{ord(value[bad]):04X}, which cannot go in an "
            "HTTP header: a token is printable ASCII"
        )
    return value


def controller_url(address: str) -> str:
    """`host:port` (as a Cluster document declares it) -> `http://host:port`; a URL is kept as it is."""
    address = address.strip().rstrip("/")
    if "://" in address:
        return address
    return f"http://{address}"


class AdminClient:
    """GET/POST JSON against one controller with the admin token."""

    def __init__(self, url: str, token: Token, timeout_s: float = 30.0) -> None:
        self.url = controller_url(url)
        self.token = token
        self.timeout_s = timeout_s

    def get(self, path: str) -> Any:
        status, body = self._request("GET", path, None)
        if status != 200:
            raise self._failed("GET", path, status, body)
        return body

    def post(self, path: str, payload: Any, ok: Sequence[int] = (200,)) -> tuple[int, Any]:
        """POST JSON; the status and body for every status in `ok`, AdminError for others."""
        status, body = self._request("POST", path, payload)
        if status not in ok:
            raise self._failed("POST", path, status, body)
        return status, body

    def state(self) -> LiveState:
        return LiveState.model_validate(self.get("/api/v1/state"))

    def status(self) -> dict[str, Any]:
        body = self.get("/api/v1/status")
        if not isinstance(body, dict):
            raise AdminError(f"{self.url}/api/v1/status: expected a JSON object")
        return body

    def explain(self, model: str) -> dict[str, Any] | None:
        """Why a model is where it is; None when the controller does not know it (404)."""
        status, body = self._request("GET", f"/api/v1/explain/{model}", None)
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise self._failed("GET", f"/api/v1/explain/{model}", status, body)
        return body

    def _failed(self, method: str, path: str, status: int, body: Any) -> AdminError:
        if status == 401:
            return AdminError(
                f"the controller at {self.url} refused the admin token from {self.token.source}; "
                f"give the right one with --token-file or {TOKEN_ENV}",
                status,
                body,
            )
        message = _message(body)
        return AdminError(f"{method} {self.url}{path}: HTTP {status}: {message}", status, body)

    def _request(self, method: str, path: str, payload: Any) -> tuple[int, Any]:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token.value}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        context = ssl.create_default_context() if self.url.startswith("https://") else None
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, _json(exc.read())
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(
                f"cannot reach the controller at {self.url}: {reason}; is it running? "
                f"(--controller URL, or {CONTROLLER_ENV}; default: the Cluster document's controller.address)"
            ) from exc


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"error": {"message": raw.decode(errors="replace")[:300]}}


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body))
    return str(body)[:300]


def environ() -> Mapping[str, str]:
    """The process environment, read at the edge (commands pass it down)."""
    return os.environ
