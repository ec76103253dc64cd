"""Machine-local controller settings, parsed once at the edge (flags or a small YAML file).

Cluster-wide settings (heartbeat interval, unreachable/lost times, token, secret) come from the repo's
`Cluster` document instead; these are only what differs per machine running a controller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmgw.core.config.secretrefs import DEFAULT_ENV_PREFIX, SecretPolicy
from llmgw.core.errors import LlmgwError
from llmgw.core.words import parse_duration


class SettingsError(LlmgwError, ValueError):
    """A controller setting is wrong; the message says which and what would be right."""


def setting_duration(what: str, value: str | float | int) -> float:
    """A duration setting or flag in `llmgw.core.words`' grammar; a bare number is seconds."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise SettingsError(f"{what}: {exc}") from exc


def parse_hostport(text: str, what: str) -> tuple[str, int]:
    """`host:port` (IPv6 as `[::1]:7070`); port 0 asks the OS for a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise SettingsError(f"{what}: {text!r} is not host:port (e.g. 127.0.0.1:7070)")
    return host.strip("[]"), int(port)


class ControllerOptions(BaseModel):
    """Everything `llmgw controller` needs to start. Frozen: built once, passed down."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str = Field(
        description="git URL, or a local path (a git work tree or, with source=directory, a plain directory)"
    )
    source: Literal["auto", "git", "directory"] = Field(
        "auto", description="auto: git when `repo` is a URL or a git work tree, else directory"
    )
    branch: str = "main"
    subpath: str = "."
    poll_s: float = Field(30.0, gt=0, description="How often the git remote is fetched")
    dir_poll_s: float = Field(1.0, gt=0, description="How often a plain directory is checked for changes")
    store: str = Field(description="Store DSN: sqlite:///path, a path, postgresql://..., or @file")
    listen: str = "127.0.0.1:7070"
    metrics_listen: str | None = "127.0.0.1:9090"
    mirror_dir: Path | None = Field(
        None,
        description="Serve this directory as the weights mirror (HF layout, read-only, node tokens) on "
        "mirror_listen; the Cluster's mirror.url tells nodes where",
    )
    mirror_listen: str = "127.0.0.1:7073"
    admin_token_file: Path | None = None
    admin_tokens_file: Path | None = Field(
        None,
        description="More admin tokens, named and scoped (plan, apply, admin): a YAML mapping of name to "
        "{scope, sha256} or {scope, file} (llmgw.controller.parts.admin_tokens); the admin token stays `admin`",
    )
    state_dir: Path = Path(".llmgw/controller")
    secrets_dir: Path | None = Field(
        None,
        description="Where the repo's `{file: NAME}` secret references are read from, NAME relative to it "
        "(default: state_dir/secrets, outside any clone); absolute paths, `..` and links out are refused",
    )
    secret_env_prefix: str = Field(
        DEFAULT_ENV_PREFIX,
        min_length=1,
        description="The repo's `{env: NAME}` references may only name variables with this prefix",
    )
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = Field(None, description="CA that agent client certificates must chain to")
    ca_dir: Path | None = Field(
        None,
        description="The cluster CA directory (llmgw.adapters.ssh.ca): serve TLS with its controller certificate and "
        "require node certificates from agents, revocations honoured",
    )
    default_ca: bool = Field(
        True,
        description="With neither ca_dir nor TLS of its own: use (creating it) STATE_DIR/ca when the repo declares "
        "remote Nodes dialling a non-loopback controller address (`llmgw up` turns this off: its local agent "
        "and router dial it over loopback without certificates)",
    )
    insecure_token_only_remote_nodes: bool = Field(
        False,
        description="INSECURE: bootstrap remote Nodes without the cluster CA, their agents dialling a "
        "non-loopback controller address with a bearer token in clear (anyone on the path can read it and pose "
        "as the controller). Without it such nodes are refused; with it the controller warns at start",
    )
    webhook_secret_file: Path | None = Field(
        None,
        description="File holding the webhook secret: POST /api/v1/webhook then needs a GitHub "
        "X-Hub-Signature-256 (HMAC-SHA256 of the body) made with it",
    )
    webhook_min_interval_s: float = Field(
        5.0, ge=0, description="Webhooks closer together than this start at most one poll between them"
    )
    bootstrap_nodes: bool = Field(
        True, description="Bootstrap the repo's remote Nodes over SSH, and tear down the ones removed from it"
    )
    bootstrap_concurrency: int = Field(8, ge=1, description="Nodes bootstrapped at the same time")
    bootstrap_backoff_s: float = Field(
        10.0,
        gt=0,
        description="First delay before retrying a node whose bootstrap failed (doubles, jittered)",
    )
    node_prefix: str = Field("/opt/llmgw", description="Install prefix of the agent on bootstrapped nodes")
    node_service: Literal["auto", "systemd", "process"] = Field(
        "auto",
        description="How the agent runs on a node: systemd where it runs (auto), or a supervised process",
    )
    node_register_timeout_s: float = Field(
        120.0, gt=0, description="How long a bootstrapped agent has to register before the attempt failed"
    )
    wheelhouse: Path | None = Field(
        None, description="Prebuilt agent wheels for nodes (default: built once into state_dir/wheelhouse)"
    )
    command_timeout_s: float = Field(30.0, gt=0, description="How long an agent has to answer a command")
    settle_s: float = Field(
        30.0, ge=0, description="After a start, wait this long for known nodes to reconnect before placing"
    )
    drain_s: float = Field(10.0, ge=0, description="A replica scaled down gets this long to finish requests")
    console_session_s: float = Field(
        8 * 3600.0, gt=0, description="How long a web console login lasts (docs/console.md)"
    )
    console_cookie_secure: Literal["auto", "always", "never"] = Field(
        "auto",
        description="The console's session cookie is Secure: always (TLS ends at a proxy in front), never (plain "
        "HTTP on a network: anyone on the path can take a session), or auto: when the request came over TLS, or "
        "when the controller listens beyond loopback (a proxy in front then ends TLS)",
    )
    console_store_grace_s: float = Field(
        120.0,
        ge=0,
        description="While the store cannot be asked, a tenant's console session stays open this long past its "
        "key's last check, then ends (a key revoked during an outage must not keep a session)",
    )
    console_router_url: str | None = Field(
        None,
        description="The router's base URL (`http://host:port/v1`) the console's chat page sends through",
    )
    backoff_base_s: float = Field(5.0, gt=0, description="First delay before replacing a failed replica")
    scale_up_cooldown_s: float = Field(
        15.0, ge=0, description="After the autoscaler adds replicas to a model, how long before it adds more"
    )
    scale_down_cooldown_s: float = Field(
        60.0,
        ge=0,
        description="How long a model's load must fit fewer replicas before the autoscaler stops one",
    )
    scale_down_utilization: float = Field(
        0.7,
        gt=0,
        le=1,
        description="A scale-down leaves replicas that would run under this share of their capacity",
    )
    load_stale_s: float = Field(
        30.0, gt=0, description="A router's load report older than this is unknown: the count is held"
    )
    apply_from_admin: bool = Field(True, description="Accept POST /api/v1/apply")
    apply_paths: tuple[Path, ...] = Field(
        (),
        description='Directories besides the controller\'s own repo that POST /api/v1/apply may read as {"path": DIR} '
        "(that directory or one under it); anything else is refused, send the files instead",
    )
    ha: bool = Field(
        False,
        description="Two or more controllers share one (PostgreSQL) store: only the holder of the leader lease "
        "places replicas and accepts agents; the others stand by (read-only admin API)",
    )
    lease_ttl_s: float = Field(15.0, gt=0, description="With ha: how long a leader's claim lasts unrenewed")
    lease_renew_s: float = Field(3.0, gt=0, description="With ha: how often the claim is renewed (or tried)")
    advertise: str | None = Field(
        None, description="With ha: the address others are told to reach this controller at (default: listen)"
    )
    budget_check_s: float = Field(
        60.0,
        gt=0,
        description="How often the leader reads each tenant's spend against its budget, for the budget_80 and "
        "budget_100 notifications (each is sent once per budget period)",
    )
    otlp_endpoint: str | None = Field(
        None,
        description="Send OpenTelemetry spans of the commit path (revision, validate, reconcile, start, ready) to "
        "this OTLP/HTTP collector (http://HOST:4318); default $OTEL_EXPORTER_OTLP_ENDPOINT; needs llmgw[tracing]",
    )
    trace_sample: float = Field(
        1.0, ge=0, le=1, description="With otlp_endpoint: the share of revisions traced"
    )
    usage_retention_s: float = Field(
        30 * 86400.0,
        gt=0,
        description="Per-request usage rows older than this are folded into per-minute aggregates and deleted "
        "(docs/traffic.md)",
    )
    usage_minutes_retention_s: float = Field(
        400 * 86400.0, gt=0, description="Per-minute usage aggregates older than this are deleted"
    )
    retention_check_s: float = Field(
        300.0, gt=0, description="How often the leader prunes usage rows, aggregates and expired content"
    )
    retention_batch: int = Field(
        5000, ge=100, description="Rows pruned per transaction (each holds the store's write lock briefly)"
    )
    content_key_file: Path | None = Field(
        None,
        description="The content key (32 bytes, base64: openssl rand -base64 32) that content projects opt in to "
        "keep is sealed with; without it no content is kept (docs/traffic.md)",
    )
    model_checks_auto: bool = Field(
        True,
        description="Run `llmgw model check` on a ready replica of each new model and engine version, and each "
        "probe a capability served later calls for: routers skip replicas that failed, and a verified_only model "
        "serves a request needing tools or json_schema only where it passed (docs/canaries.md)",
    )
    commit_status_url: str | None = Field(
        None,
        description="Post canary verdicts and applies as commit statuses: the repo's API base, "
        "https://api.github.com/repos/OWNER/REPO or a Gitea/Forgejo https://HOST/api/v1/repos/OWNER/REPO "
        "(POST {url}/statuses/{sha}); needs commit_status_token_file",
    )
    commit_status_token_file: Path | None = Field(
        None,
        description="File holding the forge token for commit statuses (sent as `Authorization: token T`)",
    )
    commit_status_context: str = Field(
        "llmgw",
        min_length=1,
        description="Prefix of the statuses' context: CONTEXT/canary/MODEL, CONTEXT/apply",
    )
    commit_status_target_url: str | None = Field(
        None, description="The link a commit status carries (e.g. the console's address); none by default"
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: one human line per record; json: one JSON object per line with time, level, logger, "
        "message and request_id / replica_id / node where known (docs/operations.md, Logs)",
    )

    @field_validator("node_prefix")
    @classmethod
    def _node_prefix(cls, value: str) -> str:
        from llmgw.adapters.ssh.render import prefix_problem

        problem = prefix_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("listen", "metrics_listen", "mirror_listen")
    @classmethod
    def _hostport(cls, value: str | None) -> str | None:
        if value is not None:
            parse_hostport(value, "listen address")
        return value

    @property
    def listen_hostport(self) -> tuple[str, int]:
        return parse_hostport(self.listen, "--listen")

    @property
    def metrics_hostport(self) -> tuple[str, int] | None:
        return (
            None if self.metrics_listen is None else parse_hostport(self.metrics_listen, "--metrics-listen")
        )

    def secret_policy(self) -> SecretPolicy:
        """Where this controller reads the repo's secret references from (made absolute once)."""
        base = self.secrets_dir if self.secrets_dir is not None else self.state_dir / "secrets"
        return SecretPolicy(base, self.secret_env_prefix).absolute()

    def local_repo(self) -> Path | None:
        """The repo as a directory on this machine (a work tree or a plain directory); None for a git URL."""
        if "://" in self.repo or self.repo.startswith("git@"):
            return None
        return Path(self.repo).expanduser().resolve()

    def apply_roots(self) -> tuple[Path, ...]:
        """The directories POST /api/v1/apply may read by path: the controller's own repo (the checkout an
        operator edits next to `llmgw up`) and the configured `apply_paths`, resolved (symlinks followed)."""
        own = self.local_repo()
        roots = ([own] if own is not None else []) + [p.expanduser().resolve() for p in self.apply_paths]
        return tuple(dict.fromkeys(roots))

    def source_kind(self) -> Literal["git", "directory"]:
        if self.source != "auto":
            return self.source
        if "://" in self.repo or self.repo.startswith("git@"):
            return "git"
        return "git" if (Path(self.repo) / ".git").exists() else "directory"


def load_settings_file(path: Path) -> dict[str, object]:
    """A small YAML file of the same keys as the flags (flags given on the command line win)."""
    from ruamel.yaml import YAML

    try:
        data = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read controller settings {path}: {exc.strerror}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of settings (repo:, store:, listen:, ...)")
    out: dict[str, object] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in (
            "poll",
            "dir_poll",
            "command_timeout",
            "settle",
            "drain",
            "backoff_base",
            "lease_ttl",
            "lease_renew",
            "webhook_min_interval",
            "scale_up_cooldown",
            "scale_down_cooldown",
            "load_stale",
            "usage_retention",
            "usage_minutes_retention",
            "retention_check",
            "console_session",
            "console_store_grace",
        ):
            out[f"{name}_s"] = setting_duration(f"{path}: {key}", value)
        else:
            out[name] = value
    return out
