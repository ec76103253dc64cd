-- Audit and notifications (issue 22). Named for its content: another branch may also add a 0003; renumber at merge.
--
-- audit_log is append-only: the store has no statement that updates or deletes a row of it. `id` is made by
-- the application before the first attempt, so a retried write is recognised, not doubled. `actor` is who was
-- authenticated (an admin token's name, or `local:<user>` for a command that opened the store itself);
-- `actor_detail` what the client said about itself, recorded, not trusted. No secret is ever written here.
CREATE TABLE IF NOT EXISTS audit_log (
    id           TEXT PRIMARY KEY,
    time         DOUBLE PRECISION NOT NULL,
    actor        TEXT NOT NULL,
    actor_detail TEXT NOT NULL DEFAULT '',
    action       TEXT NOT NULL,
    object       TEXT NOT NULL DEFAULT '',
    outcome      TEXT NOT NULL CHECK (outcome IN ('accepted', 'refused')),
    reason       TEXT NOT NULL DEFAULT '',
    via          TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS audit_log_time ON audit_log (time);

-- The notification outbox: a row is written when the event happens and deleted when the receiver took it,
-- so a controller restart loses nothing. A row that used up its attempts stays, with dead_at set (a dead
-- letter), until an operator looks. `body` is the rendered payload; the URL and the signing secret are read
-- from the applied revision at each attempt, never stored.
CREATE TABLE IF NOT EXISTS notification_outbox (
    id           TEXT PRIMARY KEY,
    notification TEXT NOT NULL,
    event        TEXT NOT NULL,
    object       TEXT NOT NULL DEFAULT '',
    body         TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    attempts     BIGINT NOT NULL DEFAULT 0,
    next_at      DOUBLE PRECISION NOT NULL,
    last_error   TEXT NOT NULL DEFAULT '',
    dead_at      DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS notification_outbox_next_at ON notification_outbox (next_at);

-- Events already announced, by a key the core makes (a budget threshold in one window, a model's failures in
-- one hour): what keeps "budget at 80%" to once per window across polls and restarts. Pruned when old.
CREATE TABLE IF NOT EXISTS notification_marks (
    mark    TEXT PRIMARY KEY,
    time    DOUBLE PRECISION NOT NULL
);
