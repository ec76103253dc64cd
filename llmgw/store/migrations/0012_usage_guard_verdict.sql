-- The guardrails' verdict kept with the request's usage row (issue 26). Numbered 0012 by the lead.
--
-- JSON by stage, never the text that tripped a rule: {"input": {"action": "redact", "stage": "input",
-- "rules": ["pii/pii.email"]}, "output": {...}}. '' for a request no guardrail applied to, and for every row
-- written before this migration: nothing was checked then (absent, not "passed").
ALTER TABLE usage ADD COLUMN guard TEXT NOT NULL DEFAULT '';
