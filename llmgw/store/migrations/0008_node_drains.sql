-- Nodes an operator drained (`llmgw node drain`, issue 20): cordoned until uncordoned, across a controller
-- restart or a fail-over. `words` says who drained it and when, as the admin API showed it.
CREATE TABLE IF NOT EXISTS node_drains (
    node  TEXT PRIMARY KEY,
    words TEXT NOT NULL,
    at    DOUBLE PRECISION NOT NULL
);
