"""The leftover check (tests/fixtures/leftover_check.py): which processes a run left behind, decided on
process tables written here; then the check itself, on an inner pytest run that leaks on purpose."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.leftovers import (
    CURRENT_TEST_ENV,
    RUN_ENV,
    XDIST_WORKER_ENV,
    Proc,
    Run,
    find_leftovers,
    names_dir,
    protected,
    report,
)
from support import pid_alive, wait_until

TESTS = Path(__file__).resolve().parent
SHARED = "/tmp/llmgw-test-42-abc"
BASETEMP = "/tmp/pytest-of-root/pytest-7"
NODE_DIR = f"{SHARED}/t-node1"
TMP_PATH = f"{BASETEMP}/test_boot0"
RUN = Run(
    run_id="42-abc",
    started=1000,
    dirs=(SHARED, BASETEMP),
    test_dirs={NODE_DIR: "tests/nodes/test_x.py::test_boot", TMP_PATH: "tests/nodes/test_x.py::test_boot"},
    own=frozenset({10}),
)


def proc(pid: int, *cmdline: str, **kw: object) -> Proc:
    fields: dict[str, object] = {"ppid": 1, "pgid": pid, "user": "root", "started": 2000, "zombie": False}
    return Proc(pid=pid, cmdline=cmdline, **{**fields, **kw})


def marked_env(test: str | None = "tests/a.py::test_a (call)") -> dict[str, str]:
    return {RUN_ENV: RUN.run_id, **({CURRENT_TEST_ENV: test} if test else {})}


def pids(table: list[Proc]) -> list[int]:
    return [left.proc.pid for left in find_leftovers(table, RUN)]


def test_a_directory_is_named_only_as_a_whole_path_component() -> None:
    assert names_dir(f"--config={BASETEMP}/test_boot0/agent.json", BASETEMP)
    assert names_dir(f"{BASETEMP} (deleted)", BASETEMP) and names_dir(BASETEMP, BASETEMP)
    assert not names_dir("/tmp/pytest-of-root/pytest-71/test_boot0", BASETEMP)  # another run's
    assert not names_dir("/tmp/pytest-of-root/pytest-7.old", BASETEMP)
    # The first occurrence may be a longer name and a later one the directory itself.
    assert names_dir(f"/tmp/pytest-of-root/pytest-70:{BASETEMP}/x", BASETEMP)


def test_the_run_marks_by_its_environment_its_directories_or_its_working_directory() -> None:
    table = [
        proc(100, "sleep", "600", environ=marked_env()),
        proc(101, "/bin/sh", f"{NODE_DIR}/opt-llmgw/bin/llmgw-agent-supervise", user="llmgw", environ={}),
        proc(102, "python", "-m", "llmgw_agent.sim", cwd=f"{TMP_PATH}/agents/n1/state/work/s-0"),
        proc(103, "sleep", "600", environ={}),  # a developer's, started while the suite ran
        proc(104, "sleep", "600", environ={RUN_ENV: "7-other"}),  # another run's (a CI run beside this one)
        proc(105, "tail", "-f", "/tmp/pytest-of-root/pytest-71/log"),  # another run's directory
        proc(106, "llama-server", "--port", "8080", cwd=None, environ=None),  # unreadable: not ours to judge
    ]
    assert pids(table) == [100, 101, 102]


def test_never_this_pytest_nor_what_started_before_the_run_nor_a_zombie() -> None:
    table = [
        proc(10, "pytest", f"--basetemp={BASETEMP}", environ=marked_env()),  # this process: RUN.own
        proc(200, "make", "up", cwd=SHARED, started=999),  # older than the run: cannot be its
        proc(201, "sleep", "600", environ=marked_env(), zombie=True),  # exited, not yet reaped
    ]
    assert pids(table) == []


def test_descendants_and_group_members_of_a_marked_process_are_the_runs_too() -> None:
    table = [
        # The agent's pass-through leads the engine's group; neither inherits anything of the run.
        proc(300, "python", "-m", "llmgw_agent.main", "run", "--config", f"{TMP_PATH}/agent.json"),
        proc(301, "python", "-c", "passthrough", ppid=300, pgid=301, environ={}),
        proc(302, "python", "-m", "llmgw_agent.sim", ppid=301, pgid=301, environ={}),
        proc(303, "vllm", "serve", ppid=1, pgid=301, environ={}),  # orphaned, still in the group
        proc(304, "sleep", "600", ppid=1, pgid=999, environ={}),  # orphaned elsewhere: nothing ties it
    ]
    found = {left.proc.pid: left for left in find_leftovers(table, RUN)}
    assert sorted(found) == [300, 301, 302]
    assert found[301].mark == "a descendant of 300"
    assert found[302].test == "tests/nodes/test_x.py::test_boot"
    # A group is followed only when a marked process leads it.
    test_b = "tests/b.py::test_b (call)"
    leader = proc(301, "python", "-c", "passthrough", pgid=301, environ=marked_env(test_b))
    found = {left.proc.pid: left for left in find_leftovers([leader, table[4], table[3]], RUN)}
    assert sorted(found) == [301, 303]
    assert found[303].mark == "in the process group 301 leads" and found[303].test == test_b


def test_the_test_is_the_one_pytest_named_else_the_one_whose_directory_it_runs_from() -> None:
    table = [
        proc(400, "sleep", "600", environ=marked_env("tests/a.py::test_a (teardown)")),
        proc(401, "/bin/sh", f"{NODE_DIR}/opt-llmgw/bin/llmgw-agent-supervise", environ={}),
        proc(402, "sshd", "-f", f"{BASETEMP}/sshd0/sshd_config", environ={}),  # a session fixture's directory
        proc(403, "sleep", "600", environ=marked_env(None)),  # started when no test ran (collection)
    ]
    tests = {left.proc.pid: left.test for left in find_leftovers(table, RUN)}
    assert tests == {
        400: "tests/a.py::test_a (teardown)",
        401: "tests/nodes/test_x.py::test_boot",
        402: None,
        403: None,
    }


def test_protected_is_this_process_its_ancestors_and_its_xdist_workers() -> None:
    table = [
        proc(1, "init", ppid=0),
        proc(50, "bash", ppid=1),
        proc(60, "pytest", ppid=50),
        proc(61, "python", "-c", "execnet", ppid=60, environ={XDIST_WORKER_ENV: "gw0", RUN_ENV: "42-abc"}),
        proc(62, "sleep", "600", ppid=60, environ={RUN_ENV: "42-abc"}),
    ]
    assert protected(table, 60) == {1, 50, 60, 61}


def test_a_pytest_run_on_a_worker_protects_no_child_that_only_inherited_the_worker_name() -> None:
    # The leftover test's inner pytest runs on worker gw3: its tests' children inherit PYTEST_XDIST_WORKER=gw3.
    inherited = {XDIST_WORKER_ENV: "gw3", RUN_ENV: "7-inner"}
    table = [
        proc(1, "init", ppid=0),
        proc(60, "pytest", ppid=1, environ=inherited),
        proc(62, "sleep", "600", ppid=60, environ=inherited),
    ]
    assert protected(table, 60, self_worker="gw3") == {1, 60}


def test_the_report_names_pid_user_test_command_line_and_survivors() -> None:
    table = [proc(500, "sleep", "600", user="llmgw", environ=marked_env("tests/a.py::test_leak (call)"))]
    lines = report(find_leftovers(table, RUN), survivors=[500])
    assert "1 process(es) started by this test run were still running" in lines[0]
    assert lines[1].startswith("pid 500 user llmgw: started by tests/a.py::test_leak (call) (its environment")
    assert lines[2:] == ["    sleep 600", "    still alive after SIGKILL"]


# ------------------------------------------------------------------------------------------ the check itself

INNER_CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
pytest_plugins = ["fixtures.leftover_check"]
"""

