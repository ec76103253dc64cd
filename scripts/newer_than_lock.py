"""Lists the packages of an environment whose versions differ from uv.lock: what `make test-latest` tries.

Reads a `name==version` list (pip freeze format) and the lock, prints one line per difference, and says when
there is none. Informational: the exit status is always 0.
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))
    locked: dict[str, set[str]] = {}
    for package in lock["package"]:
        locked.setdefault(_normal(package["name"]), set()).add(str(package.get("version", "")))
    moved = []
    for line in Path(sys.argv[1]).read_text(encoding="utf-8").splitlines():
        if "==" not in line:
            continue  # editable installs of the workspace itself
        name, version = line.split("==", 1)
        was = locked.get(_normal(name))
        if was is None:
            moved.append(f"  {name} {version} (not in the lock)")
        elif version not in was:
            moved.append(f"  {name} {' / '.join(sorted(was))} -> {version}")
    print(f"newer than uv.lock: {len(moved)} package(s)" + (":" if moved else ""))
    if moved:
        print("\n".join(moved))


if __name__ == "__main__":
    main()
