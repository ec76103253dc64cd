"""Engine args that name a file stay under the replica's work directory, and trust_remote_code (which runs Python
shipped with the model) is a permission the Cluster grants per model. `llmgw validate` refuses the rest with
file:line and the field path; the agent re-checks a ShardSpec handed to it directly."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for, start
from controller.test_hub import FakeAgent
from llmgw_agent.engines import LaunchContext, SpecError, check_path_args, launch_plan
from llmgw_agent.protocol import ShardSpec, ShardStatus, WeightSource
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import wait_for

from .repo_attack import CPU_PROFILE, GPU_PROFILE, attack_repo, model, validate

CTX = LaunchContext("127.0.0.1", 8000, "/w/m", "/w/work", python=sys.executable)

# (engine profile, arg, value, words of the refusal)
PATH_ATTACKS = [
    (CPU_PROFILE, "chat_template_file", "/etc/shadow", "'/etc/shadow' is an absolute path"),
    (CPU_PROFILE, "lora", "../../../../etc/shadow", "'../../../../etc/shadow' climbs out with `..`"),
    (CPU_PROFILE, "lora", "~/.ssh/id_ed25519", "'~/.ssh/id_ed25519' is an absolute path"),
    (GPU_PROFILE, "chat_template", "/root/.bashrc", "'/root/.bashrc' is an absolute path"),
    (GPU_PROFILE, "lora_modules", "a=ok/a b=/etc/x", "'/etc/x' is an absolute path"),
    (GPU_PROFILE, "lora_modules", '{"name": "a", "path": "/etc/x"}', "the JSON form is not accepted"),
]


@pytest.mark.parametrize(
    ("profile", "arg", "value", "words"), PATH_ATTACKS, ids=[f"{a[1]}={a[2]}" for a in PATH_ATTACKS]
)
def test_path_args_outside_the_work_directory_are_refused_by_validate(
    tmp_path: Path, profile: str, arg: str, value: str, words: str
) -> None:
    quoted = value.replace("'", "''")
    repo = attack_repo(tmp_path, model(profile + f"      args:\n        {arg}: '{quoted}'\n"))
    validate(repo).assert_refused(arg, f"spec.profiles[0].args.{arg}", words)


def test_relative_path_args_pass_validate(tmp_path: Path) -> None:
    profile = CPU_PROFILE + "      args:\n        chat_template_file: templates/chat.jinja\n"
    assert validate(attack_repo(tmp_path, model(profile))).code == 0


def _sup(tmp_path: Path) -> Supervisor:
    updates: list[ShardStatus] = []
    cfg = SupervisorConfig(state_dir=tmp_path / "state", advertise_host="127.0.0.1", bind_host="127.0.0.1")
    return Supervisor(cfg, updates.append)


@pytest.mark.parametrize(
    ("engine", "arg", "value"),
    [("llamacpp", "chat_template_file", "/etc/shadow"), ("vllm", "lora_modules", "x=../../../etc")],
)
async def test_agent_refuses_path_args_outside_the_work_directory(
    tmp_path: Path, engine: str, arg: str, value: str
) -> None:
    sup = _sup(tmp_path)
    source = WeightSource(path=str(tmp_path / "m.gguf"))
    spec = ShardSpec(replica_id="paths", model="m", engine=engine, args={arg: value}, source=source)
    with pytest.raises(SpecError, match=f"arg {arg}"):
        sup.start(spec)
    assert sup.shards == {}  # nothing started, nothing fetched


def test_agent_follows_symlinks_when_checking_path_args(tmp_path: Path) -> None:
    """A relative name that is a symlink out of the work directory (left there by an engine, say) is refused
    too: the agent checks the resolved path, not the text."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    (work / "chat.jinja").symlink_to("/etc/passwd")
    spec = ShardSpec(replica_id="r", model="m", engine="llamacpp", args={"chat_template_file": "chat.jinja"})
    with pytest.raises(SpecError, match="resolves to /etc/passwd, outside"):
        check_path_args(spec, work, cache)
    (work / "ok.jinja").write_text("{{ messages }}")
    check_path_args(spec.model_copy(update={"args": {"chat_template_file": "ok.jinja"}}), work, cache)


