-- `llmgw model check` verdicts (issue 24): the last one per model, engine and engine version, so the routers
-- keep sending a request needing a verified capability only where it was verified across a controller
-- restart or a fail-over. `verdict` is the verdict's JSON (its probes, passed and why).
CREATE TABLE IF NOT EXISTS model_checks (
    model          TEXT NOT NULL,
    engine         TEXT NOT NULL,
    engine_version TEXT NOT NULL,
    verdict        TEXT NOT NULL,
    at             DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (model, engine, engine_version)
);
