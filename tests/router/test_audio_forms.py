"""Speech requests' multipart forms, pure: read, checked, written again with the engine's model name, and a WAV
file's length (what a request is billed by when the engine reports none)."""

from __future__ import annotations

import asyncio
import io
import wave

import aiohttp
import pytest
from llmgw_router.decisions.media.forms import FormPart, audio_form, encode_form, form_parts, wav_seconds
from llmgw_router.decisions.rules import size
from llmgw_router.server.errors import ApiError

from llmgw.core.snapshot import PublishedModel


def wav(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * int(rate * seconds))
    return out.getvalue()


def client_form(audio: bytes) -> tuple[bytes, str]:
    """The body and Content-Type an HTTP client writes (aiohttp's own multipart writer)."""
    form = aiohttp.FormData({"model": "whisper", "language": "de", "prompt": "Grüße"})
    form.add_field("file", audio, filename='a "b".wav', content_type="audio/wav")
    payload = form()
    out = bytearray()

    class Sink:
        async def write(self, data: bytes) -> None:
            out.extend(data)

    asyncio.run(payload.write(Sink()))  # type: ignore[arg-type]
    return bytes(out), str(payload.content_type)


def test_a_form_is_read_and_written_again_with_the_engines_model_name() -> None:
    audio = wav(1.5)
    raw, content_type = client_form(audio)
    parts = form_parts(raw, content_type)
    assert audio_form(parts) == {"model": "whisper", "language": "de", "prompt": "Grüße"}
    (file,) = [p for p in parts if p.filename is not None]
    assert (file.name, file.data, file.content_type) == ("file", audio, "audio/wav")
    sent, sent_type = encode_form(parts, "whisper-large-v3")
    again = form_parts(sent, sent_type)
    assert audio_form(again)["model"] == "whisper-large-v3"
    assert [(p.name, p.data, p.content_type) for p in again if p.filename is not None] == [
        ("file", audio, "audio/wav")
    ]
    assert wav_seconds(again) == pytest.approx(1.5)


def test_the_prompt_of_a_form_is_its_text_not_its_audio() -> None:
    model = PublishedModel.model_validate({"context_length": 448, "capabilities": ["transcriptions"]})
    sizing = size(5_000_000, {"model": "w", "prompt": "x" * 40}, "transcriptions", model)
    assert sizing.prompt_estimate == 11  # 40 bytes / 4, plus 10%: a 5 MB file does not overflow 448 tokens


@pytest.mark.parametrize(
    ("content_type", "raw", "code"),
    [
        ("application/json", b'{"model": "w"}', "invalid_content_type"),
        (None, b"", "invalid_content_type"),
        (
            "multipart/form-data; boundary=zz",
            b"--zz\r\nContent-Disposition: form-data; name=model\r\n\r\nw\r\n--zz--\r\n",
            "missing_file",
        ),
    ],
)
def test_a_bad_form_is_a_400_saying_what_was_expected(
    content_type: str | None, raw: bytes, code: str
) -> None:
    with pytest.raises(ApiError) as refused:
        audio_form(form_parts(raw, content_type))
    assert refused.value.status == 400 and refused.value.code == code


def test_the_length_of_audio_that_is_not_a_wav_is_unknown() -> None:
    assert wav_seconds([FormPart("file", b"ID3\x04mp3 frames", "a.mp3")]) is None
    assert wav_seconds([FormPart("file", wav(0.25, 16000), "a.wav")]) == pytest.approx(0.25)
    assert wav_seconds([]) is None
