-- Measured capacity (issue 20): what `llmgw bench MODEL --save` found one replica to serve, per model, profile
-- and GPU class ('' for a CPU profile). Re-measuring replaces the row: a second run is a better answer to the
-- same question, and two rows would leave a reader choosing with no basis. The objective and the time are kept
-- with it: a capacity means nothing without the target it was measured against, and hardware and engine
-- builds change. `curve` is the steps as JSON (concurrency, TTFT and inter-token latency, tokens/s), for
-- whoever judges whether the run was sound. `concurrency` is NULL when not one sequence met the objective.
CREATE TABLE IF NOT EXISTS capacity (
    model                TEXT NOT NULL,
    profile              TEXT NOT NULL,
    gpu_class            TEXT NOT NULL DEFAULT '',
    engine               TEXT NOT NULL,
    measured_at          DOUBLE PRECISION NOT NULL,
    objective_ms         DOUBLE PRECISION,
    concurrency          BIGINT,
    tokens_per_s         DOUBLE PRECISION,
    prefill_ms_per_token DOUBLE PRECISION,
    decode_ms_per_token  DOUBLE PRECISION,
    load_s               DOUBLE PRECISION,
    replica              TEXT NOT NULL DEFAULT '',
    curve                TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (model, profile, gpu_class)
);
