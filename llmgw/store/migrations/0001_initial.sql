-- Portable SQL: every statement here runs unchanged on SQLite 3.35+ and PostgreSQL 12+.
-- Times are seconds since the epoch as DOUBLE PRECISION; JSON is TEXT; booleans are INTEGER 0/1;
-- every id is TEXT made by the application, so no auto-increment dialect is needed and a retried insert
-- can be recognised (ON CONFLICT DO NOTHING) instead of counted twice.

CREATE TABLE IF NOT EXISTS revisions (
    sha         TEXT PRIMARY KEY,
    source      TEXT NOT NULL,
    applied_at  DOUBLE PRECISION NOT NULL,
    applied_by  TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('accepted', 'refused')),
    errors      TEXT NOT NULL DEFAULT '[]'
);

CREATE TABLE IF NOT EXISTS nodes (
    name        TEXT PRIMARY KEY,
    first_seen  DOUBLE PRECISION NOT NULL,
    last_seen   DOUBLE PRECISION NOT NULL,
    state       TEXT NOT NULL,
    inventory   TEXT NOT NULL DEFAULT '{}'
);

CREATE TABLE IF NOT EXISTS replicas (
    id          TEXT PRIMARY KEY,
    model       TEXT NOT NULL,
    profile     TEXT NOT NULL,
    nodes       TEXT NOT NULL DEFAULT '[]',
    state       TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS replicas_model ON replicas (model);

CREATE TABLE IF NOT EXISTS events (
    id          TEXT PRIMARY KEY,
    time        DOUBLE PRECISION NOT NULL,
    kind        TEXT NOT NULL,
    object      TEXT NOT NULL,
    message     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_time ON events (time);

CREATE TABLE IF NOT EXISTS api_keys (
    id          TEXT PRIMARY KEY,
    prefix      TEXT NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    project     TEXT NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    created_at  DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION,
    revoked_at  DOUBLE PRECISION
);

CREATE TABLE IF NOT EXISTS usage (
    id            TEXT PRIMARY KEY,
    time          DOUBLE PRECISION NOT NULL,
    request_id    TEXT NOT NULL,
    project       TEXT NOT NULL,
    team          TEXT NOT NULL DEFAULT '',
    org           TEXT NOT NULL DEFAULT '',
    key_id        TEXT REFERENCES api_keys (id),
    model         TEXT NOT NULL,
    tokens_in     BIGINT NOT NULL DEFAULT 0,
    tokens_out    BIGINT NOT NULL DEFAULT 0,
    cost          DOUBLE PRECISION NOT NULL DEFAULT 0,
    latency_ms    DOUBLE PRECISION NOT NULL DEFAULT 0,
    status        INTEGER NOT NULL,
    fallback_used INTEGER NOT NULL DEFAULT 0,
    router_id     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS usage_time ON usage (time);
CREATE INDEX IF NOT EXISTS usage_project_time ON usage (project, time);

-- One row per (limit, window): routers take slices ("shares") of the window's allowance from it.
CREATE TABLE IF NOT EXISTS limit_counters (
    limit_key    TEXT NOT NULL,
    window_start DOUBLE PRECISION NOT NULL,
    window_end   DOUBLE PRECISION NOT NULL,
    taken        BIGINT NOT NULL DEFAULT 0,
    granted      BIGINT NOT NULL DEFAULT 0,
    updated_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (limit_key, window_start)
);

CREATE TABLE IF NOT EXISTS leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL
);
