"""One replica's sequences advanced in virtual time by its `EngineModel` (see that module for the equations).

Each sequence goes through three phases: its own share of the prefill (side by side with the others), then
the exclusive share (first come, first served: while it runs nothing else on the replica advances), then its
first token and the rest of its completion, a token every `itl(k)` ms with k sequences decoding. Pure and
clock-free: the caller says when a sequence arrives and how far to advance, and collects what happened.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from llmgw.core.capacity.engine_model import EngineModel

__all__ = ["EngineRun", "RunEvent"]

_EPS = 1e-9  # ms: what is left below this is done (float sums of the same quantities differ in the last bit)


@dataclass(frozen=True, slots=True)
class RunEvent:
    key: int
    kind: str  # "first": its first token; "end": its last
    at_ms: float


@dataclass(slots=True)
class _Seq:
    key: int
    exclusive_ms: float  # the share that holds the replica, left
    tokens: float  # decode tokens after the first


class EngineRun:
    """The sequences on one replica. Decoding sequences all advance at one rate, so each keeps the point of
    a shared token count at which it ends (`_done`); the own-slot shares end at fixed times (`_own`)."""

    def __init__(self, model: EngineModel) -> None:
        self.model = model
        self.now_ms = 0.0
        self._own: list[tuple[float, int, _Seq]] = []  # (when its own share ends, order, it)
        self._queue: deque[_Seq] = deque()  # waiting for (the head: in) the exclusive share
        self._decoding: list[tuple[float, int, int]] = []  # (shared token count at its end, order, key)
        self._tokens = 0.0  # tokens each decoding sequence has made so far, shared
        self._events: list[RunEvent] = []
        self._order = 0
        self._itl = [model.itl(k) for k in range(max(2, model.capacity) * 2 + 1)]

    @property
    def sequences(self) -> int:
        return len(self._own) + len(self._queue) + len(self._decoding)

    def add(self, at_ms: float, key: int, prompt_tokens: int, completion_tokens: int) -> None:
        """A sequence arrives at `at_ms` (not before the run's clock: what happened up to then is advanced)."""
        self.advance(at_ms)
        prefill = self.model.prefill_ms(prompt_tokens, self.sequences)
        share = self.model.exclusive
        seq = _Seq(key, prefill * share, float(max(0, completion_tokens - 1)))
        own = prefill * (1 - share)
        if own > _EPS:
            self._order += 1
            heapq.heappush(self._own, (self.now_ms + own, self._order, seq))
        else:
            self._exclusive(seq)

    def take(self) -> list[RunEvent]:
        """The events since the last take, in time order."""
        out, self._events = self._events, []
        return out

    def next_ms(self) -> float | None:
        """When the next event happens if nothing arrives; None: nothing in flight."""
        step = self._step_ms()
        return None if step is None else self.now_ms + step

    def advance(self, until_ms: float) -> None:
        # An event the caller scheduled at next_ms() must happen when advanced to it, though the time came
        # back through another unit: a day is 8.6e7 ms, where one float step is 1.5e-8 ms.
        slack = _EPS + abs(until_ms) * 1e-12
        while True:
            step = self._step_ms()
            if step is None or self.now_ms + step > until_ms + slack:
                self._progress(max(0.0, until_ms - self.now_ms))
                self.now_ms = max(self.now_ms, until_ms)
                return
            self._progress(step)
            self.now_ms += step
            self._settle()

    def _gap(self) -> float:
        k = len(self._decoding)
        return self._itl[k] if k < len(self._itl) else self.model.itl(k)

    def _step_ms(self) -> float | None:
        """Time to the nearest phase change."""
        step = self._own[0][0] - self.now_ms if self._own else None
        if self._queue:
            other = self._queue[0].exclusive_ms
        elif self._decoding:
            other = (self._decoding[0][0] - self._tokens) * self._gap()
        else:
            return None if step is None else max(0.0, step)
        return max(0.0, other if step is None else min(step, other))

    def _progress(self, ms: float) -> None:
        if self._queue:
            self._queue[0].exclusive_ms -= ms
        elif self._decoding and ms > 0:
            self._tokens += ms / self._gap()

    def _settle(self) -> None:
        """Move every sequence whose phase is done on to its next one."""
        # Tolerances grow with the shared count and the clock: a week of them is past where a float keeps
        # _EPS, and a step too small to move them must still count as done.
        tokens_slack, ms_slack = _EPS + self._tokens * 1e-12, _EPS + abs(self.now_ms) * 1e-12
        while self._decoding and self._decoding[0][0] - self._tokens <= tokens_slack:
            self._events.append(RunEvent(heapq.heappop(self._decoding)[2], "end", self.now_ms))
        while self._queue and self._queue[0].exclusive_ms <= _EPS:
            self._first(self._queue.popleft())
        while self._own and self._own[0][0] - self.now_ms <= ms_slack:
            self._exclusive(heapq.heappop(self._own)[2])

    def _exclusive(self, seq: _Seq) -> None:
        if seq.exclusive_ms > _EPS:
            self._queue.append(seq)
        else:
            self._first(seq)

    def _first(self, seq: _Seq) -> None:
        self._events.append(RunEvent(seq.key, "first", self.now_ms))
        if seq.tokens > _EPS:
            self._order += 1
            heapq.heappush(self._decoding, (self._tokens + seq.tokens, self._order, seq.key))
        else:
            self._events.append(RunEvent(seq.key, "end", self.now_ms))
