"""The session's one deployment of the real vLLM (tests/vllm_real/fleet.py) and the models it serves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures.vllm_models import TinyLlama, tiny_llama  # noqa: F401  (registers it)

from .fleet import Fleet, start_fleet


@pytest.fixture(scope="session")
def vllm_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_llama: TinyLlama,  # noqa: F811
    vllm_python: str,
) -> Iterator[Fleet]:
    fleet = start_fleet(tmp_path_factory.mktemp("vllm-fleet"), tiny_llama, vllm_python)
    try:
        yield fleet
    finally:
        fleet.stop()
