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

Where it is sent: a token given by flag or environment goes only to a controller named by flag or
`LLMGW_CONTROLLER` (`choose_controller`), never to the address the cluster repo declares, which whoever
edits the repo (a pull request) chooses. `http://` to a host that is not loopback is said out loud.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.views import LiveState
from llmgw.core.security import is_loopback_host

AnswerT = TypeVar("AnswerT", bound=BaseModel)
TOKEN_ENV = "LLMGW_TOKEN"
CONTROLLER_ENV = "LLMGW_CONTROLLER"
# Must match llmgw.controller.parts.settings.ControllerOptions.state_dir's default and the file name
# llmgw.controller.core.admin_token_from generates: a test checks they agree.
DEFAULT_STATE_DIR = Path(".llmgw") / "controller"
TOKEN_FILE_NAME = "admin-token"
DEFAULT_CONTROLLER = "http://127.0.0.1:7070"


class AdminError(LlmgwError):
    """Talking to the controller failed; the message says what happened and what to try."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def read_answer(body: Any, model: type[AnswerT], where: str) -> AnswerT:
    """`body` (an answer from `where`) as `model`, the one the route table declares for it; AdminError if not."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise AdminError(
            f"{where} answered with something else than docs/admin-openapi.json says ({model.__name__}): "
            f"{exc}; is the controller another version than this CLI?"
        ) from None


@dataclass(frozen=True, slots=True)
class Token:
    value: str
    source: str  # where it came from, for messages (never the value)
    explicit: bool = True  # from --token-file or the environment; False: a local controller's own file

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
            return Token(_read_token(path, "the controller's token file"), str(path), explicit=False)
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


def url_host(url: str) -> str:
    """The host of `scheme://host:port/...` or `host:port` (IPv6 in brackets kept without them)."""
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    if rest.startswith("["):
        return rest[1 : rest.find("]")]
    return rest.rsplit(":", 1)[0] if rest.count(":") == 1 else rest


def controller_url(address: str) -> str:
    """`host:port` -> `http://host:port` for a loopback host; a URL is kept as it is. A bare host:port
    elsewhere is refused: whether the token may travel in plain text is the user's to say (https:// or
    http://), not a default's."""
    address = address.strip().rstrip("/")
    if "://" in address:
        return address
    if not is_loopback_host(url_host(address)):
        raise AdminError(
            f"controller address {address!r} has no scheme: write https://{address} (or http://{address} "
            "to send the admin token in plain text on purpose)"
        )
    return f"http://{address}"


def probe_status(url: str, token: str | None = None, tls: ssl.SSLContext | None = None) -> int | None:
    """The HTTP status a GET of `url` answers (a health or readiness probe), None when nothing answers."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=3, context=tls
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def plaintext_warning(url: str) -> str | None:
    """What to tell the user before an admin token goes over plain http to another machine."""
    if url.startswith("http://") and not is_loopback_host(url_host(url)):
        return (
            f"sending the admin token to {url} over plain http: anyone on the path can read it (use https://)"
        )
    return None


def choose_controller(explicit: str | None, declared: str | None, token: Token) -> str:
    """Where a command sends `token`: the controller named by flag or $LLMGW_CONTROLLER; the cluster repo's
    declared `controller.address` only for a local controller's own token file and a loopback address.

    The repo is what a pull request edits: a PR job with the token in its environment and no explicit
    controller would otherwise send the token wherever the PR's cluster.yaml says."""
    if explicit:
        return explicit
    if token.explicit:
        raise AdminError(
            f"the admin token from {token.source} is sent only to a controller named explicitly: give "
            f"--controller URL or set {CONTROLLER_ENV} (the cluster repo's controller.address is not used "
            "for it: whoever edits the repo, e.g. in a pull request, chooses that address)"
        )
    if declared and is_loopback_host(url_host(declared)):
        return declared
    raise AdminError(
        f"no controller named: give --controller URL or set {CONTROLLER_ENV} (the cluster repo's "
        f"controller.address {declared!r} is used only when it is on this machine)"
    )


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

    def get_as(self, path: str, model: type[AnswerT]) -> AnswerT:
        """GET, read as the model the controller's route table declares for it (llmgw.core.api.admin_api); an
        answer of another shape is an AdminError naming the path, not a KeyError further on."""
        return read_answer(self.get(path), model, self.url + path)

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

    def stream(self, path: str, idle_s: float = 60.0) -> Iterator[Any]:
        """GET a newline-delimited JSON stream, one object per line, until the controller ends it. `idle_s`:
        how long the stream may stay silent (the logs stream sends a cursor at least every 10 s)."""
        request = urllib.request.Request(self.url + path, method="GET")
        request.add_header("Authorization", f"Bearer {self.token.value}")
        request.add_header("Accept", "application/x-ndjson")
        context = ssl.create_default_context() if self.url.startswith("https://") else None
        try:
            response = urllib.request.urlopen(request, timeout=idle_s, context=context)
        except urllib.error.HTTPError as exc:
            with exc:
                raise self._failed("GET", path, exc.code, _json(exc.read())) from None
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            raise AdminError(
                f"cannot reach the controller at {self.url}: {getattr(exc, 'reason', exc)}"
            ) from exc
        with response:
            try:
                for raw in response:
                    if raw.strip():
                        yield _json(raw)
            except (TimeoutError, OSError) as exc:
                raise AdminError(f"the stream from {self.url} broke off: {exc}") from exc

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
                f"(--controller URL, or {CONTROLLER_ENV})"
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
