-- Full-text search of notes on PostgreSQL (issue 44; its SQLite twin is 0020_notes_search.sqlite.sql).
--
-- A tsvector the server derives from the row (a generated column: nothing to keep in step), under the 'simple'
-- configuration (no stemming, no stop words: SQLite's FTS5 has neither), with a GIN index. The text is cut at
-- every run of characters that are not letters or digits before the parser sees it, so an e-mail address,
-- a URL or `a-b` gives the same words here as FTS5's unicode61 tokenizer gives on SQLite.
ALTER TABLE notes ADD COLUMN search tsvector GENERATED ALWAYS AS (
    to_tsvector('simple', regexp_replace(title || ' ' || body, '[^[:alnum:]]+', ' ', 'g'))
) STORED;
CREATE INDEX IF NOT EXISTS notes_search ON notes USING GIN (search);
