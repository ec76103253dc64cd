"""Speech requests: OpenAI's `/v1/audio/transcriptions` and `/v1/audio/translations` take a multipart form
(`file`, `model`, `language`, `prompt`, `response_format`, `temperature`, ...), not JSON. Read here, pure: the
form's parts, the text fields the request path decides on (the model above all), the form written again with
the model named as the engine knows it, and a WAV file's length in seconds (what a request is billed by when the
engine reports none).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from llmgw_router.server.errors import ApiError

__all__ = ["AUDIO_KINDS", "FormPart", "audio_form", "encode_form", "form_parts", "wav_seconds"]

AUDIO_KINDS = frozenset({"transcriptions", "translations"})
_TEXT_LIMIT = 64 * 1024  # a text field longer than this is no field of these APIs


@dataclass(frozen=True, slots=True)
class FormPart:
    name: str
    data: bytes
    filename: str | None = None  # set: a file
    content_type: str | None = None


def form_parts(raw: bytes, content_type: str | None) -> list[FormPart]:
    """The parts of a `multipart/form-data` body, in order; a 400 saying what was expected otherwise."""
    if (
        not content_type
        or not content_type.lower().startswith("multipart/form-data")
        or "boundary=" not in content_type
    ):
        raise ApiError(
            400,
            "This endpoint takes a multipart/form-data body (a `file` and the `model` field, as OpenAI's clients "
            f"send it); the request's Content-Type is {content_type or 'missing'}.",
            "invalid_content_type",
        )
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + raw
    )
    if not message.is_multipart():
        raise ApiError(
            400, "The multipart/form-data body could not be read: check its boundary.", "invalid_form"
        )
    parts: list[FormPart] = []
    for part in message.iter_parts():
        assert isinstance(part, Message)
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise ApiError(
                400, "A part of the form has no `name` in its Content-Disposition.", "invalid_form"
            )
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        ctype = part.get_content_type() if part.get("content-type") else None
        parts.append(FormPart(name, data, filename, ctype))
    return parts


def audio_form(parts: list[FormPart]) -> dict[str, Any]:
    """The form's text fields as the request path reads a body (`model`, `prompt`, `language`, ...); a 400
    when the audio `file` is missing or a field is not text."""
    if not any(p.name == "file" and p.filename is not None and p.data for p in parts):
        raise ApiError(
            400,
            "The form needs a `file` part holding the audio (wav, mp3, flac, ...).",
            "missing_file",
            param="file",
        )
    fields: dict[str, Any] = {}
    for p in parts:
        if p.filename is not None:
            continue
        if len(p.data) > _TEXT_LIMIT:
            raise ApiError(
                400,
                f"The form field `{p.name}` is longer than {_TEXT_LIMIT} bytes.",
                "invalid_form",
                param=p.name,
            )
        try:
            fields[p.name] = p.data.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(
                400, f"The form field `{p.name}` is not UTF-8 text.", "invalid_form", param=p.name
            ) from None
    return fields


def encode_form(parts: list[FormPart], model: str) -> tuple[bytes, str]:
    """The form written again with `model` as the engine knows it: the body and its Content-Type."""
    boundary = uuid.uuid4().hex
    out: list[bytes] = []
    for p in parts:
        data = model.encode() if p.name == "model" and p.filename is None else p.data
        disposition = f'form-data; name="{_quoted(p.name)}"'
        if p.filename is not None:
            disposition += f'; filename="{_quoted(p.filename)}"'
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if p.content_type is not None:
            head += f"Content-Type: {p.content_type}\r\n"
        out.append(head.encode() + b"\r\n" + data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def wav_seconds(parts: list[FormPart]) -> float | None:
    """The audio file's length when it is a PCM WAV (RIFF header, `fmt ` and `data` chunks); None otherwise:
    unknown, not zero."""
    audio = next((p.data for p in parts if p.name == "file" and p.filename is not None), b"")
    if len(audio) < 12 or audio[:4] != b"RIFF" or audio[8:12] != b"WAVE":
        return None
    at, byte_rate = 12, 0
    while at + 8 <= len(audio):
        kind, size = audio[at : at + 4], struct.unpack("<I", audio[at + 4 : at + 8])[0]
        if kind == b"fmt " and size >= 16:
            byte_rate = struct.unpack("<I", audio[at + 16 : at + 20])[0]
        elif kind == b"data":
            return min(size, len(audio) - at - 8) / byte_rate if byte_rate else None
        at += 8 + size + (size & 1)
    return None
