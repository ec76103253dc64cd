"""Shows a long `uv sync -v` as a newcomer can read it: uv's own lines, and the llama.cpp build as a line per tenth.

uv streams a source build's output only in verbose mode, where it is hundreds of lines of DEBUG. This keeps uv's
ordinary lines (what is built, downloaded, installed), turns cmake's `[ 42%] Building ...` lines into one line at
each tenth of the way with the time since the start, and drops the rest; the last 60 dropped lines are printed if
the stream ends in an error (uv's `error:` line), so a failed build shows its cause. Reads stdin, writes stdout.
"""

import re
import sys
import time
from collections import deque

PERCENT = re.compile(r"\[\s*(\d+)%\]")


def _elapsed(start: float) -> str:
    seconds = int(time.monotonic() - start)
    return f"{seconds // 60}m{seconds % 60:02d}s"


def main() -> None:
    start = time.monotonic()
    shown_tenth = -1
    dropped: deque[str] = deque(maxlen=60)
    for raw in sys.stdin:
        line = raw.rstrip("\n")
        if not line.startswith("DEBUG "):
            if line.lstrip().startswith("error"):
                print("\n".join(dropped), flush=True)
            print(f"[{_elapsed(start)}] {line}", flush=True)
            continue
        dropped.append(line)
        match = PERCENT.search(line)
        if match and int(match.group(1)) // 10 > shown_tenth:
            shown_tenth = int(match.group(1)) // 10
            print(f"[{_elapsed(start)}] building llama.cpp: {match.group(1)}%", flush=True)


if __name__ == "__main__":
    main()
