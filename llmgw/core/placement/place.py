"""Choosing nodes for replicas: a pure function of (models, nodes, current replicas).

Profiles are tried in the model's preference order; the first that fits wins. Among the nodes that fit:
- GPU replicas bin-pack: the node with the fewest free GPUs of the class that still fit, so whole nodes stay
  free for the large profiles that need them;
- CPU replicas spread: the node with the fewest replicas of this model, then the most free cores;
- either way a model's replicas go to different nodes where possible (it is the first key), then a node that
  already holds the weights, then the name, so the answer is the same every time.
A multi-node profile needs `nodes` nodes of one fabric, each fitting `gpus` GPUs: eight free cards split over
two fabrics are not eight cards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from llmgw.core.config.models import Profile
from llmgw.core.fleet.states import ACTIVE_STATES
from llmgw.core.fleet.views import ModelView, NodeView, ReplicaView
from llmgw.core.placement.facility import SPREAD_LEVELS, domain, power_book, spread_book
from llmgw.core.placement.quota import quota_refusal, quota_use, shard_need
from llmgw.core.placement.rooms import (
    NodeVerdict,
    Room,
    build_rooms,
    fit_check,
    gpus_needed,
    static_fits,
    verdict,
)


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    node: str
    rank: int
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one new replica goes, and why there."""

    replica_id: str
    model: str
    profile: str
    fingerprint: str
    shards: tuple[ShardPlacement, ...]
    why: str

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)

    def start_order(self) -> tuple[ShardPlacement, ...]:
        """Workers before rank 0: their ranks rendezvous, and the head must find them attached."""
        return tuple(sorted(self.shards, key=lambda s: (s.rank == 0, s.rank)))


@dataclass(frozen=True, slots=True)
class ProfileExplanation:
    profile: str
    verdicts: tuple[NodeVerdict, ...]
    summary: str  # e.g. "2 of 5 nodes fit", or why a multi-node profile has no fabric


@dataclass(frozen=True, slots=True)
class Explanation:
    """Per profile per node, accepted or rejected with reasons; and where one more replica would go."""

    model: str
    profiles: tuple[ProfileExplanation, ...]
    chosen: Placement | None
    problem: str = ""  # model-level reason (unknown model, no profiles)

    def rejections(self) -> dict[str, dict[str, str]]:
        """profile -> node -> reasons in words, for the rejected nodes only."""
        return {p.profile: {v.node: v.words() for v in p.verdicts if not v.accepted} for p in self.profiles}


@dataclass(frozen=True, slots=True)
class Unplaced:
    model: str
    missing: int  # replicas that could not be placed
    explanation: Explanation


@dataclass(frozen=True, slots=True)
class PlacementResult:
    placements: tuple[Placement, ...]
    unplaced: tuple[Unplaced, ...]


_ALONE = (0,) * (
    1 + len(SPREAD_LEVELS)
)  # a ranking's crowd part for a room with no replica of the model on its node, rack or PDU

IdFactory = Callable[[str, str], str]  # (model, profile) -> new replica id


def sequential_ids(existing: Iterable[str]) -> IdFactory:
    """Deterministic ids `model-profile-N`, never one already in use."""
    used = set(existing)
    counters: dict[str, int] = {}

    def new_id(model: str, profile: str) -> str:
        stem = f"{model}-{profile}"
        n = counters.get(stem, 0)
        while True:
            n += 1
            candidate = f"{stem}-{n}"
            if candidate not in used:
                counters[stem] = n
                used.add(candidate)
                return candidate

    return new_id


