-- Revision history becomes append-only: one row per time a revision was applied or refused, with who did it.
-- `revisions` kept one row per label and overwrote it (ON CONFLICT (sha) DO UPDATE), so a rollback A -> B -> A
-- lost A's first application and a label reused by an admin apply replaced a real commit's row.
-- `id` is made by the application before the first attempt, so a retried write is recognised, not doubled.
-- `actor` is who the controller authenticated: `controller` (it followed its source) or an admin token's
-- name. `actor_detail` is what the client said about itself (e.g. `github-run:123`), recorded, not trusted.

CREATE TABLE IF NOT EXISTS revision_events (
    id           TEXT PRIMARY KEY,
    revision     TEXT NOT NULL,
    source       TEXT NOT NULL,
    applied_at   DOUBLE PRECISION NOT NULL,
    actor        TEXT NOT NULL,
    actor_detail TEXT NOT NULL DEFAULT '',
    status       TEXT NOT NULL CHECK (status IN ('accepted', 'refused')),
    errors       TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS revision_events_applied_at ON revision_events (applied_at);

-- What the old table held survives as the first events (its one row per label is all that is left of it).
INSERT INTO revision_events (id, revision, source, applied_at, actor, actor_detail, status, errors)
    SELECT 'rev_migrated_' || sha, sha, source, applied_at, applied_by, '', status, errors FROM revisions;

DROP TABLE revisions;
