-- What the remediator decided and did (services/remediator): its decisions (one per verdict or alert
-- answered: the idempotence key), its remediations (one plan per node at a time, a state machine that
-- survives restarts), the record of every step (a hypertable, also published on gpu-remediations),
-- which cordons and drains are its own, and the pause and the circuit breaker (one row per mode:
-- a dry run trips its own breaker, never the live one).

CREATE TABLE remediation_decisions (
    decision_key    text PRIMARY KEY,         -- the verdict or alert answered; a redelivery finds it here
    decided_at      timestamptz NOT NULL,
    gpu_uuid        text NOT NULL,
    node            text NOT NULL,            -- "" when the GPU maps to no node
    action          text NOT NULL,
    outcome         text NOT NULL CHECK (outcome IN ('act', 'held', 'ignored', 'joined', 'unmapped')),
    remediation_id  bigint,
    reason          text,
    dry_run         boolean NOT NULL
);

CREATE TABLE remediations (
    id               bigserial PRIMARY KEY,
    node             text NOT NULL,
    gpu_uuids        text[] NOT NULL,
    action           text NOT NULL,
    finding          text NOT NULL,           -- named in the taint and in Slurm's reason
    steps            text[] NOT NULL,
    step             integer NOT NULL DEFAULT 0 CHECK (step >= 0),
    state            text NOT NULL CHECK (state IN ('held', 'running', 'done', 'failed', 'escalated')),
    held_for         text CHECK (held_for IN ('approval', 'breaker', 'rate_limit', 'class_limit')),
    dry_run          boolean NOT NULL,
    decision_key     text NOT NULL,
    escalated_from   bigint REFERENCES remediations (id),
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    next_at          timestamptz NOT NULL,    -- when the running step is looked at again
    step_started_at  timestamptz,
    approved_by      text,
    approved_at      timestamptz,
    detail           jsonb NOT NULL DEFAULT '{}'   -- per step: identity before, cycles seen, evictions
);
-- One plan in hand per node: a second finding on the node joins it.
CREATE UNIQUE INDEX remediations_one_active ON remediations (node, dry_run) WHERE state IN ('held', 'running');
CREATE INDEX remediations_due ON remediations (next_at) WHERE state = 'running';
CREATE INDEX remediations_recent ON remediations (created_at DESC);

CREATE TABLE remediation_events (
    time            timestamptz NOT NULL,
    record_id       uuid NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('decision', 'action', 'outcome', 'validation', 'breaker',
                                                  'control')),
    remediation_id  bigint,
    gpu_uuid        text,
    node            text NOT NULL,
    action          text,
    step            text,
    driver          text,
    status          text NOT NULL,
    dry_run         boolean NOT NULL,
    reason          text,
    seconds         double precision CHECK (seconds >= 0),
    answers         jsonb,
    response        jsonb NOT NULL DEFAULT '{}',
    published       boolean NOT NULL DEFAULT false,  -- the outbox: on gpu-remediations once true
    PRIMARY KEY (record_id, time)
);
SELECT create_hypertable('remediation_events', 'time', chunk_time_interval => interval '7 days');
CREATE INDEX remediation_events_outbox ON remediation_events (time) WHERE NOT published;
CREATE INDEX remediation_events_gpu ON remediation_events (gpu_uuid, time DESC);
CREATE INDEX remediation_events_remediation ON remediation_events (remediation_id, time);

-- The cordons and drains the remediator made itself: the only ones it will ever undo. The node carries
-- the same mark (an annotation in Kubernetes, a reason prefix in Slurm); both must say so.
CREATE TABLE remediation_ownership (
    node            text NOT NULL,
    scheduler       text NOT NULL CHECK (scheduler IN ('kubernetes', 'slurm')),
    dry_run         boolean NOT NULL,
    remediation_id  bigint NOT NULL REFERENCES remediations (id),
    since           timestamptz NOT NULL,
    PRIMARY KEY (node, scheduler, dry_run)
);

