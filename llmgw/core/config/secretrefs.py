"""Secret references, confined: the one place a `{file: ...}` or `{env: ...}` from the cluster repo is read.

Whoever can edit the cluster repo must not be able to read a secret they were not given: a provider whose
`key: {file: /etc/llmgw/store.dsn}` would have the router send the store's password as a bearer token to a
URL the same document chooses, and a Cluster `token: {file: ../../admin-token}` would have the controller
ship its admin token to a Node the same editor declares. So where secrets live is the operator's choice, made
in the process's own settings, never in the repo:

* `{file: NAME}` names a file under the process's secrets directory (a subdirectory of it too, `team-a/key`).
  Absolute paths, `..` and a leading `~` are refused before anything is read, and the file's real path
  (symlinks followed) must still be under the directory.
* `{env: NAME}` names a variable that starts with the process's prefix (`LLMGW_SECRET_` by default), so
  `AWS_SECRET_ACCESS_KEY` or `PGPASSWORD` are never reachable.

`ref_problem` is the pure rule (`llmgw validate` reports it with file:line); `resolve` re-checks it and reads
the value, relative to the configured directory and never the working directory. The controller and the
router both call `resolve`.

Where a secret may *go* is the binding map's (llmgw.core.config.secret_bindings): `resolve_bound` reads the map from
the secrets directory (`bindings.yaml`), refuses a use it does not allow, and only then reads the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from llmgw.core.config.models import SecretRef
from llmgw.core.config.secret_bindings import (
    BINDINGS_FILE,
    SecretBindingError,
    SecretBindings,
    SecretUse,
    binding_problem,
    parse_bindings,
)
from llmgw.core.errors import LlmgwError

__all__ = [
    "DEFAULT_ENV_PREFIX",
    "RefProblem",
    "SecretPolicy",
    "SecretRefError",
    "load_bindings",
    "read_bindings",
    "ref_problem",
    "resolve",
    "resolve_bound",
    "resolve_path",
]

DEFAULT_ENV_PREFIX = "LLMGW_SECRET_"


class SecretRefError(LlmgwError):
    """A secret reference was refused or could not be read; the message names the rule or the place, never
    the value."""


@dataclass(frozen=True)
class RefProblem:
    field: str  # "file" or "env"
    message: str  # what is wrong
    hint: str  # what would be right


@dataclass(frozen=True)
class SecretPolicy:
    """Where a process reads secrets from: its settings, never the repo's."""

    secrets_dir: Path
    env_prefix: str = DEFAULT_ENV_PREFIX

    def absolute(self) -> SecretPolicy:
        """The same policy with the directory made absolute once, at start, so a later chdir changes nothing."""
        return SecretPolicy(self.secrets_dir.expanduser().absolute(), self.env_prefix)

    @property
    def bindings_file(self) -> Path:
        """The operator's binding map: beside the secrets it binds, outside the repo."""
        return self.secrets_dir / BINDINGS_FILE


def ref_problem(ref: SecretRef, env_prefix: str = DEFAULT_ENV_PREFIX) -> RefProblem | None:
    """Why this reference is refused whatever the files on disk say, or None. Pure."""
    if ref.env is not None:
        if not ref.env.startswith(env_prefix) or len(ref.env) == len(env_prefix):
            suggestion = env_prefix + (ref.env if ref.env else "NAME")
            return RefProblem(
                "env",
                f"environment variable {ref.env!r} does not start with the secret prefix {env_prefix}",
                f"name a variable such as {suggestion}, set for the controller and router processes; "
                "other variables of those processes are not the repo's to read",
            )
        return None
    name = ref.file or ""
    if not name or "\0" in name:
        return RefProblem("file", "empty secret file name", "name a file under the secrets directory")
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or name.startswith("~"):
        return RefProblem(
            "file",
            f"absolute secret file path {name!r}",
            f"name a file relative to the secrets directory, e.g. `{PurePosixPath(name).name or 'key'}`, and "
            "put the file there: the directory is a setting of the controller and router",
        )
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return RefProblem(
            "file",
            f"secret file path {name!r} climbs out with `..`",
            "name a file under the secrets directory, without `..`",
        )
    return None


def resolve(ref: SecretRef, policy: SecretPolicy, environ: Mapping[str, str] | None = None) -> str:
    """The reference's value, stripped; SecretRefError says which rule refused it or why it is unreadable."""
    problem = ref_problem(ref, policy.env_prefix)
    if problem is not None:
        raise SecretRefError(f"secret reference refused: {problem.message} ({problem.hint})")
    if ref.env is not None:
        env = os.environ if environ is None else environ
        value = env.get(ref.env, "").strip()
        if not value:
            raise SecretRefError(f"environment variable {ref.env} is not set (named by the cluster repo)")
        return value
    real = resolve_path(ref, policy)
    try:
        return real.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SecretRefError(
            f"cannot read secret file {ref.file} under {policy.secrets_dir}: {why}"
        ) from None


def load_bindings(policy: SecretPolicy) -> SecretBindings:
    """The binding map in the secrets directory; none there is an empty map (nothing is bound)."""
    return read_bindings(policy.bindings_file, missing_ok=True)


def read_bindings(path: Path, *, missing_ok: bool = False) -> SecretBindings:
    """A binding map file (`llmgw validate --bindings FILE` names one); SecretBindingError says what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return SecretBindings({})
        raise SecretBindingError(f"no secret binding map at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SecretBindingError(f"cannot read the secret binding map {path}: {why}") from None
    try:
        data = YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        raise SecretBindingError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    return parse_bindings(data, str(path))


def resolve_bound(
    use: SecretUse,
    policy: SecretPolicy,
    reserved: frozenset[str] = frozenset(),
    environ: Mapping[str, str] | None = None,
) -> str:
    """`use`'s secret, when the binding map lets it go to `use.destination` for `use.purpose` (and it is not
    one of the `reserved` names, the cluster's own); SecretRefError with the line to add otherwise. The map is
    read on every call: an operator's edit holds from the next resolve, with no restart."""
    try:
        problem = binding_problem(load_bindings(policy), use, reserved)
    except SecretBindingError as exc:
        raise SecretRefError(str(exc)) from None
    if problem is not None:
        raise SecretRefError(f"secret reference refused: {problem.text()}")
    return resolve(use.ref, policy, environ)


def resolve_path(ref: SecretRef, policy: SecretPolicy) -> Path:
    """The real path of a `{file: ...}` reference (for readers that want a path, like an SSH identity),
    checked: under the secrets directory after symlinks are followed."""
    problem = ref_problem(ref, policy.env_prefix)
    if problem is not None:
        raise SecretRefError(f"secret reference refused: {problem.message} ({problem.hint})")
    if ref.file is None:
        raise SecretRefError(f"secret reference {{env: {ref.env}}} is not a file")
    base = policy.secrets_dir.expanduser().absolute()
    try:
        real_base = base.resolve(strict=True)
    except OSError as exc:
        raise SecretRefError(
            f"secrets directory {base} is not there ({exc.strerror}); create it or set another one"
        ) from None
    try:
        real = (base / ref.file).resolve(strict=True)
    except OSError as exc:
        raise SecretRefError(f"cannot read secret file {ref.file} under {base}: {exc.strerror}") from None
    if not real.is_relative_to(real_base):
        raise SecretRefError(
            f"secret reference refused: {ref.file} under {base} leads out of the secrets directory through "
            "a symbolic link (replace the link by the file itself)"
        )
    return real
