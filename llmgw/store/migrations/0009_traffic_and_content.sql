-- Traffic shapes and the one content-retention mechanism (issue 21). Numbered 0009 by the lead.
--
-- What a trace needs that a usage row did not carry: whether the request streamed (NULL: recorded before
-- this migration, unknown) and `prefix`, a salted hash of its session/prefix key (NULL: it had none, or it
-- was recorded before this migration). Never the content.
ALTER TABLE usage ADD COLUMN stream INTEGER;
ALTER TABLE usage ADD COLUMN prefix TEXT;

-- Per-minute aggregates, kept longer than the per-request rows they are made from (the controller folds a
-- row in when it prunes it). `source` is '' for what routers recorded, `import:<name>` for imported rows.
-- `peak_concurrency` NULL: unknown (a row merged from aggregates that did not know it), never zero.
CREATE TABLE IF NOT EXISTS usage_minutes (
    minute           DOUBLE PRECISION NOT NULL,
    model            TEXT NOT NULL,
    project          TEXT NOT NULL,
    source           TEXT NOT NULL DEFAULT '',
    requests         BIGINT NOT NULL,
    errors           BIGINT NOT NULL,
    tokens_in        BIGINT NOT NULL,
    tokens_out       BIGINT NOT NULL,
    cost             DOUBLE PRECISION NOT NULL,
    peak_concurrency BIGINT,
    PRIMARY KEY (minute, model, project, source)
);

-- Content a project opted in to keep (Responses `store`, a shared cache): sealed with AES-GCM under the
-- controller's content key (`key_id` names which, so a rotated key says so instead of failing to decrypt),
-- text of base64(nonce || ciphertext+tag), deleted at `expires_at`.
CREATE TABLE IF NOT EXISTS content (
    kind       TEXT NOT NULL,
    project    TEXT NOT NULL,
    id         TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    key_id     TEXT NOT NULL,
    sealed     TEXT NOT NULL,
    PRIMARY KEY (kind, project, id)
);
CREATE INDEX IF NOT EXISTS content_expires ON content (expires_at);
