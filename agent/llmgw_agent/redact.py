"""Redaction of engine output before it leaves the node (the tail in shard statuses, shown by the controller's
/api/v1/replicas and printed by `llmgw apply --wait` into CI logs).

Three rules: the exact secrets the agent handed the engine (its key, the values of secret-looking environment
variables) become `***`; so do bearer tokens, and values after secret-looking names in `name=value`,
`name: value` and `--name value` forms (SGLang logs its server_args, `api_key='...'` among them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

MASK = "***"
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|AUTH)", re.IGNORECASE)
_MIN_SECRET = 6  # shorter values are too likely to be ordinary words or numbers

_BEARER = re.compile(r"(?i)(\bbearer\s+)[^\s'\",]+")
_NAMED = re.compile(
    r"(?i)(\b[\w.-]*?(?:api[_-]?key|token|secret|passw(?:or)?d|credentials?)['\"]?\s*[=:]\s*['\"]?)"
    r"(?!none\b|null\b|\*\*\*|\d+\b)([^\s'\",}]+)"  # a bare number is a count or an id, not a secret
)
_FLAG = re.compile(r"(?i)(--(?:api[_-]?key|token|password|secret)[\w-]*(?:=|\s+))(?!\*\*\*)(\S+)")


def secret_values(*envs: Mapping[str, str], extra: Iterable[str | None] = ()) -> set[str]:
    """The values worth hiding: `extra` (the engine key) and values of secret-looking names in `envs`."""
    found = {v for v in extra if v and len(v) >= _MIN_SECRET}
    for env in envs:
        found |= {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= _MIN_SECRET}
    return found


def redactor(secrets: Iterable[str]) -> Callable[[str], str]:
    """A pure line filter: known secrets first (longest first, so a key containing another is whole), then
    the patterns."""
    ordered = sorted(set(secrets), key=len, reverse=True)

    def redact(line: str) -> str:
        for secret in ordered:
            line = line.replace(secret, MASK)
        line = _BEARER.sub(rf"\g<1>{MASK}", line)
        line = _FLAG.sub(rf"\g<1>{MASK}", line)
        return _NAMED.sub(rf"\g<1>{MASK}", line)

    return redact
