"""Known advisories against exactly what uv.lock installs, from PyPI's advisory database through pip-audit.

`--strict` (what `make lock` runs): any advisory not ignored refuses the lock, exit 1. Without it (`make audit`,
`.ci/run`): advisories are reported and the exit is 0, so an advisory published today turns nothing red before
someone decides. A database that cannot be reached is said, with how many packages went unchecked, and the run
goes on in both modes: unknown is reported as unknown, never as "no advisories". Ignores live in requirements/audit-ignore.toml, each
with a reason and an expiry date; an expired one no longer applies.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".cache" / "tools" / "bin"
IGNORES = ROOT / "requirements" / "audit-ignore.toml"


def _ignores(today: datetime.date) -> list[str]:
    """Ids still ignored today; an expired entry is named, so whoever meets the refusal knows why."""
    entries = tomllib.loads(IGNORES.read_text(encoding="utf-8")).get("ignore", [])
    live = []
    for entry in entries:
        if entry["expires"] < today:
            print(f"audit: the ignore of {entry['id']} ({entry['package']}) expired on {entry['expires']}")
        else:
            live.append(entry["id"])
    return live


def _locked_requirements(directory: Path) -> Path:
    """Every locked third-party package (all groups and extras) with its hashes, as a requirements file."""
    out = directory / "locked.txt"
    export = [str(TOOLS / "uv"), "export", "--frozen", "--quiet", "--all-packages", "--all-extras"]
    export += ["--all-groups", "--no-emit-workspace", "--format", "requirements-txt", "-o", str(out)]
    subprocess.run(export, cwd=ROOT, check=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 on any advisory not ignored")
    strict = parser.parse_args().strict
    with tempfile.TemporaryDirectory(prefix="llmgw-audit-") as tmp:
        argv = [str(TOOLS / "pip-audit"), "--disable-pip", "--require-hashes", "--progress-spinner", "off"]
        argv += ["--format", "json", "-r", str(_locked_requirements(Path(tmp)))]
        for vuln in _ignores(datetime.date.today()):
            argv += ["--ignore-vuln", vuln]
        proc = subprocess.run(argv, capture_output=True, text=True)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        # Most often the advisory database cannot be reached (no network): say so, and refuse only a new lock.
        print(
            f"audit: could not reach the advisory database; going on: {(proc.stderr or proc.stdout).strip()[-300:]}"
        )
        return 0
    unchecked = [dep["name"] for dep in report["dependencies"] if dep.get("skip_reason")]
    if unchecked:
        # PyPI's JSON API answers 404 where only the simple index is mirrored: the advisories are unknown, not none.
        print(
            f"audit: advisories unknown for {len(unchecked)} of {len(report['dependencies'])} locked packages "
            f"(the advisory database did not answer for them, e.g. {unchecked[0]}); going on"
        )
    found = [(dep, vuln) for dep in report["dependencies"] for vuln in dep.get("vulns", [])]
    for dep, vuln in found:
        fixed = ", ".join(vuln.get("fix_versions", [])) or "no fixed release"
        print(f"audit: {dep['name']} {dep['version']}: {vuln['id']} (fixed in {fixed})")
    checked = len(report["dependencies"]) - len(unchecked)
    print(f"audit: {checked} locked packages checked, {len(found)} advisories not ignored")
    return 1 if strict and found else 0


if __name__ == "__main__":
    sys.exit(main())
