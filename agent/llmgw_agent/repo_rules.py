"""What a cluster repo may ask of a node: the one definition both `llmgw validate` and the agent enforce.

Whoever can merge a Model document must not be able to write files, load code or reach devices on a node beyond
running that model. The rules are pure functions returning why something is refused (None when allowed), so the
controller's validator (which imports this module; the agent imports nothing of llmgw) reports them with file
and line, and the agent re-checks whatever reaches it over the wire.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

# ---------------------------------------------------------------------------------------------- identifiers

# Replica ids are `<model>-<profile>-<hex>` (names are lower-case letters, digits, `.`, `_`, `-`): they become
# directory and file names under the agent's state dir, so nothing else (no `/`, no leading dot) is accepted.
REPLICA_ID_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,198}[a-z0-9])?$")


def replica_id_problem(replica_id: str) -> str | None:
    if REPLICA_ID_PATTERN.fullmatch(replica_id):
        return None
    return (
        f"replica id {replica_id!r} is not a name (lower-case letters, digits, `.`, `_`, `-`; "
        "starting and ending with a letter or digit; at most 200 characters)"
    )


# ---------------------------------------------------------------------------------------------- weights file names


def weights_file_name(url: str) -> str:
    """The file name a weights URL is saved under: the last segment of the *decoded* path (`weights` when the
    path ends in `/`). Decoding first matters: `%2F` decoded after taking the last segment would be a slash."""
    path = unquote(urlsplit(url).path)
    if path.endswith("/") or not path:
        return "weights"
    return path.rsplit("/", 1)[-1]


def weights_name_problem(url: str) -> str | None:
    """Why the file name `url` would be saved under is refused, or None. The name must be one plain file name:
    no separators (`/`, `\\`), no NUL or control character, not `.`/`..`, no leading dot (no hidden files
    such as `.pth` or `.bashrc` look-alikes)."""
    path = unquote(urlsplit(url).path)
    name = weights_file_name(url)
    if "\x00" in path or any(ord(ch) < 0x20 for ch in path):
        return "the decoded URL path holds a NUL or control character"
    if "\\" in path:
        return "the decoded URL path holds a backslash"
    if any(part in (".", "..") for part in path.split("/")):
        return "the decoded URL path holds a `.` or `..` segment"
    if "%2f" in urlsplit(url).path.lower():
        return "the URL path holds an encoded slash (%2F)"
    if name.startswith("."):
        return f"the file name {name!r} starts with a dot"
    return None


# A directory source's manifest names its files by relative path (`shards/model-00001.safetensors`): the same
# plain-name rule as a single file's name, applied to every segment, so nothing lands outside the directory.
MANIFEST_NAME_MAX = 512
MANIFEST_FILE = (
    "llmgw-manifest.json"  # where a published directory's manifest is read: DIR/llmgw-manifest.json
)


def manifest_name_problem(name: str) -> str | None:
    """Why a manifest's file name is refused, or None: relative, `/`-separated, every segment one plain name
    (no `.`/`..`, no leading dot, no backslash, NUL or control character), at most 512 characters."""
    if not name:
        return "the file name is empty"
    if len(name) > MANIFEST_NAME_MAX:
        return f"the file name is longer than {MANIFEST_NAME_MAX} characters"
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in name):
        return "the file name holds a NUL or control character"
    if "\\" in name:
        return "the file name holds a backslash (segments are separated by `/`)"
    if name.startswith("/"):
        return "the file name is absolute (names are relative to the model directory)"
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            return f"the file name {name!r} has an empty, `.` or `..` segment"
        if segment.startswith("."):
            return f"the file name {name!r} has a segment starting with a dot ({segment!r})"
    if name == MANIFEST_FILE:
        return f"{MANIFEST_FILE} is the manifest itself, not a file of the model"
    return None


# ---------------------------------------------------------------------------------------------- engine environment

# Names nobody may set, with the reason given back to the author.
_FORBIDDEN_ENV: dict[str, str] = {
    "PATH": "chooses which executables the engine runs",
    "HOME": "moves the engine's home (caches, config files it reads)",
    "CUDA_VISIBLE_DEVICES": "the agent sets it to the GPUs it assigned to this replica",
    "NVIDIA_VISIBLE_DEVICES": "the agent assigns GPUs",
    "CUDA_DEVICE_ORDER": "changes which device each GPU index means; the agent assigns GPUs",
    "HIP_VISIBLE_DEVICES": "the agent assigns GPUs",
    "ROCR_VISIBLE_DEVICES": "the agent assigns GPUs",
    "VLLM_SERVER_DEV_MODE": "opens vLLM's unauthenticated development endpoints",
    "VLLM_API_KEY": "the agent sets the engine's key",
    "LLAMA_API_KEY": "the agent sets the engine's key",
}
_FORBIDDEN_PREFIXES: tuple[tuple[str, str], ...] = (
    ("LD_", "LD_* names make the dynamic linker load code into the engine"),
    ("PYTHON", "PYTHON* names make the interpreter load code into the engine"),
    (
        "VLLM_ALLOW_",
        "VLLM_ALLOW_* switches lift vLLM guards; the agent sets them itself when a feature needs them",
    ),
    ("LLAMA_ARG_", "LLAMA_ARG_* names set llama-server options around the args allowlist"),
)
# Words (between underscores) that make a name under a tuning prefix refused: they name a file or directory to
# read or write, code to load, an address to bind or call (a SERVER to report to, an ID that is a rendezvous
# address: NCCL_COMM_ID), a secret, a switch that lifts a guard, or logging and tracing, which can write tenants'
# prompts and completions to the engine log (VLLM_DEBUG_LOG_API_SERVER_RESPONSE, VLLM_LOGGING_LEVEL,
# VLLM_TRACE_FUNCTION).
REFUSED_WORDS = frozenset(
    {
        "PATH",
        "DIR",
        "FILE",
        "ROOT",
        "CACHE",
        "LIB",
        "SO",
        "PLUGIN",
        "PLUGINS",
        "PRELOAD",
        "CONFIG",
        "MODULE",
        "HOST",
        "IP",
        "PORT",
        "ADDR",
        "ADDRESS",
        "URL",
        "URI",
        "ENDPOINT",
        "IFNAME",
        "SERVER",
        "ID",
        "TOKEN",
        "SECRET",
        "KEY",
        "PASSWORD",
        "PASSWD",
        "CREDENTIALS",
        "AUTH",
        "ALLOW",
        "ALLOWED",
        "DEV",
        "UNSAFE",
        "INSECURE",
        "TRUST",
        "LOG",
        "LOGS",
        "LOGGING",
        "TRACE",
        "TRACING",
    }
)
_SECRET_WORDS = frozenset({"TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD", "CREDENTIALS", "AUTH"})
# Exact names every engine takes: thread counts and offline switches (no path but HF_HOME, the Hugging Face
# cache the engine may write to).
_COMMON_ENV = frozenset(
    {
        "OMP_NUM_THREADS",
        "OMP_PROC_BIND",
        "OMP_PLACES",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "TZ",
    }
)
_HF_ENV = frozenset(
    {
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_HUB_ENABLE_HF_TRANSFER",
        "HF_HUB_DOWNLOAD_TIMEOUT",
    }
)
_TORCH_ENV = frozenset({"PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING"})


# engine -> (exact names, tuning prefixes whose names pass unless a word of REFUSED_WORDS is in them)
ENGINE_ENV: Mapping[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "sim": (_COMMON_ENV, ()),
    "llamacpp": (_COMMON_ENV | _HF_ENV, ("GGML_",)),
    "vllm": (_COMMON_ENV | _HF_ENV | _TORCH_ENV, ("VLLM_", "NCCL_")),
    "sglang": (_COMMON_ENV | _HF_ENV | _TORCH_ENV, ("SGLANG_", "NCCL_")),
    "trtllm": (_COMMON_ENV | _HF_ENV | _TORCH_ENV, ("TLLM_", "TRTLLM_", "NCCL_")),
}


def allowed_env_summary(engine: str) -> str:
    """What `engine` accepts, short enough for the hint of an error (docs/cluster-repo.md has the full list)."""
    exact, prefixes = ENGINE_ENV.get(engine, (frozenset(), ()))
    examples = [n for n in ("OMP_NUM_THREADS", "HF_HUB_OFFLINE", "PYTORCH_CUDA_ALLOC_CONF") if n in exact]
    parts = examples + [f"{p}* tuning names" for p in prefixes]
    return f"e.g. {', '.join(parts)}; docs/cluster-repo.md lists them all" if parts else "nothing"


def env_name_problem(engine: str, name: str) -> str | None:
    """Why a profile may not set environment variable `name` for `engine`, or None when it may."""
    upper = name.upper()
    if upper in _FORBIDDEN_ENV:
        return f"{name} is refused: {_FORBIDDEN_ENV[upper]}"
    for prefix, why in _FORBIDDEN_PREFIXES:
        if upper.startswith(prefix):
            return f"{name} is refused: {why}"
    if upper.endswith("_PRELOAD"):
        return f"{name} is refused: *_PRELOAD names load code into the engine"
    exact, prefixes = ENGINE_ENV.get(engine, (frozenset(), ()))
    if name in exact:
        return None
    secret = sorted(set(upper.split("_")) & _SECRET_WORDS)
    if secret:
        return (
            f"{name} is refused: a name with `{secret[0]}` in it looks like a secret, and secrets never go in "
            "the repo"
        )
    for prefix in prefixes:
        if name.startswith(prefix) and len(name) > len(prefix):
            words = set(name[len(prefix) :].split("_"))
            refused = sorted(words & REFUSED_WORDS)
            if refused:
                return (
                    f"{name} is refused: a {prefix}* name with `{refused[0]}` in it names a path, code, an "
                    "address, a secret, a guard switch or logging, not a tuning value"
                )
            if not re.fullmatch(r"[A-Z0-9_]+", name):
                return f"{name} is refused: not an upper-case environment variable name"
            return None
    return f"{name} is not an environment variable {engine} profiles may set"


def filter_env(engine: str, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The allowed part of `env` and the names dropped (the agent's re-check of what validate refused)."""
    kept = {k: v for k, v in env.items() if env_name_problem(engine, k) is None}
    return kept, sorted(set(env) - set(kept))


