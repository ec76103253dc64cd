"""`llmgw doctor NODE`, the node's half: the agent checks its own machine and says what to fix.

Each check is a `Check` (ok, warn or fail, what was found, and for warn and fail what to do); the controller
adds its own view of the node (clock offset seen on heartbeats, agent version) and the CLI prints them. The
checks only read: nvidia-smi's query, each engine's `--version` probe, statvfs, a TCP connect to each
controller address, the client certificate's dates.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from llmgw_agent import health

Status = Literal["ok", "warn", "fail"]
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 5.0  # the LlmgwNodeClockSkew alert's threshold too
CERT_WARN_DAYS = 30  # the cluster CA reissues a node certificate this close to expiry (adapters/ssh/ca.py)
CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_driver(smi: health.SmiResult | None) -> list[Check]:
    if smi is None:
        return [
            Check("driver", "ok", "no nvidia-smi on this node: a CPU node (no GPU series, no GPU placement)")
        ]
    if smi.gpus is None:
        return [
            Check(
                "driver",
                "fail",
                f"nvidia-smi does not answer: {smi.error}",
                "run `nvidia-smi` on the node; if it fails too, the NVIDIA driver is not loaded or a GPU is "
                "lost (dmesg shows Xid errors): drain the node, then reload the driver or reboot",
            )
        ]
    checks = [Check("driver", "ok", f"nvidia-smi answers for {len(smi.gpus)} GPU(s)")]
    for g in smi.gpus:
        if g.ecc_volatile:
            checks.append(
                Check(
                    f"gpu {g.index}",
                    "fail",
                    f"{g.ecc_volatile} uncorrectable ECC error(s) since the driver loaded ({g.uuid or 'no uuid'})",
                    "drain the node (its replicas move), reset the GPU (`nvidia-smi -r -i "
                    f"{g.index}`) or reboot; if errors come back, have the card replaced",
                )
            )
    return checks


def check_cpu(arch: str | None, flags: Sequence[str] | None) -> Check:
    """An x86 CPU without AVX2: CPU engine builds (llama.cpp's ggml-cpu, vLLM's CPU backend) are vectorised
    for it and run several times slower without it, or stop at their first AVX2 instruction."""
    if flags is None:
        return Check("cpu", "ok", "CPU flags not readable here (/proc/cpuinfo): nothing to say about them")
    if arch not in (None, "x86_64", "amd64"):
        return Check("cpu", "ok", f"{arch} CPU (AVX2 is an x86 matter)")
    if "avx2" in flags:
        return Check(
            "cpu",
            "ok",
            "the CPU has AVX2 (and " + (", ".join(f for f in flags if f != "avx2") or "no more") + ")",
        )
    return Check(
        "cpu",
        "warn",
        "the CPU lacks AVX2: CPU builds of llama.cpp and vLLM run several times slower on it, or stop with "
        "`Illegal instruction`",
        "serve CPU profiles from nodes with AVX2 (a `node_selector`, or `engine_overrides` disabling the engine "
        "here), or declare a build for older CPUs first in the engine's `builds`",
    )


def check_disk(
    filesystems: Sequence[tuple[str, str, int, int]], weights_path: str, min_free_bytes: int
) -> list[Check]:
    by_path = {path: (role, size, free) for role, path, size, free in filesystems}
    if weights_path not in by_path:
        return [
            Check(
                "disk",
                "fail",
                f"the weights directory {weights_path} cannot be read",
                "create it (or mount its filesystem) and give the agent's user write access",
            )
        ]
    _, size, free = by_path[weights_path]
    where = f"{_gib(free)} free of {_gib(size)} at {weights_path}"
    fix = (
        "free space there: `llmgw weights collect --apply` removes weights no model uses, or grow the "
        f"filesystem (the threshold is the agent's doctor_min_free_bytes, {_gib(min_free_bytes)})"
    )
    if free < min_free_bytes:
        return [Check("disk", "fail", f"weights filesystem nearly full: {where}", fix)]
    if free < 2 * min_free_bytes:
        return [Check("disk", "warn", f"weights filesystem getting full: {where}", fix)]
    return [Check("disk", "ok", where)]


def check_clock(agent_now: float, controller_time: float | None) -> Check:
    if controller_time is None:
        return Check("clock", "warn", "the controller sent no time to compare with", "upgrade the controller")
    offset = agent_now - controller_time  # includes the command's transit: an upper bound when positive
    text = (
        f"the node's clock is {abs(offset):.2f}s {'ahead of' if offset >= 0 else 'behind'} the controller's"
    )
    fix = "run NTP on both (`timedatectl status` says whether the clock is synchronised; chrony or systemd-timesyncd)"
    if abs(offset) >= CLOCK_FAIL_S:
        return Check("clock", "fail", text, fix)
    if abs(offset) >= CLOCK_WARN_S:
        return Check("clock", "warn", text, fix)
    return Check("clock", "ok", text)


def check_certificate(cert_file: str | None, now: float) -> Check:
    if cert_file is None:
        return Check(
            "certificates", "ok", "no client certificate configured (the agent presents its token only)"
        )
    try:
        decoded = ssl._ssl._test_decode_cert(cert_file)  # type: ignore[attr-defined]  # the stdlib's only PEM reader
        not_after = ssl.cert_time_to_seconds(decoded["notAfter"])
    except (OSError, ValueError, KeyError, ssl.SSLError) as exc:
        return Check(
            "certificates",
            "fail",
            f"the client certificate {cert_file} cannot be read: {exc}",
            "bootstrap the node again (`llmgw node bootstrap NODE`) to reissue it",
        )
    left_days = (not_after - now) / 86400
    until = datetime.fromtimestamp(not_after, UTC).strftime("%Y-%m-%d")
    fix = "bootstrap the node again (`llmgw node bootstrap NODE`): the cluster CA reissues it"
    if left_days <= 0:
        return Check("certificates", "fail", f"the client certificate expired on {until}", fix)
    if left_days < CERT_WARN_DAYS:
        return Check("certificates", "warn", f"the client certificate expires on {until}", fix)
    return Check("certificates", "ok", f"the client certificate is valid until {until}")


async def check_controllers(urls: Sequence[str]) -> list[Check]:
    """A TCP connect to every controller address the agent knows (a standby must be reachable too)."""

    async def one(url: str) -> Check:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, writer = await asyncio.open_connection(host, port)
            writer.close()
        except (OSError, TimeoutError) as exc:
            return Check(
                f"controller {host}:{port}",
                "fail",
                f"not reachable from the node: {exc or 'timed out'}",
                "check the address in the agent's configuration, firewalls and routes between node and controller",
            )
        return Check(f"controller {host}:{port}", "ok", "reachable from the node")

    return list(await asyncio.gather(*(one(u) for u in urls)))


async def check_engines(
    engines: Sequence[str], probe: Callable[[str], Awaitable[dict[str, Any]]], conditions: Sequence[str]
) -> list[Check]:
    """Each installed engine's probe run now; `conditions` are the node's own messages of engines that failed
    to install or to probe."""
    checks = []
    # Probed together: each is bounded (30s) by the probe, so the whole answer is too.
    results = await asyncio.gather(*(probe(engine) for engine in engines))
    for engine, result in zip(engines, results, strict=True):
        if result.get("ok"):
            version = str(result.get("output") or result.get("version") or "").strip().splitlines()[-1:]
            checks.append(Check(f"engine {engine}", "ok", f"probe ran: {' '.join(version) or 'ok'}"))
        else:
            tail = str(result.get("output") or "").strip()[-300:]
            checks.append(
                Check(
                    f"engine {engine}",
                    "fail",
                    f"probe failed: {tail or 'no output'}",
                    f"run the engine's --version on the node; reinstall it or fix its path in the agent's "
                    f"or the Cluster's engines.{engine}",
                )
            )
    for message in conditions:
        checks.append(
            Check("engine install", "fail", message, "`llmgw nodes` shows the install's last lines")
        )
    return checks


def summary(checks: Sequence[Check]) -> Status:
    if any(c.status == "fail" for c in checks):
        return "fail"
    return "warn" if any(c.status == "warn" for c in checks) else "ok"
