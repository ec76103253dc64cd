"""A request for pictures as a ComfyUI workflow: the request read (OpenAI's images API), the workflow chosen and
its placeholders filled, the pictures found in ComfyUI's history. Pure; the talking is upstream/comfyui.py's.

A workflow is ComfyUI's API format: `{node_id: {"class_type": ..., "inputs": {...}}}`. A string input that is
exactly one placeholder (`"{{width}}"`) becomes the value itself (a number stays a number); one that holds a
placeholder among other text has it written in. The placeholders: prompt, width, height, seed, n.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from llmgw_router.server.errors import ApiError

__all__ = [
    "BUILTIN",
    "ImageRequest",
    "fill",
    "history_images",
    "image_request",
    "parse_workflow",
]

_MAX_SIDE = 4096
_MAX_N = 8
_SEED_LIMIT = 2**53  # ComfyUI's KSampler takes 0 ... 0xffffffffffffffff; JSON numbers stay exact below 2**53
_PLACEHOLDER = re.compile(r"\{\{(prompt|width|height|seed|n)\}\}")


@dataclass(frozen=True, slots=True)
class ImageRequest:
    """What the client asked for, read and checked."""

    prompt: str
    width: int
    height: int
    n: int
    seed: int | None  # None: the router draws one


def image_request(body: dict[str, Any]) -> ImageRequest:
    """OpenAI's `/v1/images/generations` body, checked: a 400 names the field and what would be right."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(
            400,
            "`prompt` must be a non-empty string describing the picture.",
            "invalid_prompt",
            param="prompt",
        )
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= _MAX_N:
        raise ApiError(
            400, f"`n` must be a whole number from 1 to {_MAX_N}; it is {n!r}.", "invalid_n", param="n"
        )
    width, height = _size(body.get("size"))
    fmt = body.get("response_format")
    if fmt not in (None, "b64_json"):
        raise ApiError(
            400,
            f"`response_format` {fmt!r} is not served: pictures come back inline; ask for `b64_json` (or leave it out).",
            "unsupported_response_format",
            param="response_format",
        )
    seed = body.get("seed")
    if seed is not None and (
        not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < _SEED_LIMIT
    ):
        raise ApiError(
            400,
            f"`seed` must be a whole number from 0 to 2**53-1; it is {seed!r}.",
            "invalid_seed",
            param="seed",
        )
    return ImageRequest(prompt, width, height, n, seed)


def _size(size: Any) -> tuple[int, int]:
    if size is None or size == "auto":
        return 1024, 1024
    match = re.fullmatch(r"(\d{2,4})x(\d{2,4})", size) if isinstance(size, str) else None
    if match is None or not all(16 <= int(v) <= _MAX_SIDE and int(v) % 8 == 0 for v in match.groups()):
        raise ApiError(
            400,
            f"`size` must be WIDTHxHEIGHT, each a multiple of 8 from 16 to {_MAX_SIDE} (e.g. 1024x1024); it is {size!r}.",
            "invalid_size",
            param="size",
        )
    return int(match[1]), int(match[2])


def fill(workflow: dict[str, Any], request: ImageRequest, seed: int) -> dict[str, Any]:
    """A copy of `workflow` with its placeholders filled for this request."""
    values: dict[str, str | int] = {
        "prompt": request.prompt,
        "width": request.width,
        "height": request.height,
        "seed": seed,
        "n": request.n,
    }

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str):
            whole = _PLACEHOLDER.fullmatch(node)
            if whole is not None:
                return values[whole[1]]
            return _PLACEHOLDER.sub(lambda m: str(values[m[1]]), node)
        return node

    filled: dict[str, Any] = walk(workflow)
    return filled


def parse_workflow(text: str, where: str) -> dict[str, Any]:
    """A workflow file's JSON in ComfyUI's API format, or ValueError saying what is wrong and where."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(
            f"{where}: a workflow in API format is an object of nodes {{id: {{class_type, inputs}}}}"
        )
    for node_id, node in data.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            raise ValueError(
                f"{where}: node {node_id!r} has no class_type; export the workflow with ComfyUI's "
                "'Save (API Format)', not the UI format"
            )
    if "{{prompt}}" not in text:
        raise ValueError(f"{where}: no {{{{prompt}}}} placeholder: every request would make the same picture")
    return data


def history_images(history: Any, prompt_id: str) -> list[dict[str, str]]:
    """The pictures ComfyUI's `/history/{prompt_id}` lists among its outputs (filename, subfolder, type), in
    node order; `temp` previews are left out (only what a save node wrote)."""
    entry = history.get(prompt_id) if isinstance(history, dict) else None
    outputs = entry.get("outputs") if isinstance(entry, dict) else None
    if not isinstance(outputs, dict):
        return []
    found: list[dict[str, str]] = []
    for output in outputs.values():
        images = output.get("images") if isinstance(output, dict) else None
        for image in images if isinstance(images, list) else []:
            if (
                isinstance(image, dict)
                and isinstance(image.get("filename"), str)
                and image.get("type") != "temp"
            ):
                found.append(
                    {
                        "filename": image["filename"],
                        "subfolder": str(image.get("subfolder", "")),
                        "type": str(image.get("type", "output")),
                    }
                )
    return found


def _flux(checkpoint: str, steps: int, guidance: float | None) -> dict[str, Any]:
    """Flux from one checkpoint file holding model, text encoders and VAE (the fp8 files ComfyUI's examples use)."""
    positive: list[Any] = ["2", 0]
    nodes: dict[str, Any] = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoint}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "4": {
            "class_type": "EmptySD3LatentImage",
            "inputs": {"width": "{{width}}", "height": "{{height}}", "batch_size": "{{n}}"},
        },
    }
    if guidance is not None:
        nodes["8"] = {
            "class_type": "FluxGuidance",
            "inputs": {"conditioning": ["2", 0], "guidance": guidance},
        }
        positive = ["8", 0]
    nodes["5"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": ["1", 0],
            "positive": positive,
            "negative": ["3", 0],
            "latent_image": ["4", 0],
            "seed": "{{seed}}",
            "steps": steps,
            "cfg": 1.0,
            "sampler_name": "euler",
            "scheduler": "simple",
            "denoise": 1.0,
        },
    }
    nodes["6"] = {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}}
    nodes["7"] = {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "llmgw"}}
    return nodes


# The built-ins: the checkpoints ComfyUI's Flux examples name, in its models/checkpoints folder.
BUILTIN: dict[str, dict[str, Any]] = {
    "flux-schnell": _flux("flux1-schnell-fp8.safetensors", 4, None),
    "flux-dev": _flux("flux1-dev-fp8.safetensors", 20, 3.5),
}
