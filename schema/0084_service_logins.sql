-- Issue 41 item 6: one database login per service, with only what its job needs. The owner (the
-- bootstrap's GPUHEALTH_DB_USER) runs the migrations and nothing else; the API keeps its reader and
-- acknowledger (0006, 0012). Each service reads the tables the reader reads (not schema_migrations;
-- kafka_offsets only the sink) and writes only its own:
--   gpuhealth_sink        the samples, events, inventory, verifications, workload and LLM rows, the
--                         rollup and its Kafka offsets, its dead letters; temporary tables (its
--                         batches are staged in one). Never a verdict, an alert or a remediation row.
--   gpuhealth_scorer      verdicts (gpu_health, gpu_health_current, gpu_status), predictions, alerts,
--                         and the events its event path judges (gpu_events, as the sink does).
--   gpuhealth_remediator  its plans (never their approved_by, approved_at; a plan the breaker held it
--                         cannot release), decisions, records, ownership, breaker
--                         admissions and the remedies it carried out. remediation_control it only
--                         reads: it takes its mode's row for its transaction and trips the breaker
--                         through the two functions below; pausing, resuming, resetting and approving
--                         stay the operator's (0030, through the API's acknowledger).
--   gpuhealth_lifecycle   its runs, decisions and inventory.
-- Roles are cluster-wide and this file runs once per schema (every test has its own): creating one
-- tolerates its existence. The migration makes them NOLOGIN; the bootstrap (scripts/services.sh,
-- deploy/timescaledb-init/10-reader.sh) gives each its login and password. A later migration that adds
-- a table grants its writer there; SELECT follows by the default privileges set here.
DO $$
DECLARE
    role text;
    roles text[] := ARRAY['gpuhealth_sink', 'gpuhealth_scorer', 'gpuhealth_remediator', 'gpuhealth_lifecycle'];
BEGIN
    FOREACH role IN ARRAY roles LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- the bootstrap, an earlier schema or a concurrent runner made it
        END;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), role);
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO %I', current_schema(), role);
        EXECUTE format('REVOKE ALL ON schema_migrations, kafka_offsets FROM %I', role);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT ON TABLES TO %I',
                       current_schema(), role);
    END LOOP;
END
$$;

-- Writes, table by table, with the sequences of the tables each inserts into.
DO $$
DECLARE
    grant_row record;
    seq regclass;
