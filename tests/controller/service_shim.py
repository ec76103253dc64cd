"""A stand-in for a service manager in the control-plane upgrade test: `service_shim.py SPEC RELEASE` does what
`systemctl restart` does for a unit, on the release RELEASE (a copy of this tree).

SPEC is a JSON file: {"argv": [...], "pidfile": ..., "log": ...}. The process in the pidfile (its own session:
the whole group) gets SIGTERM and is waited for, as systemd's stop does; then argv starts, in its own session,
with PYTHONPATH naming the release's packages, and its pid is written. Returns once the new process runs:
whether it serves is for the caller to wait for, as after `systemctl restart`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STOP_LIMIT_S = 60.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def stop(pidfile: Path) -> None:
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    if not _alive(pid):
        return
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_LIMIT_S
    while _alive(pid):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            sys.exit(f"{pid} did not stop within {STOP_LIMIT_S:.0f}s of SIGTERM: killed")
        time.sleep(0.05)


def start(spec: dict[str, object], release: str) -> int:
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    paths = f"{release}:{release}/router:{release}/agent"
    with open(str(spec["log"]), "ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=log, start_new_session=True, env=os.environ | {"PYTHONPATH": paths}
        )
    return proc.pid


def main() -> None:
    spec_path, release = Path(sys.argv[1]), sys.argv[2]
    spec = json.loads(spec_path.read_text())
    pidfile = Path(spec["pidfile"])
    stop(pidfile)
    pidfile.write_text(str(start(spec, release)))


if __name__ == "__main__":
    main()
