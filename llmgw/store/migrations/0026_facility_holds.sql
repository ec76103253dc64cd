-- Facility domains an operator held (`llmgw facility hold rack=r1`, issue 43): nothing new is placed on their
-- nodes until released, across a controller restart or a fail-over. `domain` is `level=value`; `words` says
-- who held it and when; `drain` moves the replicas there elsewhere too.
CREATE TABLE IF NOT EXISTS facility_holds (
    domain TEXT PRIMARY KEY,
    words  TEXT NOT NULL,
    drain  INTEGER NOT NULL,
    at     DOUBLE PRECISION NOT NULL
);