CREATE TABLE remediation_control (
    dry_run       boolean PRIMARY KEY,
    paused        boolean NOT NULL DEFAULT false,
    paused_by     text,
    paused_at     timestamptz,
    breaker       text NOT NULL DEFAULT 'closed' CHECK (breaker IN ('closed', 'open')),
    tripped_at    timestamptz,
    trip_reason   text,
    reset_by      text,
    reset_at      timestamptz
);
INSERT INTO remediation_control (dry_run) VALUES (true), (false);

-- Each node admitted to a cordon or drain, for the breaker's window (N nodes or P % within W).
CREATE TABLE remediation_breaker_admissions (
    time            timestamptz NOT NULL,
    node            text NOT NULL,
    dry_run         boolean NOT NULL,
    remediation_id  bigint NOT NULL
);
CREATE INDEX remediation_breaker_window ON remediation_breaker_admissions (dry_run, time DESC);

-- An operator's controls, through the API after its key was checked: the API's acknowledging
-- login may execute these and write nothing else. Each is recorded (and so published) as a
-- control event.
CREATE FUNCTION remediation_control_event(what text, who text, target bigint, why text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO remediation_events (time, record_id, kind, remediation_id, node, status, dry_run, reason,
                                    response)
    SELECT now(), gen_random_uuid(), 'control', target, coalesce(r.node, ''), what,
           coalesce(r.dry_run, false), why, jsonb_build_object('by', who)
      FROM (SELECT 1) one LEFT JOIN remediations r ON r.id = target
$$;

CREATE FUNCTION remediation_pause(who text) RETURNS SETOF remediation_control
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM remediation_control_event('paused', who, NULL, 'paused by an operator');
    RETURN QUERY UPDATE remediation_control SET paused = true, paused_by = who, paused_at = now()
                 RETURNING *;
END
$$;

CREATE FUNCTION remediation_resume(who text) RETURNS SETOF remediation_control
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM remediation_control_event('resumed', who, NULL, 'resumed by an operator');
    RETURN QUERY UPDATE remediation_control SET paused = false, paused_by = who, paused_at = now()
                 RETURNING *;
END
$$;

-- Closes the breaker: the plans it held stay held until each is approved.
CREATE FUNCTION remediation_reset_breaker(who text) RETURNS SETOF remediation_control
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM remediation_control_event('reset', who, NULL, 'breaker reset by an operator');
    RETURN QUERY UPDATE remediation_control SET breaker = 'closed', reset_by = who, reset_at = now()
                 RETURNING *;
END
$$;

-- Approves a held plan: it runs from the step it was held at. Nothing when it is not held.
CREATE FUNCTION remediation_approve(target bigint, who text) RETURNS SETOF remediations
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF EXISTS (SELECT FROM remediations WHERE id = target AND state = 'held') THEN
        PERFORM remediation_control_event('approved', who, target, 'approved by an operator');
    END IF;
    RETURN QUERY UPDATE remediations
                    SET state = 'running', held_for = NULL, approved_by = who, approved_at = now(),
                        updated_at = now(), next_at = now()
                  WHERE id = target AND state = 'held'
              RETURNING *;
END
$$;

DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['remediation_control_event(text, text, bigint, text)', 'remediation_pause(text)',
                              'remediation_resume(text)', 'remediation_reset_breaker(text)',
                              'remediation_approve(bigint, text)'] LOOP
        -- A SECURITY DEFINER function must not resolve names through the caller's search_path.
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_catalog', fn, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;
    BEGIN
        CREATE ROLE gpuhealth_acknowledger NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- 0012, the bootstrap or a concurrent runner made it
    END;
END
$$;
GRANT EXECUTE ON FUNCTION remediation_pause(text), remediation_resume(text), remediation_reset_breaker(text),
    remediation_approve(bigint, text) TO gpuhealth_acknowledger;
