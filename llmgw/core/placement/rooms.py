"""What is free on each node during one placement pass, and the filters with their words.

A `Room` is the mutable working copy of one node for a single pass: placing a replica takes from it, so two
replicas placed from one snapshot are never handed the same GPUs. Each filter exists twice: `fits` (a cheap
yes/no for the placement pass over a thousand nodes) and `verdict` (the same rules with their reasons in words,
for `explain` and for models that cannot be placed). A test holds them to the same answers.

Unknown is not zero: a node that did not report memory, cores, disk or engines is accepted on that field, and
the verdict says so in a note. GPUs are the exception: a GPU replica needs device indices to start, so a node
that did not report its GPUs cannot take one (and the reason says why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from llmgw.core.config.models import Profile
from llmgw.core.fleet.states import HELD_STATES
from llmgw.core.fleet.views import GIB, ModelView, NodeView, ReplicaView

# Engines built into the agent: installed everywhere.
BUILTIN_ENGINES = frozenset({"sim"})


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One node for one profile: accepted or not, why not, and what was accepted without being known."""

    node: str
    accepted: bool
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def words(self) -> str:
        if self.accepted:
            return "fits" + (f" ({'; '.join(self.notes)})" if self.notes else "")
        return "; ".join(self.reasons)


@dataclass(slots=True)
class DiskPool:
    """Free bytes of one filesystem and the weights on it. A node's own disk has a pool of its own; a shared
    filer is one pool for every node mounting it, so its free space is counted once, not once per node, and
    weights one node put there are there for all of them."""

    free: int | None  # bytes
    weights: set[str] | None


@dataclass(slots=True)
class Room:
    """The free resources of one node during a pass (mutable, private to the pass)."""

    name: str
    node: NodeView
    free_gpus: dict[str | None, list[int]]  # class -> free device indices, ascending
    cpu_free: int | None
    mem_free: int | None  # bytes
    disk: DiskPool
    cpu_reserved: int = 0
    mem_reserved: int = 0
    per_model: dict[str, int] = field(default_factory=dict)

    @property
    def disk_free(self) -> int | None:
        return self.disk.free

    @property
    def weights(self) -> set[str] | None:
        return self.disk.weights

    def free_gpu_count(self, gpu_class: str | None) -> int:
        if gpu_class is None:
            return sum(len(v) for v in self.free_gpus.values())
        free = self.free_gpus.get(gpu_class)
        return len(free) if free else 0

    def has_weights(self, key: str | None) -> bool:
        return key is not None and self.weights is not None and key in self.weights

    def take(self, model: str, profile: Profile, gpus: Iterable[int], weights_key: str | None) -> None:
        taken = set(gpus)
        if taken:
            for cls in list(self.free_gpus):
                self.free_gpus[cls] = [i for i in self.free_gpus[cls] if i not in taken]
        if profile.cpu_cores is not None:
            self.cpu_reserved += profile.cpu_cores
            if self.cpu_free is not None:
                self.cpu_free -= profile.cpu_cores
        if profile.min_memory_gb is not None:
            need = int(profile.min_memory_gb * GIB)
            self.mem_reserved += need
            if self.mem_free is not None:
                self.mem_free -= need
        if profile.disk_gb is not None and not self.has_weights(weights_key):
            if self.disk.free is not None:
                self.disk.free -= int(profile.disk_gb * GIB)
            if weights_key is not None and self.disk.weights is not None:
                self.disk.weights.add(weights_key)
        self.per_model[model] = self.per_model.get(model, 0) + 1


def gpus_needed(profile: Profile) -> int:
    """GPUs per node: `gpus`, or one when only a class is named."""
    if profile.gpus:
        return profile.gpus
    return 1 if profile.gpu_class is not None else 0


def build_rooms(
    nodes: Iterable[NodeView], replicas: Iterable[ReplicaView], models: Mapping[str, ModelView]
) -> dict[str, Room]:
    """Rooms for every node, with what current replicas hold already taken out."""
    rooms: dict[str, Room] = {}
    ordered = sorted(nodes, key=lambda n: n.name)
    shared = _shared_pools(ordered)
    for node in ordered:
        free: dict[str | None, list[int]] = {}
        for gpu in sorted(node.gpus or (), key=lambda g: g.index):
            if not gpu.allocated and gpu.fault is None and gpu.unusable is None:
                free.setdefault(gpu.gpu_class, []).append(gpu.index)
        rooms[node.name] = Room(
            name=node.name,
            node=node,
            free_gpus=free,
            cpu_free=node.cpu_cores,
            mem_free=node.memory_bytes,
            disk=_pool_for(node, shared),
        )
    for replica in sorted(replicas, key=lambda r: r.id):
        if replica.state not in HELD_STATES:
            continue
        entry = models.get(replica.model)
        profile = _find_profile(entry, replica.profile)
        for shard in replica.shards:
            room = rooms.get(shard.node)
            if room is None:
                continue
            if profile is None:  # removed model or profile: its GPUs are still held
                room.take(replica.model, _NO_PROFILE, shard.gpus, None)
            else:
                room.take(replica.model, profile, shard.gpus, None)
    return rooms


