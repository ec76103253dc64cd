"""An attack added to a copy of the example cluster repo, checked by `llmgw validate` run as a user runs it (the
CLI in a child process), and the position of a field in the attack file for the expected `file:line:col` line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cluster-repo"
ATTACK_FILE = "models/attack.yaml"


@dataclass(frozen=True)
class Validated:
    code: int
    out: str
    repo: Path

    def line_for(self, key: str) -> str:
        """The `file:line:col: ` prefix llmgw validate must print for `key` (e.g. `LD_PRELOAD`) in the attack
        file: its line, and the column where its value starts (after `key: `)."""
        text = (self.repo / ATTACK_FILE).read_text().splitlines()
        for number, line in enumerate(text, start=1):
            if f"{key}:" in line:
                col = line.index(f"{key}:") + len(key) + 3  # past `: `, 1-based
                return f"{self.repo / ATTACK_FILE}:{number}:{col}: "
        raise AssertionError(f"{key!r} is not a key of the attack file")

    def assert_refused(self, key: str, path: str, words: str) -> None:
        """Exit code 1 and the exact `file:line:col: path: message` line for `key`."""
        assert self.code == 1, self.out
        expected = f"{self.line_for(key)}{path}: {words}"
        assert any(line.startswith(expected) for line in self.out.splitlines()), (expected, self.out)


def attack_repo(tmp_path: Path, model_yaml: str, cluster_extra: str = "") -> Path:
    """A copy of examples/cluster-repo with `model_yaml` as models/attack.yaml (and `cluster_extra` appended to
    the Cluster's spec, indented already)."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo)
    (repo / ATTACK_FILE).write_text(model_yaml)
    if cluster_extra:
        cluster = repo / "cluster.yaml"
        cluster.write_text(cluster.read_text() + cluster_extra)
    return repo


def validate(repo: Path) -> Validated:
    """`llmgw validate REPO` in a child process, with this test run's import path."""
    proc = subprocess.run(
        [sys.executable, "-c", "from llmgw.cli.main import main; main()", "validate", str(repo)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )
    return Validated(proc.returncode, proc.stdout + proc.stderr, repo)


def model(profile: str, source: str = "    path: /models/attack.gguf", name: str = "attack") -> str:
    """A Model document with one profile (given as indented YAML lines under `profiles:`)."""
    return (
        "apiVersion: llmgw/v1\n"
        "kind: Model\n"
        "metadata:\n"
        f"  name: {name}\n"
        "spec:\n"
        "  source:\n"
        f"{source}\n"
        "  context_length: 2048\n"
        "  scaling: {min: 0, max: 0}\n"
        "  profiles:\n"
        f"{profile}"
    )


CPU_PROFILE = "    - name: cpu\n      engine: llamacpp\n"
GPU_PROFILE = "    - name: gpu\n      engine: vllm\n      gpu_class: h100-80g\n      gpus: 1\n"
