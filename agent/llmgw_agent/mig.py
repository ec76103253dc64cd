"""A card in MIG mode, as the instances carved from it. Pure parsers over nvidia-smi's text; inventory runs it.

`nvidia-smi --query-gpu=...,mig.mode.current` says which cards are in MIG mode (`Enabled`). Such a card is not
one device: CUDA sees only its MIG instances, each named `MIG-<uuid>` in CUDA_VISIBLE_DEVICES. Two outputs
say what an instance is, neither alone (NVIDIA driver R550, as documented for `nvidia-smi -L` and `-q -x`):
- `nvidia-smi -L` lists each card, and under it each MIG device with its profile and UUID:
  `  MIG 3g.40gb     Device  0: (UUID: MIG-9e1b...)`;
- `nvidia-smi -q -x` gives, per `<gpu>` (in index order), `<mig_mode><current_mig>` and, per
  `<mig_devices><mig_device>`, its `<index>` (the Device number above) and `<fb_memory_usage><total>` (MiB).

An instance is reported as a GPU of its own: its UUID, its memory, a class from the card's and the profile's
(`a100-80g-mig-3g.40gb`), and an index that never meets a card's: 1000 * (card + 1) + its device number. A card
in MIG mode with nothing carved is reported as itself, `unusable` with the reason, so placement leaves it out.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw_agent.protocol import Gpu

__all__ = [
    "MIG_INDEX_BASE",
    "MigDevice",
    "cuda_devices",
    "instances_of",
    "mig_index",
    "parse_listing",
    "parse_memory",
]

MIG_INDEX_BASE = 1000
UNCARVED = (
    "in MIG mode with no MIG instance carved: CUDA sees no device on it; create instances "
    "(`nvidia-smi mig -cgi PROFILES -C`) or turn MIG mode off (`nvidia-smi -mig 0`)"
)
_CARD = re.compile(r"^GPU\s+(\d+):")
_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(MIG-[^)\s]+)\)")


@dataclass(frozen=True)
class MigDevice:
    card: int  # the card's index
    device: int  # the MIG device number on that card (`Device N`, `<mig_device><index>`)
    profile: str  # "3g.40gb", "1c.3g.40gb"
    uuid: str  # "MIG-...", as CUDA_VISIBLE_DEVICES takes it


def mig_index(card: int, device: int) -> int:
    return MIG_INDEX_BASE * (card + 1) + device


def parse_listing(text: str) -> list[MigDevice]:
    """The MIG devices `nvidia-smi -L` lists, each under its card."""
    out: list[MigDevice] = []
    card: int | None = None
    for line in text.splitlines():
        if m := _CARD.match(line):
            card = int(m.group(1))
        elif (m := _MIG.match(line)) and card is not None:
            out.append(MigDevice(card, int(m.group(2)), m.group(1), m.group(3)))
    return out


def _mib(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*MiB\s*", text)
    return int(m.group(1)) * 2**20 if m else None


def parse_memory(xml_text: str) -> dict[tuple[int, int], int | None]:
    """(card, device) -> the MIG device's memory in bytes (None: `N/A`), from `nvidia-smi -q -x`. Raises
    ValueError on text that is not its XML."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi -q -x is not XML: {exc}") from None
    out: dict[tuple[int, int], int | None] = {}
    for card, gpu in enumerate(root.findall("gpu")):
        for dev in gpu.findall("mig_devices/mig_device"):
            index = (dev.findtext("index") or "").strip()
            if index.isdigit():
                out[(card, int(index))] = _mib(dev.findtext("fb_memory_usage/total"))
    return out


def instances_of(
    cards: Sequence[Gpu],
    modes: Mapping[int, str],
    devices: Sequence[MigDevice],
    memory: Mapping[tuple[int, int], int | None],
) -> list[Gpu]:
    """The node's GPUs with each card in MIG mode replaced by its instances (or left out as `unusable` when
    none is carved). `modes` is card index -> `mig.mode.current` (Enabled, Disabled, [N/A])."""
    out: list[Gpu] = []
    for card in cards:
        if modes.get(card.index, "").strip().lower() != "enabled":
            out.append(card)
            continue
        carved = [d for d in devices if d.card == card.index]
        if not carved:
            out.append(card.model_copy(update={"unusable": UNCARVED}))
            continue
        for d in sorted(carved, key=lambda d: d.device):
            out.append(
                Gpu(
                    index=mig_index(card.index, d.device),
                    uuid=d.uuid,
                    name=f"{card.name} MIG {d.profile}" if card.name else None,
                    memory_bytes=memory.get((card.index, d.device)),
                    gpu_class=f"{card.gpu_class}-mig-{d.profile}" if card.gpu_class else None,
                    fault=card.fault,
                    mig_card=card.index,
                    mig_profile=d.profile,
                )
            )
    return out


def cuda_devices(reported: Sequence[Gpu], indices: Sequence[int]) -> list[str]:
    """What CUDA_VISIBLE_DEVICES names for the GPUs `indices` of a node that reported `reported`: a MIG
    instance as its `MIG-<uuid>`, a whole card by its index; empty when none is a MIG instance (the indices
    then say it, as they always did)."""
    by_index = {g.index: g for g in reported}
    named = {i: by_index[i].uuid for i in indices if i in by_index and by_index[i].mig_card is not None}
    if not named:
        return []
    return [named.get(i) or str(i) for i in indices]
