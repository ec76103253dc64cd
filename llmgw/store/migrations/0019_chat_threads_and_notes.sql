-- The console's people (issue 44): their passwords where no identity provider is configured, their chat
-- threads and notes. Numbered 0019 on the `oidc44` branch; renumber at merge if taken.
--
-- A person's console password, as scrypt makes it (`scrypt$N$r$p$salt$hash`, base64): set through a one-time
-- link an admin issues; never the password. The repo declares who the person is; this row only lets them in.
CREATE TABLE IF NOT EXISTS console_passwords (
    person TEXT PRIMARY KEY,
    hash   TEXT NOT NULL,
    set_at DOUBLE PRECISION NOT NULL
);

--
-- A thread belongs to one person (the name the repo declares them under) and lives until `updated_at` is older
-- than the Cluster's declared retention (`console.threads.retention`): the controller prunes it then, or the
-- person deletes it sooner. Its messages go with it (ON DELETE CASCADE).
CREATE TABLE IF NOT EXISTS chat_threads (
    id         TEXT PRIMARY KEY,
    person     TEXT NOT NULL,
    title      TEXT NOT NULL,
    model      TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS chat_threads_person ON chat_threads (person, updated_at);
CREATE INDEX IF NOT EXISTS chat_threads_updated ON chat_threads (updated_at);

CREATE TABLE IF NOT EXISTS chat_messages (
    thread_id  TEXT NOT NULL REFERENCES chat_threads (id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    role       TEXT NOT NULL,
    content    TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

-- A person's notes. Their full-text index is each store's own (0020): an FTS5 table on SQLite, a generated
-- tsvector column on PostgreSQL.
CREATE TABLE IF NOT EXISTS notes (
    id         TEXT PRIMARY KEY,
    person     TEXT NOT NULL,
    title      TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_person ON notes (person, updated_at);
