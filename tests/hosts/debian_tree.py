"""A Debian machine's root file system for a lab host: a minimal bookworm made by `debootstrap`, cached between
runs, with PostgreSQL (which `llmgw server init` installs) downloaded but not installed, so init's `apt-get
install` runs for real inside a lab host, which has no route to the internet. git, which init and `llmgw server
add` also install when missing, comes installed: unpacking it (and the perl it needs) on each of the tests' two
hosts took most of a minute, and init's install of PostgreSQL already runs the same step for real.

Each test sees the cached tree through an overlay whose upper directory takes what init changes. The test's own
interpreter, virtual environment and source tree are bind-mounted into the tree at their paths
(inside the host's mount namespace only), so the units' commands are the ones this checkout installed; the
interpreter needs libsqlite3 from the tree (installed when it is made).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import llmgw
from hosts.machine import Host

__all__ = ["PROJECT", "cached_tree_ready", "debian_tree", "mount_into", "overlay"]

SUITE = "bookworm"
VERSION = 2  # bump to rebuild every cached tree (what goes into it changed)
MIRROR = os.environ.get("LLMGW_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DOWNLOADED = ("postgresql",)  # what init installs: its .debs, not installed
INSTALLED = ("libsqlite3-0", "git")  # what the bind-mounted interpreter needs; git (see above)
PROJECT = Path(llmgw.__file__).resolve().parents[1]


def _cache() -> Path:
    base = Path(os.environ.get("LLMGW_CACHE", Path.home() / ".cache" / "llmgw"))
    return base / f"debian-{SUITE}-server-v{VERSION}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # xdist workers: one builds, the others wait for it
        yield


def cached_tree_ready() -> bool:
    return (_cache() / ".llmgw-complete").exists()


def debian_tree() -> Path:
    """The cached tree, made the first time (debootstrap takes about half a minute from a near mirror)."""
    cache = _cache()
    with _locked(cache.with_name(cache.name + ".lock")):
        if (cache / ".llmgw-complete").exists():
            return cache
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        include = "--include=" + ",".join(INSTALLED)
        argv = ["debootstrap", "--variant=minbase", include, SUITE, str(partial), MIRROR]
        _run(argv, 900)
        apt = ["chroot", str(partial), "apt-get", "install", "--download-only", "-y", "-q"]
        _run([*apt, "--no-install-recommends", *DOWNLOADED], 600)
        (partial / ".llmgw-complete").write_text(f"{SUITE} v{VERSION}\n")
        shutil.rmtree(cache, ignore_errors=True)
        partial.rename(cache)
        return cache


def _run(argv: list[str], timeout: float) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... failed ({done.returncode}): {done.stderr[-2000:]}")


def overlay(host: Host, tmp: Path) -> tuple[Path, Path]:
    """The cached tree as the host's root-to-be: an overlay (in the host's mount namespace only) whose upper
    directory takes every change, so the cache is never written and nothing is copied. Returns the merged tree
    (what the host sees; from the test's namespace an empty directory) and the upper one (what init changed,
    readable from the test)."""
    merged, upper, work = tmp / "root", tmp / "upper", tmp / "work"
    for d in (merged, upper, work):
        d.mkdir()
    options = f"lowerdir={debian_tree()},upperdir={upper},workdir={work}"
    host.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)])
    return merged, upper


def interpreter_paths() -> list[Path]:
    """What the test's interpreter needs at its own paths: its installation, its venv, this checkout."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix), PROJECT}
    return sorted(p for p in paths if not any(q != p and q in p.parents for q in paths))


def mount_into(host: Host, tree: Path) -> None:
    """/proc, /dev and the interpreter's paths mounted into `tree`, in the host's mount namespace only."""
    lines = [f"mount -t proc proc {tree}/proc", f"mount --rbind /dev {tree}/dev"]
    for path in interpreter_paths():
        inside = tree / path.relative_to("/")
        # The service account must reach the interpreter: search permission on each directory down to it.
        ancestors = [str(p) for p in [inside, *inside.parents] if tree in p.parents]
        lines += [f"mkdir -p {inside}", f"chmod o+x {' '.join(ancestors)}", f"mount --bind {path} {inside}"]
    host.run(["sh", "-c", " && ".join(lines)])
