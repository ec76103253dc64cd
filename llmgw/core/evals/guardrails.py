"""Guardrails, decided: the deterministic checks, the Llama Guard 3 prompt and the reading of its answer, and
what a guardrail does with what it found. Pure: text in, findings and verdicts out; the router (and
`llmgw guard test`) do the I/O around it, including asking the judge.

A finding names its rule the way a refusal and a usage row show it: `pii.email`, `regex[0]`, `keyword`,
`topic.NAME`, `max_prompt_chars`, `max_scan_chars`, `regex[0].deadline`, `judge`. The matched text itself is
never part of a finding: a refusal must not echo what it refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import regex

from llmgw.core.config.checks.regex_checks import bounded_work
from llmgw.core.config.specs.guardrail_spec import HAZARD_CODES, GuardrailSpec

__all__ = [
    "HAZARDS",
    "MAX_SCAN_CHARS",
    "PATTERN_DEADLINE_S",
    "CompiledGuardrail",
    "Finding",
    "JudgeAnswer",
    "Stage",
    "Turn",
    "Verdict",
    "compile_guardrail",
    "conversation_of",
    "decide",
    "judge_finding",
    "llama_guard_prompt",
    "luhn_ok",
    "parse_judge_answer",
    "redact",
    "redact_body",
    "refusal_message",
    "scan",
    "scan_limit",
    "texts_of",
    "token_prompt",
    "tool_arguments",
]

Stage = Literal["input", "output"]
Action = Literal["pass", "block", "redact", "warn", "unjudged"]

# Llama Guard 3's hazard categories (the MLCommons taxonomy), as its model card lists them.
HAZARDS: dict[str, str] = dict(
    zip(
        HAZARD_CODES,
        (
            "Violent Crimes",
            "Non-Violent Crimes",
            "Sex Crimes",
            "Child Exploitation",
            "Defamation",
            "Specialized Advice",
            "Privacy",
            "Intellectual Property",
            "Indiscriminate Weapons",
            "Hate",
            "Self-Harm",
            "Sexual Content",
            "Elections",
            "Code Interpreter Abuse",
        ),
        strict=True,
    )
)

# ------------------------------------------------------------------------------------------ PII shapes

# An e-mail address is found from its `@` outwards, each side a bounded run (RFC 5321's 64 and 255), so the
# scan is linear in the text: a pattern tried from every start position costs O(n^2) on a long run of
# local-part characters before one `@` (security review H7).
_LOCAL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
_LOCAL_MAX, _DOMAIN_MAX = 64, 255
_DOMAIN_RUN = re.compile(r"[A-Za-z0-9.-]*")
_TLD = re.compile(r"[A-Za-z]{2,}")
# An `@` that could be an address's: a local-part character before it, a label and a dot after it. Found in C;
# the lookahead's run ends at the next character outside a label, so each character is read a bounded number
# of times.
_AT = re.compile(r"(?<=[A-Za-z0-9._%+-])@(?=[A-Za-z0-9-]+\.)")
# 13 to 19 digits, optionally grouped by spaces or dashes; Luhn decides whether it is a card.
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
# US social security numbers and UK national insurance numbers: the shapes, not a registry check.
_NATIONAL_ID = re.compile(
    r"(?<!\d)(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?!\d)"
    r"|\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
)
# An international or national number: 8 to 15 digits with the usual separators.
_PHONE = re.compile(r"(?<![\w+])\+?\(?\d(?:[ ().-]{0,2}\d){7,14}(?!\w)")
_REPLACEMENT = {"email": "[EMAIL]", "phone": "[PHONE]", "card": "[CARD]", "national_id": "[NATIONAL_ID]"}
_PII_ORDER = ("card", "national_id", "phone", "email")  # a card is also a run of digits: it goes first


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every payment card number carries."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


_DIGIT = re.compile(r"\d")


def _domain_end(text: str, start: int) -> int | None:
    """Where an address's domain that begins at `start` ends (labels of letters, digits and `-` joined by
    dots, the last one beginning with two letters), or None: what `label(.label)*.tld` matches, greedily."""
    run = _DOMAIN_RUN.match(text, start, min(len(text), start + _DOMAIN_MAX))
    assert run is not None  # `*` matches the empty run
    labels = run.group().split("..", 1)[0]  # an empty label ends the domain
    if labels.startswith("."):
        return None
    dot = labels.rfind(".")
    while dot > 0:
        tld = _TLD.match(labels, dot + 1)
        if tld is not None:
            return start + tld.end()
        dot = labels.rfind(".", 0, dot)
    return None


def _email_spans(text: str) -> list[tuple[int, int]]:
    """Every e-mail address in `text`, found in one pass over its `@`s: O(len(text))."""
    spans: list[tuple[int, int]] = []
    floor = 0  # an address starts after the previous one ends
    for candidate in _AT.finditer(text):
        at = candidate.start()
        if at < floor:
            continue
        start, lowest = at, max(floor, at - _LOCAL_MAX)
        while start > lowest and text[start - 1] in _LOCAL_CHARS:
            start -= 1
        end = _domain_end(text, at + 1) if start < at else None
        if end is not None:
            spans.append((start, end))
            floor = end
    return spans


def _pii_spans(kind: str, text: str) -> list[tuple[int, int]]:
    # Cheap refusals first: every shape but an e-mail address holds digits, and an address holds `@`. Most
    # prompts have neither, and each pattern tried at every position costs microseconds per hundred chars.
    if "@" not in text if kind == "email" else _DIGIT.search(text) is None:
        return []
    if kind == "email":
        return _email_spans(text)
    if kind == "national_id":
        return [m.span() for m in _NATIONAL_ID.finditer(text)]
    if kind == "card":
        out = []
        for m in _CARD.finditer(text):
            digits = re.sub(r"\D", "", m.group())
            if 13 <= len(digits) <= 19 and luhn_ok(digits):
                out.append(m.span())
        return out
    return [m.span() for m in _PHONE.finditer(text) if 8 <= sum(c.isdigit() for c in m.group()) <= 15]


# ------------------------------------------------------------------------------------------ compiled


@dataclass(frozen=True, slots=True)
class Finding:
    guardrail: str
    rule: str
    redactable: bool = False  # PII, regex and keyword matches can be replaced; sizes, topics, a judge cannot
    hazards: tuple[str, ...] = ()


class Matcher(Protocol):
    """What a check needs of a pattern: whether it occurs, and the text with it replaced."""

    def search(self, text: str) -> object: ...
    def sub(self, repl: str, text: str) -> str: ...


@dataclass(frozen=True)
class CompiledGuardrail:
    """A guardrail's checks made once per snapshot: patterns compiled, phrases lowered."""

    name: str
    spec: GuardrailSpec
    patterns: tuple[tuple[str, Matcher], ...] = ()  # (rule, matcher): regex and keywords
    topics: tuple[tuple[str, Matcher], ...] = ()
    # Every repo regex tries a bounded number of ways at each position (regex_checks.bounded_work): a scan of
    # a short text takes microseconds, whatever the text.
    bounded: bool = True

    def checks(self, stage: Stage) -> bool:
        return stage in self.spec.stages


