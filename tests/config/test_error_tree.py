"""One exception tree: every exception class llmgw and llmgw_router define derives from LlmgwError."""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from pathlib import Path
from types import ModuleType

import llmgw_router
import pytest
from llmgw_router.upstream.proxy import UpstreamUnavailable

import llmgw
from llmgw.adapters.sources import SourceUnavailable
from llmgw.controller.parts.desired import build_desired
from llmgw.core.errors import ConfigInvalidError, LlmgwError, Outage, TransientError, retry_after
from llmgw.store import StoreError, StoreUnavailable


def _modules(package: ModuleType) -> list[ModuleType]:
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith(".__main__"):  # running it would start the process
            found.append(importlib.import_module(info.name))
    return found


def _exception_classes() -> list[type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for module in _modules(llmgw) + _modules(llmgw_router):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return sorted(classes.values(), key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_every_exception_class_derives_from_llmgw_error() -> None:
    classes = _exception_classes()
    # The walk must see the tree's known members, or it proves nothing.
    names = {c.__qualname__ for c in classes}
    assert {"StoreError", "AgentError", "SourceUnavailable", "SecretError", "ApiError", "SpoolError"} <= names
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, LlmgwError)]
    assert outside == [], f"derive these from llmgw.core.errors.LlmgwError (or TransientError): {outside}"


@pytest.mark.parametrize("cls", [StoreUnavailable, SourceUnavailable, UpstreamUnavailable])
def test_retryable_errors_are_transient_and_carry_a_delay(cls: type[TransientError]) -> None:
    assert issubclass(cls, TransientError)
    error = cls("down")
    assert hasattr(error, "delay") and str(error) == "down"


def test_store_unavailable_is_still_a_store_error() -> None:
    assert issubclass(StoreUnavailable, StoreError)


def test_upstream_unavailable_retries_elsewhere_at_once() -> None:
    assert UpstreamUnavailable("connect failed").delay == 0.0


def test_an_invalid_repo_raises_config_invalid_error_with_every_line(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Model\nmetadata: {name: a}\nspec: {bogus: 1}\n"
    )
    with pytest.raises(ConfigInvalidError) as caught:
        build_desired(tmp_path, "rev", "test")
    assert caught.value.errors and all(str(tmp_path) not in line for line in caught.value.errors)
    assert any("m.yaml:" in line for line in caught.value.errors)


async def test_a_source_that_cannot_be_read_says_when_it_is_tried_again(tmp_path: Path) -> None:
    from llmgw.adapters.sources import DirectorySource

    with pytest.raises(SourceUnavailable, match="not a directory") as caught:
        await DirectorySource(tmp_path / "missing", interval_s=2.5).poll()
    assert caught.value.delay == 2.5


def test_a_loop_waits_the_raisers_delay_within_its_own_bound() -> None:
    assert retry_after(TransientError("down", delay=3.0), default=1.0, most=10.0) == 3.0
    assert retry_after(TransientError("down", delay=60.0), default=1.0, most=10.0) == 10.0
    assert retry_after(TransientError("down", delay=0.0), default=1.0, most=10.0) == 0.0
    # No delay said, or not a transient error at all: the loop's own schedule.
    assert retry_after(TransientError("down"), default=1.0, most=10.0) == 1.0
    assert retry_after(RuntimeError("bug"), default=1.0, most=10.0) == 1.0


def test_an_outage_is_said_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(logging.getLogger("llmgw.test.outage"), "the test loop")
    with caplog.at_level(logging.INFO, logger="llmgw.test.outage"):
        for _ in range(3):
            outage.failed(TransientError("store down"), retry_in=2.0)
        assert outage.down and outage.failures == 3
        outage.recovered()
        outage.recovered()  # nothing was failing: nothing to say
        outage.failed(RuntimeError("a bug"), retry_in=2.0)
    said = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said == [
        ("WARNING", "the test loop failed, retrying in 2.0s until it works: store down", False),
        ("INFO", "the test loop works again (after 3 failed attempt(s))", False),
        ("ERROR", "the test loop failed, retrying in 2.0s until it works", True),
    ]
