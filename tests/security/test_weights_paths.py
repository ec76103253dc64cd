"""C1: a weights URL decides the name of a file the agent writes, so it must not be able to name one outside the
weights cache. The name is decoded first, then checked; `llmgw validate` refuses it with file:line and the field
path, and the agent refuses it again (cache_path) before it writes anything."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from llmgw_agent import weights
from llmgw_agent.protocol import WeightSource

from .repo_attack import CPU_PROFILE, attack_repo, model, validate

PAYLOAD = b"* * * * * root touch /tmp/pwned\n"

# (test id, URL path after the host, words of the refusal)
ATTACKS = [
    ("encoded-slash", "/%2Fetc%2Fcron.d%2Fx", "the URL path holds an encoded slash (%2F)"),
    ("encoded-dotdot-slash", "/a/..%2F..%2F..%2Fetc%2Fx", "the decoded URL path holds a `.` or `..` segment"),
    ("encoded-dots", "/a/%2e%2e", "the decoded URL path holds a `.` or `..` segment"),
    ("nul", "/model.gguf%00.txt", "the decoded URL path holds a NUL or control character"),
    ("backslash", "/a%5C..%5Cx", "the decoded URL path holds a backslash"),
    ("leading-dot", "/x/.bashrc", "the file name '.bashrc' starts with a dot"),
]


@pytest.mark.parametrize(("path", "words"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS])
def test_c1_weights_url_naming_a_file_outside_the_cache_is_refused_by_validate(
    tmp_path: Path, path: str, words: str
) -> None:
    url = f"http://h{path}"
    repo = attack_repo(tmp_path, model(CPU_PROFILE, source=f'    url: "{url}"'))
    result = validate(repo)
    result.assert_refused("url", "spec.source.url", f"{url} is refused: {words}")


def test_c1_encoded_slash_in_weights_url_is_refused(tmp_path: Path) -> None:
    """The review's own example, as a user meets it: the plain `llmgw validate` line naming file, line,
    column and field."""
    url = "https://attacker.example/%2Fetc%2Fcron.d%2Fllmgw"
    repo = attack_repo(tmp_path, model(CPU_PROFILE, source=f'    url: "{url}"'))
    result = validate(repo)
    assert f"{repo}/models/attack.yaml:7:10: spec.source.url: {url} is refused" in result.out
    assert "invalid: 1 error(s)" in result.out


@pytest.mark.parametrize("path", [a[1] for a in ATTACKS], ids=[a[0] for a in ATTACKS])
def test_c1_agent_cache_path_refuses_a_name_that_is_not_one_plain_file(tmp_path: Path, path: str) -> None:
    with pytest.raises(weights.WeightsError, match="refused"):
        weights.cache_path(tmp_path / "cache", f"http://h{path}")


def test_plain_weights_names_still_land_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    url = "https://hf.example/org/m/resolve/main/model-q4.gguf?download=true"
    digest = hashlib.sha256(url.encode()).hexdigest()[:24]
    assert weights.cache_path(cache, url) == cache / digest / "model-q4.gguf"
    assert weights.cache_path(cache, "https://h/dir/").name == "weights"
    assert weights.cache_path(cache, "https://h/a%20b.gguf").name == "a b.gguf"  # decoded, still one name


class AnyPathServer:
    """Answers every GET with PAYLOAD, whatever the path: the attacker's server."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.base = ""
        self.requests: list[str] = []

    async def any_path(self, request: web.Request) -> web.Response:
        self.requests.append(request.raw_path)
        return web.Response(body=PAYLOAD)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.any_path)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture
async def attacker() -> AsyncIterator[AnyPathServer]:
    srv = AnyPathServer()
    await srv.start()
    yield srv
    assert srv.runner is not None
    await srv.runner.cleanup()


async def test_c1_agent_writes_nothing_outside_the_cache(attacker: AnyPathServer, tmp_path: Path) -> None:
    """A real fetch from a real server: the encoded path would have the agent write `victim` beside the cache
    (as root under systemd: /etc/cron.d). It is refused before any request or write."""
    cache = tmp_path / "cache"
    victim = tmp_path / "victim"
    escape = "..%2F" * 8 + str(victim).lstrip("/").replace("/", "%2F")
    url = f"{attacker.base}/a%2F{escape}"
    with pytest.raises(weights.WeightsError, match="refused"):
        await weights.resolve(WeightSource(url=url), cache, lambda d, t: None)
    assert not victim.exists() and not victim.with_name("victim.part").exists()
    assert attacker.requests == []  # refused before anything was fetched
    absolute = f"{attacker.base}/%2F" + str(victim).lstrip("/").replace("/", "%2F")
    with pytest.raises(weights.WeightsError, match="refused"):
        await weights.resolve(WeightSource(url=absolute), cache, lambda d, t: None)
    assert not victim.exists()


async def test_c1_node_file_checksum_error_reveals_neither_hash_nor_size(tmp_path: Path) -> None:
    """`source.path` with a wrong sha256/size_bytes must not tell the document's author the real hash or size of
    a file on the node (a probe of, say, /etc/shadow through shard status and events)."""
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$secret-hash:19000:0:99999:7:::\n")
    real_hash = hashlib.sha256(secret.read_bytes()).hexdigest()
    for source in (
        WeightSource(path=str(secret), sha256="0" * 64),
        WeightSource(path=str(secret), size=1),
    ):
        with pytest.raises(weights.WeightsError) as caught:
            await weights.resolve(source, tmp_path / "cache", lambda d, t: None)
        message = str(caught.value)
        assert "differs from" in message
        assert real_hash not in message and str(secret.stat().st_size) not in message
