"""Pictures, pure parts: OpenAI's images request read and checked, workflows filled, pictures found in
ComfyUI's history, and the repo's `provider.api: comfyui` models checked and published."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llmgw_router.decisions.media.images import (
    BUILTIN,
    ImageRequest,
    fill,
    history_images,
    image_request,
    parse_workflow,
)
from llmgw_router.server.errors import ApiError

from llmgw.controller.wire.publisher import published_models
from llmgw.core.config.models import BUILTIN_WORKFLOWS
from llmgw.core.desired.repo import validate_files


def test_a_request_reads_size_count_and_seed_with_defaults() -> None:
    assert image_request({"prompt": "a fox"}) == ImageRequest("a fox", 1024, 1024, 1, None)
    asked = image_request(
        {"prompt": "a fox", "size": "512x768", "n": 3, "seed": 5, "response_format": "b64_json"}
    )
    assert asked == ImageRequest("a fox", 512, 768, 3, 5)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({}, "prompt", "non-empty string"),
        ({"prompt": "  "}, "prompt", "non-empty string"),
        ({"prompt": "x", "n": 0}, "n", "from 1 to 8"),
        ({"prompt": "x", "n": True}, "n", "from 1 to 8"),
        ({"prompt": "x", "size": "1024"}, "size", "WIDTHxHEIGHT"),
        ({"prompt": "x", "size": "1020x1024"}, "size", "multiple of 8"),
        ({"prompt": "x", "size": "8192x8192"}, "size", "from 16 to 4096"),
        ({"prompt": "x", "response_format": "url"}, "response_format", "b64_json"),
        ({"prompt": "x", "seed": -1}, "seed", "0 to 2**53-1"),
        ({"prompt": "x", "seed": "7"}, "seed", "whole number"),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(body: dict[str, Any], param: str, says: str) -> None:
    with pytest.raises(ApiError) as refused:
        image_request(body)
    assert refused.value.status == 400 and refused.value.param == param and says in str(refused.value)


def test_fill_puts_numbers_as_numbers_and_text_as_text_without_touching_the_original() -> None:
    workflow = {
        "1": {
            "class_type": "A",
            "inputs": {"w": "{{width}}", "t": "{{prompt}} at {{height}}", "s": "{{seed}}"},
        },
        "2": {"class_type": "B", "inputs": {"n": "{{n}}", "link": ["1", 0], "keep": "{{other}}", "k": 3}},
    }
    before = json.dumps(workflow)
    filled = fill(workflow, ImageRequest('say "{{width}}"', 64, 32, 2, None), 9)
    assert filled["1"]["inputs"] == {"w": 64, "t": 'say "{{width}}" at 32', "s": 9}
    assert filled["2"]["inputs"] == {"n": 2, "link": ["1", 0], "keep": "{{other}}", "k": 3}
    assert json.dumps(workflow) == before


def test_the_builtins_are_the_ones_the_config_names_and_take_every_placeholder() -> None:
    assert set(BUILTIN) == set(BUILTIN_WORKFLOWS)
    for workflow in BUILTIN.values():
        filled = json.dumps(fill(workflow, ImageRequest("p", 16, 24, 1, None), 1))
        assert "{{" not in filled and any(n["class_type"] == "SaveImage" for n in workflow.values())


def test_a_workflow_file_must_be_api_format_and_take_the_prompt() -> None:
    ok = parse_workflow(json.dumps({"1": {"class_type": "X", "inputs": {"text": "{{prompt}}"}}}), "/wf.json")
    assert ok["1"]["class_type"] == "X"
    for text, says in [
        ("{", "not JSON"),
        ("[]", "object of nodes"),
        (json.dumps({"nodes": [], "links": []}), "Save (API Format)"),
        (json.dumps({"1": {"class_type": "X", "inputs": {}}}), "no {{prompt}}"),
    ]:
        with pytest.raises(ValueError, match=r"^/wf\.json: ") as bad:
            parse_workflow(text, "/wf.json")
        assert says in str(bad.value)


def test_history_lists_saved_pictures_not_previews() -> None:
    history = {
        "pid": {
            "outputs": {
                "9": {"images": [{"filename": "a.png", "subfolder": "s", "type": "output"}]},
                "10": {"images": [{"filename": "p.png", "subfolder": "", "type": "temp"}]},
                "11": {"text": ["not a picture"]},
            }
        }
    }
    assert history_images(history, "pid") == [{"filename": "a.png", "subfolder": "s", "type": "output"}]
    assert history_images(history, "other") == [] and history_images({}, "pid") == []


def _repo(spec: str) -> Any:
    return validate_files(
        {"m.yaml": f"apiVersion: llmgw/v1\nkind: Model\nmetadata: {{name: flux}}\nspec: {spec}\n".encode()}
    )


def test_a_comfyui_model_is_published_with_its_api_and_workflow() -> None:
    result = _repo(
        "{context_length: 256, capabilities: [images], prices: {per_image: 0.02}, provider: "
        "{api: comfyui, url: 'http://gpu-1:8188', model: flux-dev, workflow: flux-dev}}"
    )
    assert result.repo is not None, [str(e) for e in result.errors]
    published = published_models(result.repo.catalog)["flux"]
    assert published.capabilities == ["images"] and published.prices.per_image == 0.02
    assert published.provider is not None
    assert (published.provider.api, published.provider.workflow) == ("comfyui", "flux-dev")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            "{context_length: 1, provider: {api: comfyui, url: 'http://h:8188', model: f}}",
            "capabilities: [images]",
        ),
        ("{context_length: 1, capabilities: [images], profiles: [{name: s, engine: sim}]}", "ComfyUI server"),
        (
            "{context_length: 1, provider: {url: 'https://x/v1', model: f, workflow: flux-dev}}",
            "api: comfyui",
        ),
        (
            "{context_length: 1, capabilities: [images], provider: {api: comfyui, url: 'http://h', model: f, "
            "workflow: wf.json}}",
            "absolute path",
        ),
    ],
)
def test_a_wrong_images_model_is_refused_saying_what_to_write(spec: str, says: str) -> None:
    result = _repo(spec)
    assert result.repo is None and any(says in str(e) for e in result.errors), [str(e) for e in result.errors]
