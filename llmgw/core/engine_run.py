"""One replica's sequences advanced in virtual time by its `EngineModel` (see that module for the equations).

Each sequence goes through three phases: its own share of the prefill (side by side with the others), then
the exclusive share (first come, first served: while it runs nothing else on the replica advances), then its
first token and the rest of its completion, a token every `itl(k)` ms with k sequences decoding. Pure and
clock-free: the caller says when a sequence arrives and how far to advance, and collects what happened.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llmgw.core.engine_model import EngineModel

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
    own_ms: float  # the prefill's share in the sequence's own slot, left
    exclusive_ms: float  # the share that holds the replica, left
    tokens: float  # decode tokens left after the first


@dataclass
class EngineRun:
    model: EngineModel
    now_ms: float = 0.0
    _own: list[_Seq] = field(default_factory=list)  # in the own-slot share of their prefill
    _queue: deque[_Seq] = field(default_factory=deque)  # waiting for (the head: in) the exclusive share
    _decoding: list[_Seq] = field(default_factory=list)
    _events: list[RunEvent] = field(default_factory=list)

    @property
    def sequences(self) -> int:
        return len(self._own) + len(self._queue) + len(self._decoding)

    def add(self, at_ms: float, key: int, prompt_tokens: int, completion_tokens: int) -> None:
        """A sequence arrives at `at_ms` (not before the run's clock: what happened up to then is advanced)."""
        self.advance(at_ms)
        prefill = self.model.prefill_ms(prompt_tokens)
        share = self.model.exclusive
        seq = _Seq(key, prefill * (1 - share), prefill * share, float(max(0, completion_tokens - 1)))
        self._next_phase(seq)

    def take(self) -> list[RunEvent]:
        """The events since the last take, in time order."""
        out, self._events = self._events, []
        return out

    def next_ms(self) -> float | None:
        """When the next event happens if nothing arrives; None: nothing in flight."""
        step = self._step_ms()
        return None if step is None else self.now_ms + step

    def advance(self, until_ms: float) -> None:
        while True:
            step = self._step_ms()
            if step is None or self.now_ms + step > until_ms + _EPS:
                self._progress(max(0.0, until_ms - self.now_ms))
                self.now_ms = max(self.now_ms, until_ms)
                return
            self._progress(step)
            self.now_ms += step
            self._settle()

    def _step_ms(self) -> float | None:
        """Time to the nearest phase change."""
        steps = [s.own_ms for s in self._own]
        if self._queue:
            steps.append(self._queue[0].exclusive_ms)
        elif self._decoding:
            steps.append(min(s.tokens for s in self._decoding) * self.model.itl(len(self._decoding)))
        return max(0.0, min(steps)) if steps else None

    def _progress(self, ms: float) -> None:
        for s in self._own:
            s.own_ms -= ms
        if self._queue:
            self._queue[0].exclusive_ms -= ms
        elif self._decoding and ms > 0:
            tokens = ms / self.model.itl(len(self._decoding))
            for s in self._decoding:
                s.tokens -= tokens

    def _settle(self) -> None:
        """Move every sequence whose phase is done on to its next one."""
        done = [s for s in self._own if s.own_ms <= _EPS]
        self._own = [s for s in self._own if s.own_ms > _EPS]
        while self._queue and self._queue[0].exclusive_ms <= _EPS:
            done.append(self._queue.popleft())
        finished = [s for s in self._decoding if s.tokens <= _EPS]
        self._decoding = [s for s in self._decoding if s.tokens > _EPS]
        for s in finished:
            self._events.append(RunEvent(s.key, "end", self.now_ms))
        for s in done:
            self._next_phase(s)

    def _next_phase(self, seq: _Seq) -> None:
        if seq.own_ms > _EPS:
            self._own.append(seq)
        elif seq.exclusive_ms > _EPS:
            self._queue.append(seq)
        else:
            self._events.append(RunEvent(seq.key, "first", self.now_ms))
            if seq.tokens > _EPS:
                self._decoding.append(seq)
            else:
                self._events.append(RunEvent(seq.key, "end", self.now_ms))
