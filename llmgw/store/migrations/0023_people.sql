-- People (issue 44). Numbered 0023 to leave 0019-0022 to the console's sign-in, threads and notes of the same
-- issue.
--
-- A personal key names its owner (a Person of the cluster repo); NULL: a project key, owned by no one. A
-- personal key without a default project keeps project '' (the column was NOT NULL from the start, and SQLite
-- cannot drop that): the store's records read it back as None.
ALTER TABLE api_keys ADD COLUMN owner TEXT;
CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner);
-- Who spent a request: the personal key's owner. NULL for a request made with a project key or none, and for
-- every row written before this migration (nobody was recorded then: absent, not "nobody").
ALTER TABLE usage ADD COLUMN person TEXT;