def _pool_for(node: NodeView, shared: Mapping[str, DiskPool]) -> DiskPool:
    if node.shared_disk is not None:
        return shared[node.shared_disk]
    return DiskPool(node.disk_free_bytes, None if node.weights is None else set(node.weights))


def _shared_pools(nodes: Iterable[NodeView]) -> dict[str, DiskPool]:
    """One pool per shared filesystem: the least free space any of its nodes saw (they looked at different
    moments), and every weights key any of them reported."""
    pools: dict[str, DiskPool] = {}
    for node in nodes:
        if node.shared_disk is None:
            continue
        pool = pools.setdefault(node.shared_disk, DiskPool(node.disk_free_bytes, None))
        if node.disk_free_bytes is not None:
            pool.free = node.disk_free_bytes if pool.free is None else min(pool.free, node.disk_free_bytes)
        if node.weights is not None:
            pool.weights = (pool.weights or set()) | set(node.weights)
    return pools


_NO_PROFILE = Profile(name="unknown", engine="sim")


def _find_profile(entry: ModelView | None, name: str) -> Profile | None:
    if entry is None:
        return None
    for profile in entry.spec.profiles:
        if profile.name == name:
            return profile
    return None


# ---------------------------------------------------------------------------------------------- filters


def version_matches(installed: str, wanted: str) -> bool:
    """`0.10` matches `0.10.1`; `0.1` does not match `0.10.1`."""
    if installed == wanted:
        return True
    return installed.startswith(wanted) and installed[len(wanted)] in ".-+_"


def static_fits(node: NodeView, profile: Profile) -> bool:
    """The filters that do not change during a pass: state, cordon, labels, engine, GPUs of the class."""
    if node.state != "Ready" or node.cordoned or node.held:
        return False
    need = gpus_needed(profile)
    if need:
        if node.gpus is None:
            return False
        cls = profile.gpu_class
        usable = sum(
            1
            for g in node.gpus
            if not g.allocated
            and g.fault is None
            and g.unusable is None
            and (cls is None or g.gpu_class == cls)
        )
        if usable < need:
            return False
    labels = node.labels
    for key, value in profile.node_selector.items():
        if labels.get(key) != value:
            return False
    if profile.engine in node.engine_refusals:
        return False
    engines = node.engines
    if engines is None or profile.engine in BUILTIN_ENGINES:
        return True
    if profile.engine not in engines:
        return False
    installed = engines[profile.engine]
    wanted = profile.engine_version
    return wanted is None or installed is None or version_matches(installed, wanted)


def dynamic_fits(room: Room, profile: Profile, weights_key: str | None) -> bool:
    """The filters on what is free: GPUs, memory, cores, disk."""
    return fit_check(profile, weights_key)(room)


def fit_check(profile: Profile, weights_key: str | None) -> Callable[[Room], bool]:
    """`dynamic_fits` for one profile, its numbers worked out once (it runs for every node of a pass)."""
    need = gpus_needed(profile)
    cls = profile.gpu_class
    mem = None if profile.min_memory_gb is None else profile.min_memory_gb * GIB
    cores = profile.cpu_cores
    disk = None if profile.disk_gb is None else profile.disk_gb * GIB

    def fits(room: Room) -> bool:
        if need:  # a node that did not report GPUs has none free
            if cls is None:
                if room.free_gpu_count(None) < need:
                    return False
            else:
                free = room.free_gpus.get(cls)
                if free is None or len(free) < need:
                    return False
        if mem is not None and room.mem_free is not None and room.mem_free < mem:
            return False
        if cores is not None and room.cpu_free is not None and room.cpu_free < cores:
            return False
        if disk is None or room.disk_free is None or room.has_weights(weights_key):
            return True
        return room.disk_free >= disk

    return fits


def gb(n_bytes: float) -> str:
    """Bytes as GB (2**30) in words: `8`, `7.5`."""
    value = round(n_bytes / GIB, 1)
    return f"{value:g}"


def _num(value: float) -> str:
    return f"{value:g}"


