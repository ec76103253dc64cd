-- What a commit set in motion, kept in the store so whichever controller leads next resumes it (issue 39).
-- Numbered 0017 by the continuity branch (0016 is the concurrency slots'); renumber at merge if another part took it.
--
-- A replica's part in a roll: the replica it was started to take the place of (a surge beside it, not one
-- more), and whether an operator asked for its restart (`llmgw restart`). NULL / 0: neither.
ALTER TABLE replicas ADD COLUMN replaces TEXT;
ALTER TABLE replicas ADD COLUMN restart_asked BIGINT NOT NULL DEFAULT 0;

-- Each canary model's run: its phase (running, promoted, failed), the fingerprints it tries, the stable
-- replicas' counts when it began, its canary replicas, verdict and eval results (`run`, JSON), and the stable
-- profiles it rolls back to (`stable`, JSON: the profiles the model had before the change, so a held model's
-- crashed stable replica comes back as it was). One row per model, replaced as the run moves on.
CREATE TABLE IF NOT EXISTS canary_runs (
    model      TEXT PRIMARY KEY,
    run        TEXT NOT NULL,
    stable     TEXT NOT NULL DEFAULT '',
    updated_at DOUBLE PRECISION NOT NULL
);

-- Commit statuses not yet taken by the forge: written before the first attempt, deleted once posted, so a
-- status is posted once even when the controller that meant to post it is gone (the next leader posts it).
-- `seq` keeps their order (a pending never lands after the verdict it precedes).
CREATE TABLE IF NOT EXISTS commit_status_outbox (
    id          TEXT PRIMARY KEY,
    seq         DOUBLE PRECISION NOT NULL,
    sha         TEXT NOT NULL,
    state       TEXT NOT NULL,
    context     TEXT NOT NULL,
    description TEXT NOT NULL,
    target_url  TEXT NOT NULL DEFAULT ''
);