def test_trust_remote_code_without_the_clusters_grant_is_refused_by_validate(tmp_path: Path) -> None:
    repo = attack_repo(tmp_path, model(GPU_PROFILE + "      args:\n        trust_remote_code: true\n"))
    validate(repo).assert_refused(
        "trust_remote_code",
        "spec.profiles[0].args.trust_remote_code",
        "trust_remote_code runs the model's own Python on the node; the Cluster does not grant it to model "
        "`attack`",
    )


def test_trust_remote_code_granted_by_the_cluster_passes_validate(tmp_path: Path) -> None:
    grant = "  security:\n    trust_remote_code: [attack]\n"
    repo = attack_repo(tmp_path, model(GPU_PROFILE + "      args:\n        trust_remote_code: true\n"), grant)
    result = validate(repo)
    assert result.code == 0, result.out


def test_a_grant_naming_no_model_is_a_warning(tmp_path: Path) -> None:
    repo = attack_repo(tmp_path, model(CPU_PROFILE), "  security:\n    trust_remote_code: [atack]\n")
    result = validate(repo)
    assert result.code == 0
    expected = "warning: spec.security.trust_remote_code[0]: `atack` is not a model (did you mean `attack`?)"
    assert f"{repo}/cluster.yaml:19:25: {expected}" in result.out


def test_agent_passes_trust_remote_code_only_when_the_shardspec_says_granted() -> None:
    asked = ShardSpec(replica_id="r", model="m", engine="vllm", args={"trust_remote_code": True})
    with pytest.raises(SpecError, match="does not grant it to model m"):
        launch_plan(asked, CTX)
    granted = asked.model_copy(update={"trust_remote_code": True})
    assert "--trust-remote-code" in launch_plan(granted, CTX).argv
    assert "--trust-remote-code" not in launch_plan(asked.model_copy(update={"args": {}}), CTX).argv


@pytest.mark.integration
async def test_controller_says_in_the_shardspec_which_models_the_cluster_grants_trust_remote_code(
    tmp_path: Path,
) -> None:
    """The grant travels from the Cluster document to the agent in ShardSpec.trust_remote_code, per model; the
    profile's env reaches the agent as written (only allowlisted names could pass validate)."""
    granted = model_yaml("granted", min_=1).replace(
        "args: {decode_ms_per_token: 1}", "args: {decode_ms_per_token: 1, trust_remote_code: true}"
    )
    plain = model_yaml("plain", min_=1).replace("cpu_cores: 1,", "cpu_cores: 1, env: {OMP_NUM_THREADS: '2'},")
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write(
        {
            "cluster.yaml": cluster_yaml() + "  security:\n    trust_remote_code: [granted]\n",
            "granted.yaml": granted,
            "plain.yaml": plain,
        }
    )
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        await wait_for(lambda: running.controller.desired is not None, 10, "the revision applied")
        agent = FakeAgent(admin, "n1")
        await agent.connect()
        serving = asyncio.create_task(agent.serve())
        try:
            starts = await wait_for(lambda: _both_started(agent), 30, "both models started")
            assert starts["granted"].trust_remote_code is True
            assert starts["granted"].args["trust_remote_code"] is True
            assert starts["plain"].trust_remote_code is False
            assert starts["plain"].env == {"OMP_NUM_THREADS": "2"}
        finally:
            serving.cancel()
            await agent.close()
    finally:
        await running.stop()


def _both_started(agent: FakeAgent) -> dict[str, ShardSpec] | None:
    specs = {c.spec.model: c.spec for c in agent.commands if c.spec is not None}
    return specs if len(specs) == 2 else None
