-- The fleets `llmgw plan --suggest --post` proposed (issue 50), the newest per repo revision, for the
-- console's plan page: kept across a controller restart and seen by every controller of one store.
-- `document` is the posted body's JSON (llmgw.core.api.suggestions.SuggestionBody).
CREATE TABLE IF NOT EXISTS fleet_suggestions (
    revision  TEXT PRIMARY KEY,
    posted_at DOUBLE PRECISION NOT NULL,
    posted_by TEXT NOT NULL,
    document  TEXT NOT NULL
);
