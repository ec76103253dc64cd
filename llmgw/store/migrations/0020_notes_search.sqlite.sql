-- Full-text search of notes on SQLite (issue 44; its PostgreSQL twin is 0020_notes_search.postgres.sql).
--
-- An external-content FTS5 table over `notes` (the text is stored once, in `notes`), kept in step by three
-- triggers. Both stores must find the same notes for the same words: the tokenizer splits on anything that is
-- not a letter or a digit and keeps diacritics (`café` is not `cafe`), which is what the PostgreSQL column
-- derives from the same text.
CREATE VIRTUAL TABLE IF NOT EXISTS notes_fts USING fts5(
    title, body, content='notes', content_rowid='rowid', tokenize='unicode61 remove_diacritics 0'
);
CREATE TRIGGER IF NOT EXISTS notes_fts_insert AFTER INSERT ON notes BEGIN
    INSERT INTO notes_fts (rowid, title, body) VALUES (new.rowid, new.title, new.body);
END;
CREATE TRIGGER IF NOT EXISTS notes_fts_delete AFTER DELETE ON notes BEGIN
    INSERT INTO notes_fts (notes_fts, rowid, title, body) VALUES ('delete', old.rowid, old.title, old.body);
END;
CREATE TRIGGER IF NOT EXISTS notes_fts_update AFTER UPDATE ON notes BEGIN
    INSERT INTO notes_fts (notes_fts, rowid, title, body) VALUES ('delete', old.rowid, old.title, old.body);
    INSERT INTO notes_fts (rowid, title, body) VALUES (new.rowid, new.title, new.body);
END;
INSERT INTO notes_fts (notes_fts) VALUES ('rebuild');
