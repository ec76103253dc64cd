"""The agent wheelhouse the controller carries to nodes that may have no internet.

`pip wheel ./agent` builds llmgw-agent and every wheel it depends on (aiohttp, pydantic and theirs) into one
directory; a node installs from it with `pip install --no-index --find-links`. The build is keyed by a digest of
the agent's source, so an unchanged agent reuses the same wheel files byte for byte — which is what lets a
second bootstrap see identical hashes and change nothing. Compiled wheels match the controller's Python and
architecture; `compatibility_problem` says so before a node is touched.

What nodes install is pinned and hash-checked, not whatever the index serves that day:
* `pip wheel` runs with a constraints file of every distribution installed beside the controller
  (`installed_pins`), so the agent's dependencies are the versions the controller itself runs and was tested
  with (above the advisory floors in pyproject.toml), and a build that resolves anything else is refused;
* the manifest records each wheel's sha256, `load` re-checks every file against it before a wheelhouse is
  used (a wheel changed on disk after the build is refused, never shipped), and `requirements.txt` beside
  the wheels lists each with its hash for `pip install --require-hashes --no-index`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llmgw.core.errors import LlmgwError

MANIFEST = "wheelhouse.json"
REQUIREMENTS = "requirements.txt"
CONSTRAINTS = "constraints.txt"
AGENT_DIST = "llmgw_agent"
# Never pinned from the controller's environment: the agent itself (built from source here), and llmgw's
# own distributions (an editable install's version says nothing about a wheel).
_NOT_PINNED = {"llmgw", "llmgw-agent", "llmgw-router"}


class WheelhouseError(LlmgwError):
    pass


@dataclass(frozen=True)
class Wheelhouse:
    directory: Path
    wheels: dict[str, str]  # file name -> sha256
    agent_wheel: str
    agent_version: str
    source_digest: str

    @property
    def digest(self) -> str:
        """One hash for the whole set: what a node records after installing it."""
        lines = "".join(f"{name} {sha}\n" for name, sha in sorted(self.wheels.items()))
        return hashlib.sha256(lines.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_agent_source() -> Path | None:
    """The agent's source tree (with pyproject.toml) when llmgw runs from a checkout or editable install."""
    import llmgw_agent

    root = Path(llmgw_agent.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").exists() else None


def source_digest(source: Path) -> str:
    digest = hashlib.sha256()
    files = [source / "pyproject.toml", *sorted((source / "llmgw_agent").rglob("*"))]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load(directory: Path) -> Wheelhouse:
    """The wheelhouse built earlier in `directory`. Raises WheelhouseError when there is none."""
    try:
        raw = json.loads((directory / MANIFEST).read_text())
        house = Wheelhouse(
            directory=directory,
            wheels={str(k): str(v) for k, v in raw["wheels"].items()},
            agent_wheel=str(raw["agent_wheel"]),
            agent_version=str(raw["agent_version"]),
            source_digest=str(raw["source_digest"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WheelhouseError(f"no usable agent wheelhouse in {directory}: {exc}") from exc
    missing = [name for name in house.wheels if not (directory / name).is_file()]
    if missing:
        raise WheelhouseError(f"agent wheelhouse {directory} lacks {', '.join(missing)}; rebuild it")
    changed = [name for name, sha in house.wheels.items() if sha256_file(directory / name) != sha]
    if changed:
        raise WheelhouseError(
            f"agent wheelhouse {directory}: {', '.join(changed)} no longer match(es) the sha256 recorded "
            f"in {MANIFEST} when it was built; not shipping it to nodes (delete the directory to rebuild)"
        )
    return house


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_pins() -> dict[str, str]:
    """name -> version of every distribution installed beside this llmgw (what `pip freeze` would say)."""
    from importlib import metadata

    pins: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) not in _NOT_PINNED:
            pins.setdefault(canonical(name), dist.version)
    return dict(sorted(pins.items()))


def _wheel_name_version(file_name: str) -> tuple[str, str]:
    parts = file_name[: -len(".whl")].split("-")
    return canonical(parts[0]), parts[1]


def requirements_text(wheels: dict[str, str]) -> str:
    """`name==version --hash=sha256:...` per wheel: for `pip install --require-hashes --no-index`."""
    lines = []
    for file_name, sha in sorted(wheels.items()):
        name, version = _wheel_name_version(file_name)
        lines.append(f"{name}=={version} --hash=sha256:{sha}\n")
    return "".join(lines)


def _pin_problems(wheels: dict[str, str], pins: dict[str, str]) -> list[str]:
    """Dependency wheels whose version is not the one the controller runs (the constraints were not kept)."""
    out = []
    for file_name in sorted(wheels):
        name, version = _wheel_name_version(file_name)
        if name in _NOT_PINNED or name not in pins:
            continue
        if canonical(version) != canonical(pins[name]):
            out.append(f"{file_name} (the controller runs {name} {pins[name]})")
    return out


def build(directory: Path, source: Path | None = None, *, python: str = sys.executable) -> Wheelhouse:
    """Build the wheelhouse into `directory` unless the one there was built from the same agent source.

    Builds from a copy of the source so nothing (build/, egg-info) lands in the checkout; pip's own cache makes
    the dependency wheels cheap after the first time. Blocking: run it in a thread from async code."""
    source = source or find_agent_source()
    if source is None:
        raise WheelhouseError(
            "the agent's source is not beside this llmgw install; give a prebuilt wheelhouse directory"
        )
    pins = installed_pins()
    constraints = "".join(f"{name}=={version}\n" for name, version in pins.items())
    # Keyed by the pins too: upgrading a dependency beside the controller rebuilds what nodes get.
    wanted = hashlib.sha256(f"{source_digest(source)}\0{constraints}".encode()).hexdigest()
    try:
        existing = load(directory)
        if existing.source_digest == wanted:
            return existing
    except WheelhouseError:
        pass
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llmgw-wheels-", dir=directory.parent) as tmp:
        copy = Path(tmp) / "agent"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        out = Path(tmp) / "wheels"
        constraints_file = Path(tmp) / CONSTRAINTS
        constraints_file.write_text(constraints, encoding="utf-8")
        _pip_wheel(python, copy, out, constraints_file)
        wheels, agent = _built_wheels(out, pins)
        _write_manifest(out, wheels, agent, wanted, constraints)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(out, directory)
    return load(directory)


def _pip_wheel(python: str, source: Path, out: Path, constraints_file: Path) -> None:
    """The agent and its dependencies as wheels in `out`, pinned by `constraints_file`."""
    proc = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(out),
            "--constraint",
            str(constraints_file),
            str(source),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    if proc.returncode != 0:
        raise WheelhouseError(f"pip wheel ./agent failed: {(proc.stderr or proc.stdout).strip()[-1500:]}")


def _built_wheels(out: Path, pins: dict[str, str]) -> tuple[dict[str, str], str]:
    """The wheels pip built (file name -> sha256) and the agent's among them, checked against the pins."""
    wheels = {p.name: sha256_file(p) for p in sorted(out.glob("*.whl"))}
    agents = [name for name in wheels if name.startswith(AGENT_DIST + "-")]
    if len(agents) != 1:
        raise WheelhouseError(f"pip wheel produced {len(agents)} agent wheels in {out}")
    unpinned = _pin_problems(wheels, pins)
    if unpinned:
        raise WheelhouseError(
            "pip wheel resolved agent dependencies other than the versions installed beside the "
            f"controller: {', '.join(unpinned)}"
        )
    return wheels, agents[0]


def _write_manifest(out: Path, wheels: dict[str, str], agent: str, digest: str, constraints: str) -> None:
    """Beside the wheels, what a node installs them by: the manifest, the requirements and the pins."""
    manifest = {
        "wheels": wheels,
        "agent_wheel": agent,
        "agent_version": agent.split("-")[1],
        "source_digest": digest,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (out / REQUIREMENTS).write_text(requirements_text(wheels))
    (out / CONSTRAINTS).write_text(constraints)


_WHEEL_TAGS = re.compile(r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def compatibility_problem(house: Wheelhouse, python_version: tuple[int, int], machine: str) -> str | None:
    """Why a node with this Python and `uname -m` cannot install the wheelhouse, or None when it can."""
    cp = f"cp{python_version[0]}{python_version[1]}"
    for name in house.wheels:
        match = _WHEEL_TAGS.search(name)
        if match is None:
            continue
        pys, plat = match["py"].split("."), match["plat"]
        if plat == "any":
            continue
        if not any(p in (cp, "abi3") or (p.startswith("cp3") and match["abi"] == "abi3") for p in pys):
            return (
                f"the agent wheels were built for {match['py']} but the node has Python "
                f"{python_version[0]}.{python_version[1]} ({name}); build a wheelhouse with that Python"
            )
        if machine not in plat:
            return f"the agent wheels were built for {plat} but the node is {machine} ({name})"
    return None
