"""The router freezes what start-up built and widens the young generation once it serves (llmgw_router.heap),
so full collections stop walking the process's long-lived objects. Run in a child interpreter: the test
process's own collector stays as it was."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import gc, json
from llmgw_router import app, heap  # app: what a router imports before it serves
before = (gc.get_freeze_count(), gc.get_threshold()[0])
heap.settle_after_start()
print(json.dumps([before, [gc.get_freeze_count(), list(gc.get_threshold())]]))
"""


def test_settling_freezes_the_start_up_objects_and_widens_the_young_generation() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True).stdout
    import json

    (frozen_before, young_before), (frozen_after, threshold) = json.loads(out)
    assert frozen_before == 0 and young_before == 700  # CPython's defaults
    assert frozen_after > 20_000  # the router's modules and models, imported above
    assert threshold[0] == 10_000 and threshold[1:] == [10, 10]  # the older generations keep their ratios
