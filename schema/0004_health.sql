-- What the health scorer writes: verdicts (current and history), per-GPU status,
-- alerts and failure predictions.

-- The verdict history: one row each time a GPU's subsystem changes state.
CREATE TABLE gpu_health (
    time        timestamptz NOT NULL,
    gpu_uuid    text NOT NULL,
    subsystem   text NOT NULL,
    state       text NOT NULL CHECK (state IN ('healthy', 'degraded', 'unhealthy')),
    rule        text,
    evidence    jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (gpu_uuid, subsystem, time)
);
CREATE INDEX gpu_health_time ON gpu_health (time DESC);

-- The verdict in force per GPU and subsystem.
CREATE TABLE gpu_health_current (
    gpu_uuid    text NOT NULL,
    subsystem   text NOT NULL,
    state       text NOT NULL CHECK (state IN ('healthy', 'degraded', 'unhealthy')),
    rule        text,
    evidence    jsonb NOT NULL DEFAULT '{}',
    since       timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (gpu_uuid, subsystem)
);

-- One line per GPU for ranking: worst state, score, grade, what to do.
CREATE TABLE gpu_status (
    gpu_uuid     text PRIMARY KEY,
    state        text NOT NULL CHECK (state IN ('healthy', 'degraded', 'unhealthy')),
    score        double precision NOT NULL CHECK (score BETWEEN 0 AND 100),
    grade        text NOT NULL,
    action       text NOT NULL,
    reasons      jsonb NOT NULL DEFAULT '[]',
    as_of        timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX gpu_status_rank ON gpu_status (score, gpu_uuid);

CREATE TABLE gpu_alerts (
    id               bigserial PRIMARY KEY,
    gpu_uuid         text NOT NULL,
    kind             text NOT NULL,
    severity         text NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    state            text NOT NULL CHECK (state IN ('open', 'acknowledged', 'resolved')),
    summary          text NOT NULL,
    evidence         jsonb NOT NULL DEFAULT '{}',
    opened_at        timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    resolved_at      timestamptz,
    acknowledged_at  timestamptz,
    acknowledged_by  text
);
-- An alert is opened once: at most one unresolved alert per GPU and kind.
CREATE UNIQUE INDEX gpu_alerts_one_open ON gpu_alerts (gpu_uuid, kind) WHERE state <> 'resolved';
CREATE INDEX gpu_alerts_state ON gpu_alerts (state, severity, opened_at DESC);

CREATE TABLE gpu_failure_predictions (
    time         timestamptz NOT NULL,
    gpu_uuid     text NOT NULL,
    p_fail_7d    double precision NOT NULL CHECK (p_fail_7d BETWEEN 0 AND 1),
    p_fail_30d   double precision NOT NULL CHECK (p_fail_30d BETWEEN 0 AND 1),
    reasons      jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (gpu_uuid, time)
);
CREATE INDEX gpu_failure_predictions_time ON gpu_failure_predictions (time DESC, p_fail_30d DESC);
