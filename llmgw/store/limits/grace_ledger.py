"""Which outage grace shares this router already took, on local disk, so a restart does not take them again.

The outage rule lets a router take ONE grace share per limit per window while the store is unreachable.
Kept in memory only, a router restarted during an outage (by an operator, a supervisor, the OOM killer)
took another one each time: the margin grew with restarts. The ledger is one small file per router id
(one JSON line per grace share taken: the limit's key and its window), fsynced before the share is used, and
read back at start. Lines for windows that have ended are dropped when the file is read.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class GraceLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._taken: dict[tuple[str, float], float] = {}  # (limit key, window start) -> window end
        self._loaded = False

    def _load(self, now: float) -> None:
        self._loaded = True
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("grace ledger %s unreadable (%s): taken as empty", self.path, exc.strerror)
            return
        for line in lines:
            try:
                obj = json.loads(line)
                key, start, end = str(obj["key"]), float(obj["start"]), float(obj["end"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash: that grace share was not used
            if end > now:
                self._taken[(key, start)] = end
        # Rewritten without the ended windows, so the file stays as small as the live windows.
        self._write_all()

    def _write_all(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            for (key, start), end in self._taken.items():
                fh.write(json.dumps({"key": key, "start": start, "end": end}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.path)

    def take(self, key: str, window_start: float, window_end: float, now: float) -> bool:
        """True (and recorded on disk) if no grace share of this limit was taken in this window yet.
        Blocking (an fsync): called at most once per limit per window, only while the store is away."""
        if not self._loaded:
            self._load(now)
        if (key, window_start) in self._taken:
            return False
        self._taken[(key, window_start)] = window_end
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "start": window_start, "end": window_end}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return True
