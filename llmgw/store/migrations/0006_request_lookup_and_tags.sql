-- One request, end to end, and its tags (issue 22). Numbered 0006 by the lead (0005 belongs to another part).
--
-- What `llmgw request ID` shows besides the tokens and cost already kept: the endpoint (replica) that served,
-- the time spent waiting for one (queue_ms), the time to the first streamed bytes (ttft_ms: NULL for an
-- answer sent whole, or one that never began: unknown is not zero), the endpoints that failed first and why
-- (`attempts`, JSON), and a compact scheduling decision (JSON: the winner, the picker, the scorer that
-- decided, every candidate's total score, the filters' drops). Rows written before this migration read as
-- '' / NULL: nothing was recorded then.
ALTER TABLE usage ADD COLUMN endpoint TEXT NOT NULL DEFAULT '';
ALTER TABLE usage ADD COLUMN queue_ms DOUBLE PRECISION;
ALTER TABLE usage ADD COLUMN ttft_ms DOUBLE PRECISION;
ALTER TABLE usage ADD COLUMN attempts TEXT NOT NULL DEFAULT '';
ALTER TABLE usage ADD COLUMN decision TEXT NOT NULL DEFAULT '';
ALTER TABLE usage ADD COLUMN code TEXT NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS usage_request_id ON usage (request_id);

-- A request's tags (from its `metadata`, the x-llmgw-tags header and the `user` field), one row per tag, so
-- `llmgw usage --by tag:KEY` is one join on both databases (no JSON functions, which differ between them). A
-- request without the tag joins to NULL: absent, never an empty value (empty values are refused).
CREATE TABLE IF NOT EXISTS usage_tags (
    usage_id TEXT NOT NULL REFERENCES usage (id),
    key      TEXT NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (usage_id, key)
);
CREATE INDEX IF NOT EXISTS usage_tags_key_value ON usage_tags (key, value);