def verdict(room: Room, profile: Profile, weights_key: str | None) -> NodeVerdict:
    """Every filter, with every reason the node is refused and a note for every field it did not report."""
    node = room.node
    reasons: list[str] = []
    notes: list[str] = []
    if node.state != "Ready":
        reasons.append(f"node is {node.state}")
    if node.cordoned:
        reasons.append(node.cordon_reason or "cordoned")
    if node.held:
        reasons.append(node.held)
    for key, value in sorted(profile.node_selector.items()):
        if node.labels.get(key) != value:
            reasons.append(f"does not carry {key}={value}")
    _engine_words(node, profile, reasons, notes)
    _gpu_words(room, profile, reasons)
    _memory_words(room, profile, reasons, notes)
    _cpu_words(room, profile, reasons, notes)
    _disk_words(room, profile, weights_key, reasons, notes)
    return NodeVerdict(node.name, not reasons, tuple(reasons), tuple(notes))


def _engine_words(node: NodeView, profile: Profile, reasons: list[str], notes: list[str]) -> None:
    if profile.engine in BUILTIN_ENGINES:
        return
    refusal = node.engine_refusals.get(profile.engine)
    if refusal is not None:
        reasons.append(refusal)
        return
    warning = node.engine_warnings.get(profile.engine)
    if warning is not None and profile.gpu_class is None:  # a CPU profile runs the engine's CPU build
        notes.append(warning)
    if node.engines is None:
        notes.append("engines not reported")
        return
    if profile.engine not in node.engines:
        reasons.append(f"no {profile.engine} installed")
        return
    installed = node.engines[profile.engine]
    wanted = profile.engine_version
    if wanted is None:
        return
    if installed is None:
        notes.append(f"{profile.engine} version not reported")
    elif not version_matches(installed, wanted):
        reasons.append(f"has {profile.engine} {installed}, needs {wanted}")


def _gpu_words(room: Room, profile: Profile, reasons: list[str]) -> None:
    need = gpus_needed(profile)
    if not need:
        return
    cls = profile.gpu_class
    what = cls if cls is not None else "GPUs"
    if room.node.gpus is None:
        reasons.append(f"GPUs not reported, needs {need} {what}")
        return
    free = room.free_gpu_count(cls)
    if free >= need:
        return
    # A card left out (MIG mode, nothing carved) is said whatever the class asked: its instances would be
    # of another class, and the card's own class is what an operator looks for.
    out = [f"gpu {g.index}: {g.unusable}" for g in room.node.gpus if g.unusable is not None]
    left_out = f" ({len(out)} left out: {'; '.join(out)})" if out else ""
    of_class = [g for g in room.node.gpus if cls is None or g.gpu_class == cls]
    if not of_class:
        reasons.append(f"has no {what}, needs {need}{left_out}")
        return
    faulty = [f"gpu {g.index}: {g.fault}" for g in of_class if g.fault is not None]
    excluded = f" ({len(faulty)} excluded as faulty: {'; '.join(faulty)})" if faulty else ""
    reasons.append(f"has {free} free {what}, needs {need}{excluded}{left_out}")


def _memory_words(room: Room, profile: Profile, reasons: list[str], notes: list[str]) -> None:
    if profile.min_memory_gb is None:
        return
    if room.mem_free is None:
        notes.append("memory not reported")
        return
    if room.mem_free >= profile.min_memory_gb * GIB:
        return
    need = _num(profile.min_memory_gb)
    if room.mem_reserved and room.node.memory_bytes is not None:
        total = gb(room.node.memory_bytes)
        reasons.append(f"has {gb(room.mem_free)} GB of memory free (of {total}), needs {need}")
    else:
        reasons.append(f"has {gb(room.mem_free)} GB of memory, needs {need}")


def _cpu_words(room: Room, profile: Profile, reasons: list[str], notes: list[str]) -> None:
    if profile.cpu_cores is None:
        return
    if room.cpu_free is None:
        notes.append("CPU cores not reported")
        return
    if room.cpu_free >= profile.cpu_cores:
        return
    free = "free " if room.cpu_reserved else ""
    reasons.append(f"has {room.cpu_free} {free}CPU cores, needs {profile.cpu_cores}")


def _disk_words(
    room: Room, profile: Profile, weights_key: str | None, reasons: list[str], notes: list[str]
) -> None:
    if profile.disk_gb is None:
        return
    if room.has_weights(weights_key):
        notes.append("weights already here, disk not checked")
        return
    if room.disk_free is None:
        notes.append("disk not reported")
        return
    if room.disk_free < profile.disk_gb * GIB:
        reasons.append(f"has {gb(room.disk_free)} GB of disk free, needs {_num(profile.disk_gb)}")