BEGIN
    FOR grant_row IN
        SELECT * FROM (VALUES
            ('gpuhealth_sink', 'INSERT, UPDATE', ARRAY[
                'gpu_metrics', 'gpu_latest', 'gpu_assets', 'gpu_events', 'kafka_offsets',
                'gpu_verifications', 'gpu_systems', 'gpu_systems_latest', 'gpu_processes', 'gpu_process_polls',
                'gpu_process_latest', 'gpu_usage_1min', 'gpu_work_1min', 'llm_server_status', 'llm_sessions']),
            ('gpuhealth_sink', 'INSERT, UPDATE, DELETE', ARRAY['gpu_metrics_1min', 'gpu_metrics_1min_pending', 'sink_dead_letters']),
            ('gpuhealth_scorer', 'INSERT, UPDATE', ARRAY[
                'gpu_health', 'gpu_health_current', 'gpu_status', 'gpu_failure_predictions', 'gpu_alerts',
                'gpu_events']),
            ('gpuhealth_remediator', 'INSERT, UPDATE', ARRAY['remediation_decisions', 'remediation_events']),
            ('gpuhealth_remediator', 'INSERT, UPDATE, DELETE', ARRAY['remediation_ownership']),
            ('gpuhealth_remediator', 'INSERT', ARRAY['remediation_breaker_admissions', 'gpu_remedies']),
            ('gpuhealth_lifecycle', 'INSERT, UPDATE, DELETE', ARRAY[
                'lifecycle_runs', 'lifecycle_decisions', 'lifecycle_inventory', 'lifecycle_inventory_problems'])
        ) AS g (role, privileges, tables)
    LOOP
        EXECUTE format('GRANT %s ON %s TO %I', grant_row.privileges,
                       (SELECT string_agg(format('%I', t), ', ') FROM unnest(grant_row.tables) AS t),
                       grant_row.role);
        IF grant_row.privileges LIKE '%INSERT%' THEN
            FOR seq IN
                SELECT d.objid::regclass FROM pg_depend d JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
                 WHERE d.refobjid = ANY (SELECT format('%I', t)::regclass FROM unnest(grant_row.tables) AS t)
                   AND d.deptype IN ('a', 'i')
            LOOP
                EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I', seq, grant_row.role);
            END LOOP;
        END IF;
    END LOOP;
    GRANT SELECT ON kafka_offsets TO gpuhealth_sink;
    -- Its plans, but never who approved one: approved_by and approved_at are written by
    -- remediation_approve only (an operator, through the API).
    EXECUTE format('GRANT INSERT (%1$s), UPDATE (%1$s) ON remediations TO gpuhealth_remediator',
                   (SELECT string_agg(format('%I', attname), ', ' ORDER BY attnum) FROM pg_attribute
                     WHERE attrelid = 'remediations'::regclass AND attnum > 0 AND NOT attisdropped
                       AND attname NOT IN ('approved_by', 'approved_at')));
    FOR seq IN SELECT pg_get_serial_sequence(format('%I', 'remediations'), 'id')::regclass LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO gpuhealth_remediator', seq);
    END LOOP;
    BEGIN
        EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO gpuhealth_sink', current_database());
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE WARNING 'the sink cannot stage its batches in %: run "GRANT TEMPORARY ON DATABASE % TO '
                      'gpuhealth_sink" as its owner', current_database(), current_database();
    END;
END
$$;

-- A plan the breaker held is released by a person only, through remediation_approve (run as the
-- owner): the remediator's login may withdraw or escalate it, never set it running, nor move it to a
-- hold it may lift itself. (A plan held for approval the remediator may start by its policy:
-- services/remediator/decide.py's start_held; who approved one it still cannot write.)
CREATE FUNCTION remediation_hold_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'held' AND OLD.held_for = 'breaker'
       AND NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER')
       AND (NEW.state = 'running' OR (NEW.state = 'held' AND NEW.held_for IS DISTINCT FROM OLD.held_for)) THEN
        RAISE EXCEPTION 'plan % is held for %: only an operator releases it (remediation_approve)',
                        OLD.id, OLD.held_for USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER remediations_hold_kept BEFORE UPDATE ON remediations FOR EACH ROW
    EXECUTE FUNCTION remediation_hold_kept();

-- The remediator's hold on its mode's control row for the rest of its transaction (what
-- SELECT ... FOR UPDATE was: that needs UPDATE, which it no longer has).
CREATE FUNCTION remediation_control_held(mode boolean) RETURNS SETOF remediation_control
LANGUAGE sql SECURITY DEFINER AS $$
    SELECT * FROM remediation_control WHERE dry_run = mode FOR UPDATE
$$;

-- The remediator's one write to its controls: opening its mode's breaker, with why. Closing it is an
-- operator's (remediation_reset_breaker); the pause is never the remediator's.
CREATE FUNCTION remediation_trip_breaker(mode boolean, reason text, at timestamptz)
RETURNS SETOF remediation_control LANGUAGE sql SECURITY DEFINER AS $$
    UPDATE remediation_control SET breaker = 'open', tripped_at = at, trip_reason = reason
     WHERE dry_run = mode
    RETURNING *
$$;

DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['remediation_control_held(boolean)',
                              'remediation_trip_breaker(boolean, text, timestamptz)'] LOOP
        -- A SECURITY DEFINER function must not resolve names through the caller's search_path.
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_catalog', fn, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;
END
$$;
GRANT EXECUTE ON FUNCTION remediation_control_held(boolean), remediation_trip_breaker(boolean, text, timestamptz)
    TO gpuhealth_remediator;