class Placer:
    """One placement pass: rooms built once, each placement taken out of them before the next."""

    def __init__(
        self,
        models: Mapping[str, ModelView],
        nodes: Iterable[NodeView],
        replicas: Iterable[ReplicaView],
        new_id: IdFactory | None = None,
    ) -> None:
        replicas = tuple(replicas)
        self.models = models
        self.rooms: dict[str, Room] = build_rooms(nodes, replicas, models)
        self._ordered = list(self.rooms.values())
        self._static: dict[tuple[object, ...], tuple[list[Room], frozenset[str]]] = {}
        # GPU class -> free count -> rooms: bin-packing looks at the fullest rooms first and can stop there.
        self._buckets: dict[str, dict[int, dict[str, Room]]] = {}
        for room in self._ordered:
            for cls, free in room.free_gpus.items():
                if cls is not None:
                    self._buckets.setdefault(cls, {}).setdefault(len(free), {})[room.name] = room
        self.new_id = new_id or sequential_ids(r.id for r in replicas)
        self.quota = quota_use(models, replicas)
        views = {name: room.node for name, room in self.rooms.items()}
        self.spread = spread_book(views, replicas)
        self.power = power_book(views.values(), replicas)

    use_buckets = True  # tests turn it off to hold the bucketed search to the plain one

    # ------------------------------------------------------------------------------------------ placing

    def place_one(self, model: str) -> Placement | None:
        """Place one more replica of `model`, taking its room; None when no profile fits anywhere."""
        entry = self.models.get(model)
        if entry is None:
            return None
        wkey = entry.weights_key
        for profile in entry.spec.profiles:
            if quota_refusal(entry, profile, self.quota) is not None:
                continue
            chosen = self._choose(model, profile, wkey)
            if chosen is None:
                continue
            rooms, gpus, why = chosen
            warned = {r.node.engine_warnings.get(profile.engine) for r in rooms} - {None}
            if warned and profile.gpu_class is None:  # said where the replica is planned and started
                why += "; warning: " + "; ".join(sorted(w for w in warned if w))
            shards = tuple(
                ShardPlacement(r.name, rank, g) for rank, (r, g) in enumerate(zip(rooms, gpus, strict=True))
            )
            for room, taken in zip(rooms, gpus, strict=True):
                self.take(room, model, profile, taken, wkey)
            self.spread.add(model, [r.node for r in rooms])
            return Placement(
                replica_id=self.new_id(model, profile.name),
                model=model,
                profile=profile.name,
                fingerprint=entry.fingerprints.get(profile.name, ""),
                shards=shards,
                why=why,
            )
        return None

    def take(self, room: Room, model: str, profile: Profile, gpus: tuple[int, ...], wkey: str | None) -> None:
        """Take one shard's resources out of `room` (and count its GPUs against the model's quotas and its
        domains' power caps)."""
        before = {cls: len(free) for cls, free in room.free_gpus.items()}
        room.take(model, profile, gpus, wkey)
        self._rebucket(room, before)
        self.power.take(room.node, profile.gpu_class, len(gpus))
        self.quota.add(self.models[model], *shard_need(profile, len(gpus)))

    def replace_room(self, room: Room) -> None:
        """Put `room` (a changed copy of one of this pass's rooms, see placement.preempt) in its place."""
        old = self.rooms[room.name]
        before = {cls: len(free) for cls, free in old.free_gpus.items()}
        self.rooms[room.name] = room
        self._ordered = [room if r.name == room.name else r for r in self._ordered]
        for cls, count in before.items():
            if cls is not None:
                self._buckets.get(cls, {}).get(count, {}).pop(room.name, None)
        for cls, free in room.free_gpus.items():
            if cls is not None:
                self._buckets.setdefault(cls, {}).setdefault(len(free), {})[room.name] = room

    def _rebucket(self, room: Room, before: Mapping[str | None, int]) -> None:
        for cls, free in room.free_gpus.items():
            if cls is None or before.get(cls) == len(free):
                continue
            buckets = self._buckets[cls]
            buckets[before[cls]].pop(room.name, None)
            buckets.setdefault(len(free), {})[room.name] = room

    def _static_fit(self, profile: Profile) -> tuple[list[Room], frozenset[str]]:
        """The rooms passing the filters that do not change in a pass, once per profile shape."""
        key = (
            profile.engine,
            profile.engine_version,
            tuple(sorted(profile.node_selector.items())),
            profile.gpu_class,
            gpus_needed(profile),
        )
        found = self._static.get(key)
        if found is None:
            rooms = [r for r in self._ordered if static_fits(r.node, profile)]
            found = (rooms, frozenset(r.name for r in rooms))
            self._static[key] = found
        return found

    def _fit_check(self, profile: Profile, wkey: str | None) -> Callable[[Room], bool]:
        """The room's own filters (rooms.fit_check), then its domains' power caps."""
        fits = fit_check(profile, wkey)
        if not self.power.caps:
            return fits
        need = gpus_needed(profile)
        cls = profile.gpu_class
        refusal = self.power.refusal

        def fits_here(room: Room) -> bool:
            return fits(room) and refusal(room.node, cls, need) is None

        return fits_here

    def _candidates(self, profile: Profile, wkey: str | None) -> list[Room]:
        fits = self._fit_check(profile, wkey)
        return [r for r in self._static_fit(profile)[0] if fits(r)]

    def _binpack_one(self, model: str, profile: Profile, wkey: str | None) -> Room | None:
        """The room `min(candidates, key=binpack)` would give, looking at the fullest rooms first: a room
        without a replica of this model in the lowest bucket that has one cannot be beaten further up."""
        assert profile.gpu_class is not None
        static = self._static_fit(profile)[1]
        fits = self._fit_check(profile, wkey)
        rank = self._ranking(model, profile, wkey)
        buckets = self._buckets.get(profile.gpu_class, {})
        best: tuple[tuple[object, ...], Room] | None = None
        for count in sorted(c for c in buckets if c >= gpus_needed(profile)):
            for room in buckets[count].values():
                if room.name in static and fits(room):
                    key = rank(room)
                    if best is None or key < best[0]:
                        best = (key, room)
            if best is not None and best[0][0] == _ALONE:  # alone on its node, rack and PDU
                break
        return None if best is None else best[1]

    def _choose(
        self, model: str, profile: Profile, wkey: str | None
    ) -> tuple[list[Room], list[tuple[int, ...]], str] | None:
        rank = self._ranking(model, profile, wkey)
        if profile.nodes == 1 and profile.gpu_class is not None and self.use_buckets:
            room = self._binpack_one(model, profile, wkey)
            if room is None:
                return None
            rooms = [room]
        else:
            candidates = self._candidates(profile, wkey)
            if not candidates:
                return None
            if profile.nodes > 1:
                picked = self._pick_group(candidates, profile, rank)
                if picked is None:
                    return None
                rooms = picked
            else:
                rooms = [min(candidates, key=rank)]
        gpus = [_pick_gpus(r, profile) for r in rooms]
        return rooms, gpus, self._why(model, profile, rooms, wkey)

    # ------------------------------------------------------------------------------------------ ranking

    def _ranking(
        self, model: str, profile: Profile, wkey: str | None
    ) -> Callable[[Room], tuple[object, ...]]:
        """The sort key among rooms that fit. Its first part says how crowded the room is with the model:
        its replicas on the node, then in the node's rack, then its PDU (all zero: nothing beats it)."""
        spread = self.spread
        if gpus_needed(profile):
            cls = profile.gpu_class

            def binpack(r: Room) -> tuple[object, ...]:
                free = len(r.free_gpus.get(cls) or ()) if cls is not None else r.free_gpu_count(None)
                crowd = (r.per_model.get(model, 0), *spread.key(model, r.node))
                return (crowd, free, not r.has_weights(wkey), r.name)

            return binpack

        def spread_cpu(r: Room) -> tuple[object, ...]:
            cores = r.cpu_free
            return (
                (r.per_model.get(model, 0), *spread.key(model, r.node)),
                cores is None,  # a node that said how many cores it has ranks before one that did not
                -(cores or 0),
                not r.has_weights(wkey),
                r.name,
            )

        return spread_cpu

    def _pick_group(
        self, candidates: list[Room], profile: Profile, rank: Callable[[Room], tuple[object, ...]]
    ) -> list[Room] | None:
        """`profile.nodes` rooms of one fabric (and of one `keep_within` domain), the best ranked group whose
        shards together keep their domains within their power caps."""
        count = profile.nodes
        groups: dict[tuple[str, str], list[Room]] = {}
        for room in candidates:
            key = _group_key(room, profile)
            if key is not None:
                groups.setdefault(key, []).append(room)
        best: tuple[tuple[object, ...], list[Room]] | None = None
        for key in sorted(groups):
            rooms = sorted(groups[key], key=rank)[:count]
            if len(rooms) < count or self._group_power(rooms, profile) is not None:
                continue
            score = (tuple(rank(r) for r in rooms), key)
            if best is None or score < best[0]:
                best = (score, rooms)
        return None if best is None else best[1]

    def _group_power(self, rooms: list[Room], profile: Profile) -> str | None:
        """Why these shards together would take a domain past its cap (each alone may fit); None when not."""
        need = gpus_needed(profile)
        extra: dict[str, float] = {}
        for room in rooms:
            node = room.node
            shared = max((extra.get(ref, 0.0) for ref in node.power_caps), default=0.0)
            refusal = self.power.refusal(node, profile.gpu_class, need, shared)
            if refusal is not None:
                return refusal
            watts = self.power.shard_watts(node, profile.gpu_class, need) or 0.0
            for ref in node.power_caps:
                extra[ref] = extra.get(ref, 0.0) + watts
        return None

    def _why(self, model: str, profile: Profile, rooms: list[Room], wkey: str | None) -> str:
        """Why these nodes, in words (computed before the room is taken)."""
        room = rooms[0]
        need = gpus_needed(profile)
        others = room.per_model.get(model, 0)
        if need:
            cls = profile.gpu_class or "GPUs"
            if len(rooms) > 1:
                within = ""
                if profile.keep_within is not None:
                    within = f", all in {profile.keep_within} {domain(room.node.labels, profile.keep_within)}"
                text = (
                    f"bin-pack: fabric {room.node.fabric} has {len(rooms)} nodes with {need} free {cls} "
                    f"each{within}"
                )
            else:
                free = room.free_gpu_count(profile.gpu_class)
                text = f"bin-pack: fewest free {cls} that fit ({free} free, needs {need})"
        else:
            text = f"spread: {others} replicas of {model} there"
            if room.cpu_free is not None:
                text += f", {room.cpu_free} free CPU cores"
        if need and others:
            text += f"; {others} replicas of {model} there already (no node without one fits)"
        crowded = self.spread.crowded(model, [r.node for r in rooms])
        if crowded:
            text += f"; spread yields: {', '.join(crowded)} (no node fits in a rack or PDU without one)"
        if room.has_weights(wkey):
            text += "; weights already there"
        notes = sorted({n for r in rooms for n in self._verdict(r, profile, wkey).notes})
        if notes:
            text += f" ({'; '.join(notes)})"
        return text

    def _verdict(self, room: Room, profile: Profile, wkey: str | None) -> NodeVerdict:
        """rooms.verdict, with the domains' power caps (and what they could not count)."""
        v = verdict(room, profile, wkey)
        need = gpus_needed(profile)
        refusal = self.power.refusal(room.node, profile.gpu_class, need)
        if refusal is not None:
            return NodeVerdict(v.node, False, (*v.reasons, refusal), v.notes)
        if v.accepted:
            notes = self.power.notes(room.node, profile.gpu_class, need)
            if notes:
                return NodeVerdict(v.node, True, v.reasons, (*v.notes, *notes))
        return v

    # ------------------------------------------------------------------------------------------ explaining

    def explain(self, model: str) -> Explanation:
        """Every profile against every node, without taking anything; and where one more would go."""
        entry = self.models.get(model)
        if entry is None:
            return Explanation(model, (), None, problem="not in the catalog")
        if not entry.spec.profiles:
            return Explanation(model, (), None, problem="has no profiles (served by a provider)")
        if not self.rooms:
            return Explanation(model, (), None, problem="no node has been seen")
        wkey = entry.weights_key
        profiles = tuple(self._explain_profile(model, entry, p, wkey) for p in entry.spec.profiles)
        chosen = None
        for profile in entry.spec.profiles:
            if quota_refusal(entry, profile, self.quota) is not None:
                continue
            found = self._choose(model, profile, wkey)
            if found is not None:
                rooms, gpus, why = found
                shards = tuple(
                    ShardPlacement(r.name, i, g) for i, (r, g) in enumerate(zip(rooms, gpus, strict=True))
                )
                fingerprint = entry.fingerprints.get(profile.name, "")
                chosen = Placement("(next)", model, profile.name, fingerprint, shards, why)
                break
        return Explanation(model, profiles, chosen)

    def _explain_profile(
        self, model: str, entry: ModelView, profile: Profile, wkey: str | None
    ) -> ProfileExplanation:
        verdicts = [self._verdict(r, profile, wkey) for r in self._ordered]
        fit = [v for v in verdicts if v.accepted]
        refusal = quota_refusal(entry, profile, self.quota)
        if refusal is not None:  # no node can take it, whatever each has free
            verdicts = [NodeVerdict(v.node, False, (*v.reasons, refusal), v.notes) for v in verdicts]
            return ProfileExplanation(profile.name, tuple(verdicts), refusal)
        if profile.nodes <= 1:
            summary = f"{len(fit)} of {len(verdicts)} nodes fit"
            return ProfileExplanation(profile.name, tuple(verdicts), summary)
        return self._explain_group(model, profile, verdicts)

    def _explain_group(self, model: str, profile: Profile, verdicts: list[NodeVerdict]) -> ProfileExplanation:
        """A multi-node profile: a node that fits but has no fabric (or no label of its `keep_within` level)
        cannot join; say so on the node, and count what each fabric (and domain) has."""
        within = profile.keep_within
        groups: dict[tuple[str, str], list[Room]] = {}
        out: list[NodeVerdict] = []
        for v in verdicts:
            room = self.rooms[v.node]
            if v.accepted and room.node.fabric is None:
                reason = f"no fabric declared, a {profile.nodes}-node replica needs one"
                v = NodeVerdict(v.node, False, (reason,), v.notes)
            elif v.accepted and within is not None and domain(room.node.labels, within) is None:
                reason = f"no llmgw.io/{within} label: keep_within {within} needs to know where it stands"
                v = NodeVerdict(v.node, False, (reason,), v.notes)
            elif v.accepted:
                key = _group_key(room, profile)
                assert key is not None
                groups.setdefault(key, []).append(room)
            out.append(v)
        parts: list[str] = []
        for (fabric, value), rooms in sorted(groups.items()):
            where = f"{fabric} {within} {value}" if within is not None else fabric
            text = f"{where} has {len(rooms)}"
            if len(rooms) >= profile.nodes:
                ranked = sorted(rooms, key=self._ranking(model, profile, None))[: profile.nodes]
                power = self._group_power(ranked, profile)
                if power is not None:
                    text += f" (together: {power})"
            parts.append(text)
        one = "one fabric" if within is None else f"one fabric and one {within}"
        summary = f"needs {profile.nodes} nodes of {one} that fit: {', '.join(parts) or 'none has any'}"
        return ProfileExplanation(profile.name, tuple(out), summary)


