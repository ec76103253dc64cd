"""Judging answers: eval suites, `model check`'s probes, a canary's gates, guardrails."""
