"""L9 and issue 15 item 5: what CI and nodes install is what the operator meant.

* The example workflow and pre-commit hook never install `llmgw` by bare name from an index (a name this
  project does not hold there); they install from a hash-checked requirements file the operator names, and
  fail clearly without one. The pull-request job reads that file from the base branch, not from the PR.
* Tokens sit only in the steps that talk to the controller, the PR job's being the read-only plan token.
* Dependency floors are above releases with published advisories.
* Agent wheels for nodes are pinned to what the controller runs and re-checked against their sha256.

The install steps are run for real (bash, git) with a `pip` on PATH that records how it was called.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from support import worker_cache

from llmgw.adapters.ssh import wheels

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cluster-repo"
WORKFLOW = EXAMPLE / ".github" / "workflows" / "llmgw.yml"
PRE_COMMIT = EXAMPLE / ".pre-commit-config.yaml"
PYPROJECTS = [ROOT / "pyproject.toml", ROOT / "agent" / "pyproject.toml", ROOT / "router" / "pyproject.toml"]
# The first release without the advisories named in the security review (L9), and later ones we know of.
FLOORS = {"aiohttp": (3, 14, 3), "gitpython": (3, 1, 57), "jinja2": (3, 1, 6)}
# CVE-2025-53643; CVE-2024-22190; CVE-2024-56326 (jinja2's sandbox escape; 3.1.6 for CVE-2025-27516, H9)
REVIEW_FLOORS = {"aiohttp": (3, 12, 14), "gitpython": (3, 1, 41), "jinja2": (3, 1, 5)}


def _workflow() -> Any:
    return YAML(typ="safe").load(WORKFLOW.read_text())


def _install_step(job: str) -> dict[str, Any]:
    (step,) = [s for s in _workflow()["jobs"][job]["steps"] if "pip install" in s.get("run", "")]
    return dict(step)


def _fake_pip(tmp: Path) -> tuple[Path, Path]:
    """A `pip` that records its arguments and the requirements file it was given."""
    bindir, record = tmp / "bin", tmp / "pip-calls.json"
    bindir.mkdir()
    pip = bindir / "pip"
    pip.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys, pathlib\n"
        "args = sys.argv[1:]\n"
        "req = args[args.index('-r') + 1] if '-r' in args else None\n"
        "body = pathlib.Path(req).read_text() if req else None\n"
        f"pathlib.Path({str(record)!r}).write_text(json.dumps({{'args': args, 'requirements': body}}))\n"
    )
    pip.chmod(pip.stat().st_mode | stat.S_IXUSR)
    return bindir, record


def _run_step(step: dict[str, Any], cwd: Path, bindir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    variables = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HOME": str(cwd), **env}
    return subprocess.run(
        ["bash", "-e", "-c", step["run"]], cwd=cwd, env=variables, capture_output=True, text=True, timeout=60
    )


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_l9_workflow_and_hook_never_install_llmgw_by_bare_name() -> None:
    for path in (WORKFLOW, PRE_COMMIT):
        text = path.read_text()
        assert "LLMGW_PIP_SPEC" not in text and "|| 'llmgw'" not in text, path
        for line in text.splitlines():
            if "pip install" not in line:
                continue
            words = line.split("pip install", 1)[1].split()
            assert "llmgw" not in words, f"{path}: {line.strip()}"
            if "pre-commit" not in words:
                assert "--require-hashes" in words and "-r" in words, f"{path}: {line.strip()}"


def test_l9_install_without_requirements_is_a_clear_error(tmp_path: Path) -> None:
    bindir, record = _fake_pip(tmp_path)
    step = _install_step("apply")
    done = _run_step(step, tmp_path, bindir, LLMGW_REQUIREMENTS=".llmgw/requirements.txt")
    assert done.returncode == 1
    assert "no .llmgw/requirements.txt" in done.stdout and "never installed by bare name" in done.stdout
    assert not record.exists(), "pip ran without a requirements file"


def test_l9_install_uses_the_named_requirements_with_hashes(tmp_path: Path) -> None:
    bindir, record = _fake_pip(tmp_path)
    (tmp_path / ".llmgw").mkdir()
    (tmp_path / ".llmgw" / "requirements.txt").write_text("llmgw==0.1.0 --hash=sha256:" + "0" * 64 + "\n")
    done = _run_step(_install_step("apply"), tmp_path, bindir, LLMGW_REQUIREMENTS=".llmgw/requirements.txt")
    assert done.returncode == 0, done.stderr
    call = json.loads(record.read_text())
    assert call["args"][:3] == ["install", "--require-hashes", "--no-deps"]
    assert call["requirements"].startswith("llmgw==0.1.0 --hash=sha256:")


def test_l9_pull_request_job_installs_from_the_base_branch_not_the_pr(tmp_path: Path) -> None:
    """A PR that rewrites the requirements to a package of its choosing still gets main's."""
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    _git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(origin))
    _git(tmp_path, "clone", "--quiet", str(origin), str(work))
    for key, value in (("user.name", "t"), ("user.email", "t@example.invalid")):
        _git(work, "config", key, value)
    (work / ".llmgw").mkdir()
    reqs = work / ".llmgw" / "requirements.txt"
    reqs.write_text("llmgw==0.1.0 --hash=sha256:" + "1" * 64 + "\n")
    _git(work, "add", "-A")
    _git(work, "commit", "--quiet", "-m", "pinned")
    _git(work, "push", "--quiet", "origin", "main")
    _git(work, "checkout", "--quiet", "-b", "pr")
    reqs.write_text("evil-llmgw==6.6.6 --hash=sha256:" + "6" * 64 + "\n")
    _git(work, "commit", "--quiet", "-am", "mine")
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    bindir, record = _fake_pip(tmp_path)
    done = _run_step(
        _install_step("pr"),
        work,
        bindir,
        LLMGW_REQUIREMENTS=".llmgw/requirements.txt",
        GITHUB_BASE_REF="main",
        RUNNER_TEMP=str(runner_temp),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    call = json.loads(record.read_text())
    assert "--require-hashes" in call["args"]
    assert call["requirements"].startswith("llmgw==0.1.0") and "evil" not in call["requirements"]


def test_l9_each_job_gets_only_its_token_and_only_where_it_is_used() -> None:
    jobs = _workflow()["jobs"]
    for name, job in jobs.items():
        assert "LLMGW_TOKEN" not in (job.get("env") or {}), f"job {name}: the token is in every step's env"
        for step in job["steps"]:
            env = step.get("env") or {}
            if "pip install" in step.get("run", ""):
                assert not [k for k in env if "TOKEN" in k], f"{name}: a token while installing"
    tokens = {
        name: {str(s["env"]["LLMGW_TOKEN"]) for s in job["steps"] if "LLMGW_TOKEN" in (s.get("env") or {})}
        for name, job in jobs.items()
    }
    assert tokens["pr"] == {"${{ secrets.LLMGW_PLAN_TOKEN }}"}
    assert tokens["apply"] == {"${{ secrets.LLMGW_APPLY_TOKEN }}"}
    assert "LLMGW_APPLY_TOKEN" not in json.dumps(jobs["pr"])
    assert "github.event_name == 'push'" in jobs["apply"]["if"]


def _floor(spec: str) -> tuple[int, ...] | None:
    match = re.search(r">=\s*([0-9][0-9.]*)", spec)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_l9_dependency_floors_are_above_the_advisories() -> None:
    seen: dict[str, int] = {}
    for path in PYPROJECTS:
        for spec in tomllib.loads(path.read_text())["project"]["dependencies"]:
            name = re.split(r"[<>=\[; ]", spec, maxsplit=1)[0].lower()
            if name not in FLOORS:
                continue
            floor = _floor(spec)
            assert floor is not None and floor >= FLOORS[name] > REVIEW_FLOORS[name], f"{path}: {spec}"
            seen[name] = seen.get(name, 0) + 1
    assert seen == {"aiohttp": 3, "gitpython": 1, "jinja2": 2}
    # The floors are met by what this environment runs, so they are not wishes.
    for name, floor in FLOORS.items():
        assert _version(metadata.version(name)) >= floor


def _house(tmp: Path) -> Path:
    directory = tmp / "house"
    directory.mkdir()
    files = {
        "llmgw_agent-0.1.0-py3-none-any.whl": b"agent wheel",
        "aiohttp-3.14.5-cp311-cp311-manylinux_x86_64.whl": b"aiohttp wheel",
    }
    for name, body in files.items():
        (directory / name).write_bytes(body)
    manifest = {
        "wheels": {name: wheels.sha256_file(directory / name) for name in files},
        "agent_wheel": "llmgw_agent-0.1.0-py3-none-any.whl",
        "agent_version": "0.1.0",
        "source_digest": "x",
    }
    (directory / wheels.MANIFEST).write_text(json.dumps(manifest))
    return directory


def test_l9_agent_wheels_are_checked_against_their_recorded_sha256(tmp_path: Path) -> None:
    directory = _house(tmp_path)
    assert wheels.load(directory).agent_version == "0.1.0"
    target = directory / "aiohttp-3.14.5-cp311-cp311-manylinux_x86_64.whl"
    target.write_bytes(b"a wheel someone swapped after the build")
    with pytest.raises(wheels.WheelhouseError, match=r"no longer match.*not shipping it to nodes"):
        wheels.load(directory)


def test_l9_agent_wheels_are_pinned_to_what_the_controller_runs() -> None:
    pins = wheels.installed_pins()
    assert pins["aiohttp"] == metadata.version("aiohttp")
    assert pins["pydantic"] == metadata.version("pydantic")
    assert "llmgw-agent" not in pins and "llmgw" not in pins
    stale = {"aiohttp-3.9.0-cp311-cp311-manylinux_x86_64.whl": "0" * 64}
    assert wheels._pin_problems(stale, pins) == [
        f"aiohttp-3.9.0-cp311-cp311-manylinux_x86_64.whl (the controller runs aiohttp {pins['aiohttp']})"
    ]
    text = wheels.requirements_text({"aiohttp-3.14.5-cp311-cp311-manylinux_x86_64.whl": "ab" * 32})
    assert text == f"aiohttp==3.14.5 --hash=sha256:{'ab' * 32}\n"


def test_l9_a_real_wheelhouse_is_pinned_and_lists_its_hashes() -> None:
    """pip wheel for real (the same cache as tests/nodes, so built once per worker): every dependency wheel is the
    version installed here, and requirements.txt carries each wheel's sha256."""
    house = wheels.build(worker_cache("test-wheelhouse"))
    pins = wheels.installed_pins()
    for file_name in house.wheels:
        name, version = file_name.split("-")[:2]
        if not name.startswith("llmgw"):
            assert pins[wheels.canonical(name)] == version, file_name
    lines = (house.directory / wheels.REQUIREMENTS).read_text().splitlines()
    assert len(lines) == len(house.wheels)
    for file_name, sha in house.wheels.items():
        assert f"--hash=sha256:{sha}" in "\n".join(lines), file_name