def _group_key(room: Room, profile: Profile) -> tuple[str, str] | None:
    """(fabric, keep_within domain) a room of a multi-node replica belongs to; None when it can join none."""
    fabric = room.node.fabric
    if fabric is None:
        return None
    if profile.keep_within is None:
        return fabric, ""
    value = domain(room.node.labels, profile.keep_within)
    return None if value is None else (fabric, value)


def _pick_gpus(room: Room, profile: Profile) -> tuple[int, ...]:
    need = gpus_needed(profile)
    if not need:
        return ()
    if profile.gpu_class is not None:
        free = room.free_gpus.get(profile.gpu_class, [])
    else:
        free = sorted(i for v in room.free_gpus.values() for i in v)
    return tuple(free[:need])


# ---------------------------------------------------------------------------------------------- entry points


def active_count(model: str, replicas: Iterable[ReplicaView], lost_nodes: frozenset[str]) -> int:
    """Replicas of `model` that are running or on their way, not failed, not on a Lost node."""
    return sum(
        1
        for r in replicas
        if r.model == model
        and r.effective_state() in ACTIVE_STATES
        and not any(s.node in lost_nodes for s in r.shards)
    )


def place(
    models: Mapping[str, ModelView],
    nodes: Iterable[NodeView],
    replicas: Iterable[ReplicaView],
    wanted: Mapping[str, int] | None = None,
    new_id: IdFactory | None = None,
) -> PlacementResult:
    """Place new replicas: `wanted` per model (default: what is missing to reach scaling.min).

    Models in name order, one replica of each per round, so a large model early in the alphabet does not
    take the room of every model after it.
    """
    nodes = tuple(nodes)
    replicas = tuple(replicas)
    if wanted is None:
        lost = frozenset(n.name for n in nodes if n.state == "Lost")
        wanted = {m: max(0, e.spec.scaling.min - active_count(m, replicas, lost)) for m, e in models.items()}
    placer = Placer(models, nodes, replicas, new_id)
    remaining = {m: n for m, n in sorted(wanted.items()) if n > 0 and m in models}
    placements: list[Placement] = []
    failed: dict[str, int] = {}
    while remaining:
        for model in list(remaining):
            placement = placer.place_one(model)
            if placement is None:
                failed[model] = remaining.pop(model)
                continue
            placements.append(placement)
            remaining[model] -= 1
            if remaining[model] == 0:
                del remaining[model]
    unplaced = tuple(Unplaced(m, n, placer.explain(m)) for m, n in sorted(failed.items()))
    return PlacementResult(tuple(placements), unplaced)


def explain(
    model: str,
    models: Mapping[str, ModelView],
    nodes: Iterable[NodeView],
    replicas: Iterable[ReplicaView],
) -> Explanation:
    """For `llmgw explain MODEL`: every profile against every node, with reasons, and the node it would pick."""
    return Placer(models, nodes, replicas).explain(model)