def _words(phrases: Iterable[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(p.strip()) for p in sorted(phrases, key=len, reverse=True) if p.strip())
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class _Phrases:
    """Whole words or phrases in any case, found with str.find on the lowered text: a regex alternation
    with lookarounds is tried at every position of the prompt (tens of microseconds per kilobyte), a find
    runs in C. The regex stays for replacing, and for a text whose lowering changes its length."""

    __slots__ = ("pattern", "phrases")

    def __init__(self, phrases: Iterable[str]) -> None:
        kept = [p for p in phrases if p.strip()]
        self.phrases = tuple(sorted({p.strip().lower() for p in kept}, key=len, reverse=True))
        self.pattern = _words(kept)

    def search(self, text: str) -> bool:
        lowered = text.lower()
        if len(lowered) != len(text):
            return self.pattern.search(text) is not None
        for phrase in self.phrases:
            i = lowered.find(phrase)
            while i >= 0:
                end = i + len(phrase)
                if (i == 0 or not _is_word(lowered[i - 1])) and (
                    end == len(lowered) or not _is_word(lowered[end])
                ):
                    return True
                i = lowered.find(phrase, i + 1)
        return False

    def sub(self, repl: str, text: str) -> str:
        return self.pattern.sub(repl, text) if self.search(text) else text


# The longest text a guardrail scans when it sets no `max_prompt_chars` (and for an answer): a longer one is a
# finding (`max_scan_chars`), never a tail passed unscanned. About 250k tokens: past most models' context.
MAX_SCAN_CHARS = 1_000_000
# How long one repo regex may take over one text. Python's `re` holds the GIL for a whole search, so a pattern
# that backtracks would freeze the process however it is run; `regex` stops at a deadline and lets go of the
# GIL while it matches. validate refuses the nested quantifiers that backtrack exponentially (regex_checks.py);
# this bounds what is left (a polynomial pattern over a long text).
PATTERN_DEADLINE_S = 0.25
# A text this short is searched by a regex of bounded work (regex_checks.bounded_work: a bounded number of
# ways tried at each position) without the deadline: it takes microseconds, and watching a deadline (a clock
# read as it goes) and letting go of the GIL cost more than the search. The router scans such a text on its
# event loop (llmgw_router.path.guard).
SHORT_TEXT_CHARS = 8192


class _RepoPattern:
    """A repo regex, searched with a deadline: one that does not finish is a finding of its own
    (`regex[N].deadline`, never a pass), and a text it cannot redact in time is redacted whole."""

    __slots__ = ("bounded", "compiled")

    def __init__(self, pattern: str) -> None:
        self.compiled = regex.compile(pattern)
        self.bounded = bounded_work(pattern)

    def search(self, text: str) -> object:
        if self.bounded and len(text) <= SHORT_TEXT_CHARS:
            return self.compiled.search(text)
        return self.compiled.search(text, timeout=PATTERN_DEADLINE_S, concurrent=True)

    def sub(self, repl: str, text: str) -> str:
        try:
            return str(self.compiled.sub(repl, text, timeout=PATTERN_DEADLINE_S, concurrent=True))
        except TimeoutError:
            return repl


def compile_guardrail(name: str, spec: GuardrailSpec) -> CompiledGuardrail:
    repo = [_RepoPattern(p) for p in spec.regex]
    patterns: list[tuple[str, Matcher]] = [(f"regex[{i}]", p) for i, p in enumerate(repo)]
    if any(k.strip() for k in spec.keywords):
        patterns.append(("keyword", _Phrases(spec.keywords)))
    topics = tuple(
        (f"topic.{topic}", _Phrases(words))
        for topic, words in spec.blocked_topics.items()
        if any(w.strip() for w in words)
    )
    return CompiledGuardrail(name, spec, tuple(patterns), topics, all(p.bounded for p in repo))


def scan(g: CompiledGuardrail, text: str, stage: Stage) -> list[Finding]:
    """The deterministic checks of `g` that `text` trips, in a fixed order (size, PII, patterns, topics)."""
    found: list[Finding] = []
    spec = g.spec
    rule, limit = scan_limit(spec, stage)
    if len(text) > limit:  # what is past the limit is not scanned: it is refused (block) or served as warned
        found.append(Finding(g.name, rule))
        text = text[:limit]
    if spec.pii and ("@" in text or _DIGIT.search(text) is not None):  # once, not once per shape
        found += [
            Finding(g.name, f"pii.{k}", True) for k in _PII_ORDER if k in spec.pii and _pii_spans(k, text)
        ]
    for name, p in g.patterns:
        try:
            if p.search(text):
                found.append(Finding(g.name, name, True))
        except TimeoutError:
            found.append(Finding(g.name, f"{name}.deadline"))
    found += [Finding(g.name, name) for name, p in g.topics if p.search(text)]
    return found


def scan_limit(spec: GuardrailSpec, stage: Stage) -> tuple[str, int]:
    """The rule a too-long text trips and the length scanned: the guardrail's `max_prompt_chars` for a
    prompt, MAX_SCAN_CHARS otherwise."""
    if stage == "input" and spec.max_prompt_chars is not None:
        return "max_prompt_chars", spec.max_prompt_chars
    return "max_scan_chars", MAX_SCAN_CHARS


def redact(g: CompiledGuardrail, text: str) -> str:
    """`text` with every PII, regex and keyword match of `g` replaced by a marker (`[EMAIL]`, `[REDACTED]`)."""
    for kind in _PII_ORDER:
        if kind in g.spec.pii:
            for start, end in reversed(_pii_spans(kind, text)):
                text = text[:start] + _REPLACEMENT[kind] + text[end:]
    for _rule, pattern in g.patterns:
        text = pattern.sub("[REDACTED]", text)
    return text


# ------------------------------------------------------------------------------------------ request text


def texts_of(body: dict[str, Any]) -> list[str]:
    """The text a chat or completions request sends: message contents (text parts of a list) or prompts."""
    out: list[str] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                out += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            calls = m.get("tool_calls") if isinstance(m, dict) else None
            out += tool_arguments(calls if isinstance(calls, list) else [])
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        out.append(prompt)
    elif isinstance(prompt, list):
        out += [p for p in prompt if isinstance(p, str)]
    return out


def tool_arguments(calls: list[Any]) -> list[str]:
    """The arguments of tool calls (`[{function: {name, arguments}}]`, as a message or a delta holds them):
    text a model writes and a tool acts on, screened like any other (M12)."""
    out: list[str] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            out.append(arguments)
    return out


def redact_body(guards: Sequence[CompiledGuardrail], body: dict[str, Any]) -> dict[str, Any]:
    """A copy of `body` with its texts redacted by each of `guards` in turn (the caller's body is kept)."""

    def clean(text: str) -> str:
        for g in guards:
            text = redact(g, text)
        return text

    out = dict(body)
    messages = body.get("messages")
    if isinstance(messages, list):
        new = []
        for m in messages:
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                m = {**m, "content": clean(m["content"])}
            elif isinstance(m, dict) and isinstance(m.get("content"), list):
                parts = [
                    {**p, "text": clean(p["text"])}
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                    else p
                    for p in m["content"]
                ]
                m = {**m, "content": parts}
            new.append(m)
        out["messages"] = new
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        out["prompt"] = clean(prompt)
    elif isinstance(prompt, list):
        out["prompt"] = [clean(p) if isinstance(p, str) else p for p in prompt]
    return out


# ------------------------------------------------------------------------------------------ Llama Guard 3

Turn = tuple[Literal["User", "Agent"], str]

_LLAMA_GUARD_HEAD = (
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
    "Task: Check if there is unsafe content in '{role}' messages in conversations according our safety "
    "policy with the below categories.\n\n"
    "<BEGIN UNSAFE CONTENT CATEGORIES>\n{categories}\n<END UNSAFE CONTENT CATEGORIES>\n\n"
    "<BEGIN CONVERSATION>\n\n{conversation}\n\n<END CONVERSATION>\n\n"
    "Provide your safety assessment for ONLY THE LAST {role} message in the above conversation:\n"
    " - First line must read 'safe' or 'unsafe'.\n"
    " - If unsafe, a second line must include a comma-separated list of violated categories. "
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)


def llama_guard_prompt(conversation: Sequence[Turn]) -> str:
    """The prompt Llama Guard 3 was trained on (its model card's template, every S1-S14 category listed),
    asking about the last turn: a `User` turn is an input check, an `Agent` turn an output check (with the
    user turns before it as context). Sent as a raw completion so no chat template changes a byte of it."""
    role = conversation[-1][0] if conversation else "User"
    categories = "\n".join(f"{code}: {name}." for code, name in HAZARDS.items())
    turns = "\n\n".join(f"{who}: {text}" for who, text in conversation)
    return _LLAMA_GUARD_HEAD.format(role=role, categories=categories, conversation=turns)


_CONTEXT_LABEL = {
    "system": "[system] ",
    "developer": "[system] ",
    "tool": "[tool result] ",
    "function": "[tool result] ",
}


def conversation_of(body: dict[str, Any], answer: str | None = None) -> list[Turn]:
    """The turns Llama Guard reads from a request, every role included (M12: a request written as a system
    or tool turn is judged too): assistant messages are Agent turns; user, system, developer and tool
    messages are User turns (the others labelled `[system]`, `[tool result]`), consecutive ones joined
    into one, so the turn judged last holds everything sent since the last answer. A completions prompt is
    one User turn; `answer` is the last Agent turn of an output check."""
    turns: list[Turn] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if not isinstance(m, dict):
                continue
            role = m.get("role")
            text = " ".join(texts_of({"messages": [m]}))
            if role == "assistant":
                turns.append(("Agent", text))
                continue
            text = _CONTEXT_LABEL.get(role, "") + text if isinstance(role, str) else text
            if turns and turns[-1][0] == "User":
                turns[-1] = ("User", turns[-1][1] + "\n\n" + text)
            else:
                turns.append(("User", text))
    else:
        turns += [("User", text) for text in texts_of(body)]
    if answer is not None:
        turns.append(("Agent", answer))
    return turns


def token_prompt(body: dict[str, Any]) -> bool:
    """Whether a completions prompt is given as token ids (a list of ints, or of lists of ints): text no
    check can read, so a guarded request refuses it."""
    prompt = body.get("prompt")
    return isinstance(prompt, list) and any(not isinstance(p, str) for p in prompt)


@dataclass(frozen=True, slots=True)
class JudgeAnswer:
    safe: bool
    hazards: tuple[str, ...] = ()  # codes as the judge wrote them (S1 ...), in its order


_CODE = re.compile(r"^S\d{1,2}$")


def parse_judge_answer(text: str) -> JudgeAnswer | None:
    """Llama Guard's answer: `safe`, or `unsafe` and a line of comma-separated categories (`unsafe\\nS1,S10`).
    None for anything else: an answer that cannot be read is no verdict (the guardrail's on_judge_error
    decides), never a silent `safe`."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    first = lines[0].lower()
    if first == "safe":
        return JudgeAnswer(True)
    if first != "unsafe":
        return None
    codes = tuple(c.strip().upper() for c in lines[1].split(",") if c.strip()) if len(lines) > 1 else ()
    if not all(_CODE.match(c) for c in codes):
        return None
    return JudgeAnswer(False, codes)


def judge_finding(g: CompiledGuardrail, answer: JudgeAnswer) -> Finding | None:
    """The finding a judge's answer makes for `g`: unsafe in a category `g` acts on. An unsafe answer naming
    only other categories is no finding (the caller records it)."""
    if answer.safe:
        return None
    wanted = g.spec.judge.categories if g.spec.judge is not None else None
    hazards = tuple(h for h in answer.hazards if wanted is None or h in wanted)
    if wanted is not None and not hazards:
        return None
    return Finding(g.name, "judge", False, hazards)


# ------------------------------------------------------------------------------------------ verdict


@dataclass(frozen=True)
class Verdict:
    """What the guardrails made of one request: the strongest action, and every finding behind it."""

    action: Action = "pass"
    stage: Stage = "input"
    findings: tuple[Finding, ...] = ()
    unjudged: tuple[str, ...] = field(default=())  # guardrails whose judge could not answer and failed open

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def record(self) -> dict[str, Any]:
        """The compact form kept with the usage row (never the matched text)."""
        out: dict[str, Any] = {"action": self.action, "stage": self.stage}
        if self.findings:
            out["rules"] = [f"{f.guardrail}/{f.rule}" for f in self.findings]
            hazards = sorted({h for f in self.findings for h in f.hazards}, key=lambda h: int(h[1:]))
            if hazards:
                out["hazards"] = hazards
        if self.unjudged:
            out["unjudged"] = list(self.unjudged)
        return out


_RANK: dict[Action, int] = {"pass": 0, "unjudged": 1, "warn": 2, "redact": 3, "block": 4}


def decide(
    guards: Sequence[CompiledGuardrail],
    findings: Sequence[Finding],
    stage: Stage,
    unjudged: Sequence[str] = (),
) -> Verdict:
    """The action for `findings`: each guardrail's mode decides for its own findings (redact turns into
    block for what cannot be redacted), and the strongest action of all wins (block > redact > warn)."""
    by_name = {g.name: g for g in guards}
    action: Action = "unjudged" if unjudged else "pass"
    for f in findings:
        mode = by_name[f.guardrail].spec.mode
        mine: Action = "block" if mode == "redact" and not f.redactable else mode
        if _RANK[mine] > _RANK[action]:
            action = mine
    ordered = sorted(findings, key=lambda f: -_RANK[_mode_of(by_name[f.guardrail], f)])
    return Verdict(action, stage, tuple(ordered), tuple(unjudged))


def _mode_of(g: CompiledGuardrail, f: Finding) -> Action:
    return "block" if g.spec.mode == "redact" and not f.redactable else g.spec.mode


def refusal_message(verdict: Verdict) -> str:
    """The words of a block: which guardrail and rule, the hazards a judge named; never the content."""
    f = verdict.first
    if f is None:
        return "Refused by a guardrail."
    where = "request" if verdict.stage == "input" else "answer"
    text = f"The {where} was blocked by guardrail `{f.guardrail}` (rule {f.rule})"
    if f.hazards:
        text += ": " + ", ".join(f"{h} {HAZARDS.get(h, '')}".strip() for h in f.hazards)
    return text + "."