INNER_TESTS = """
import os
import subprocess
from pathlib import Path

PIDS = Path(os.environ["LEFTOVER_TEST_PIDS"])


def _note(name, proc):
    (PIDS / name).write_text(str(proc.pid))


def test_leaks_a_sleeper():
    _note("leaked", subprocess.Popen(["sleep", "600"]))  # never stopped: the check must find it


def test_leaks_over_a_path(tmp_path):
    # As over SSH: none of our environment, only the test's directory in the command line, and a child of
    # its own that carries nothing at all.
    shell = ["sh", "-c", 'sleep 600; echo "$0"', str(tmp_path)]
    _note("by_path", subprocess.Popen(shell, env={"PATH": os.environ["PATH"]}, start_new_session=True))


def test_starts_a_stranger():
    # What the run did not start, though it began while the run ran (a developer's `make up`): no mark.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_LLMGW_RUN", "PYTEST_CURRENT_TEST")}
    _note("stranger", subprocess.Popen(["sleep", "600"], env=env, cwd="/", start_new_session=True))


def test_clean():
    subprocess.run(["true"], check=True)
"""


def _inner_run(where: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    (where / "inner").mkdir()
    (where / "inner" / "pytest.ini").write_text("[pytest]\n")
    (where / "inner" / "conftest.py").write_text(INNER_CONFTEST)
    (where / "inner" / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS))
    (where / "pids").mkdir()
    # Not the outer run's PYTEST_ADDOPTS: `--durations` there would print the inner tests' names in its output.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | {
        "LEFTOVER_TEST_PIDS": str(where / "pids")
    }
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:asyncio", "-q"]
    args += [f"--basetemp={where / 'inner-temp'}", str(where / "inner")]
    done = subprocess.run(args, cwd=where / "inner", env=env, capture_output=True, text=True, timeout=240)
    return done, {p.name: int(p.read_text()) for p in (where / "pids").iterdir()}


@pytest.mark.integration
def test_the_check_fails_a_leaking_run_naming_the_test_and_leaves_strangers_alone(tmp_path: Path) -> None:
    # Started by this test without the mark, before the inner run: the inner run must not touch it.
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    before = subprocess.Popen(["sleep", "600"], env=env, cwd="/", start_new_session=True)
    started: dict[str, int] = {}
    try:
        done, started = _inner_run(tmp_path)
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert "4 passed" in out, out  # every inner test passed: the leftovers alone fail the run
        assert "processes left behind" in out
        me = pwd.getpwuid(os.getuid()).pw_name
        leaked = f"pid {started['leaked']} user {me}: started by test_inner.py::test_leaks_a_sleeper (call)"
        assert leaked in out
        by_path = f"pid {started['by_path']} user {me}: started by test_inner.py::test_leaks_over_a_path"
        assert by_path in out and "sleep 600" in out
        assert "test_starts_a_stranger" not in out and "test_clean" not in out.split("left behind")[1]
        # Its child carries nothing of the run and is found by its process group.
        assert "in the process group" in out, out
        gone = wait_until(
            lambda: not pid_alive(started["leaked"]) and not pid_alive(started["by_path"]), 10, "leaks killed"
        )
        assert gone
        assert pid_alive(started["stranger"]) and before.poll() is None
    finally:
        before.kill()
        before.wait()
        if "stranger" in started:
            os.kill(started["stranger"], signal.SIGKILL)