# ---------------------------------------------------------------------------------------------- engine args

# Args (of engines.py's allowlists) whose value names a file or directory on the node. Their value is a path
# relative to the replica's work directory (the engine's working directory), which is where it must stay.
PATH_ARGS: Mapping[str, frozenset[str]] = {
    "llamacpp": frozenset({"lora", "chat_template_file"}),
    "vllm": frozenset({"chat_template", "lora_modules"}),
    "sglang": frozenset({"chat_template", "lora_paths"}),
    "trtllm": frozenset(),
    "sim": frozenset(),
}
# Runs Python shipped in the model's directory on the node: only for models the Cluster names in
# spec.security.trust_remote_code.
TRUST_REMOTE_CODE = "trust_remote_code"


# Args that take several `name=path` (or bare path) items separated by spaces.
_LIST_PATH_ARGS = frozenset({"lora_modules", "lora_paths"})


def arg_paths(key: str, value: str) -> list[str]:
    """The paths inside a path arg's value. LoRA lists hold `name=path` or bare paths separated by spaces (the
    JSON form is refused by path_arg_problem: its path cannot be checked as text)."""
    if key not in _LIST_PATH_ARGS:
        return [value]
    return [item.split("=", 1)[1] if "=" in item else item for item in value.split()]


def path_arg_problem(engine: str, key: str, value: object) -> str | None:
    """Why a path-valued arg is refused (absolute, `~`, `..`, NUL), or None. Plain checks of the text; the
    agent also resolves it (symlinks included) against the work directory before the engine starts."""
    if key not in PATH_ARGS.get(engine, frozenset()) or not isinstance(value, str):
        return None
    if "\x00" in value:
        return "holds a NUL character"
    if key in _LIST_PATH_ARGS and value.lstrip().startswith(("{", "[")):
        return "the JSON form is not accepted; write `name=relative/path` items separated by spaces"
    for path in arg_paths(key, value):
        if path.startswith(("/", "~")):
            return f"{path!r} is an absolute path; paths are relative to the replica's work directory"
        if ".." in PurePosixPath(path).parts:
            return f"{path!r} climbs out with `..`; paths stay under the replica's work directory"
    return None
