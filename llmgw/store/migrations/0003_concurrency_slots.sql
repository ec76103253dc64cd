-- Concurrency becomes a pool shared by every router process, like rpm, tpm and budget.
-- A router process (a holder) holds some of a limit's slots: one row per (limit, holder) with the count it
-- holds and when the hold lapses. Holders renew their rows well before `expires_at`, so a holder that died
-- (kill -9, a lost machine) gives its slots back when its rows lapse, with nobody having to notice it died.
-- Free slots of a limit = limit - SUM(slots) over rows that have not lapsed.
CREATE TABLE IF NOT EXISTS concurrency_holds (
    limit_key  TEXT NOT NULL,
    holder     TEXT NOT NULL,
    slots      BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (limit_key, holder)
);
CREATE INDEX IF NOT EXISTS concurrency_holds_holder ON concurrency_holds (holder);

-- One row per limit, written first in every change of a hold: on PostgreSQL the row lock it takes
-- serialises the holders of one limit, so two of them never both count the same free slot (under READ
-- COMMITTED each sees the other's committed hold once it has the lock). SQLite's BEGIN IMMEDIATE already
-- serialises every writer; the row costs it nothing.
CREATE TABLE IF NOT EXISTS concurrency_pools (
    limit_key  TEXT PRIMARY KEY,
    updated_at DOUBLE PRECISION NOT NULL
);
