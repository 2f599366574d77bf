-- Issue 40, closing the loop. A remedy (a GPU reset or a node reboot) that was carried out: by the
-- remediator (its reset_gpu or reboot step completed, live), by an operator by hand (through the API),
-- or by the GPU itself (the driver's recovery action went back to none). The scorer counts no
-- occurrence of a finding the remedy resolves from before it (shared.store.verdict_inputs): the XIDs
-- whose catalogue action is at or below the remedy's rung; the history keeps them. A dry run's
-- remedies are never here: they stay with the dry-run plan.
CREATE TABLE gpu_remedies (
    id        bigserial PRIMARY KEY,
    gpu_uuid  text NOT NULL,
    at        timestamptz NOT NULL,
    remedy    text NOT NULL CHECK (remedy IN ('reset_gpu', 'reboot_node')),
    source    text NOT NULL CHECK (source IN ('remediator', 'operator', 'gpu')),
    plan_id   bigint REFERENCES remediations (id),
    actor     text NOT NULL,
    note      text NOT NULL DEFAULT ''
);
CREATE INDEX gpu_remedies_gpu ON gpu_remedies (gpu_uuid, at DESC);
-- A step looked at again (a restart between its driver's answer and the commit) writes its remedy once.
CREATE UNIQUE INDEX gpu_remedies_once ON gpu_remedies (plan_id, gpu_uuid) WHERE plan_id IS NOT NULL;

-- The GPU's own word: NVML's recovery action (nvmlDeviceGetGpuRecoveryAction, DCGM field
-- GPU_RECOVERY_ACTION) back to NONE (0) after it asked for a reset (1 GPU_RESET, 4 DRAIN_AND_RESET,
-- 6 BUS_RESET) or a reboot (2 NODE_REBOOT, 7 SYSTEM_REBOOT): the recovery was done. Seen where the
-- sink moves a GPU's latest sample on. 3 (DRAIN_P2P) and 5 (RECOVER_IMEX_DOMAIN) are no remedy.
CREATE FUNCTION gpu_recovered() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO gpu_remedies (gpu_uuid, at, remedy, source, actor, note)
    VALUES (NEW.gpu_uuid, NEW.time,
            CASE WHEN OLD.gpu_recovery_action IN (2, 7) THEN 'reboot_node' ELSE 'reset_gpu' END,
            'gpu', 'gpu', format('NVML recovery action %s -> 0 (none)', OLD.gpu_recovery_action));
    RETURN NULL;
END
$$;
CREATE TRIGGER gpu_latest_recovered AFTER UPDATE ON gpu_latest FOR EACH ROW
    WHEN (OLD.gpu_recovery_action IN (1, 2, 4, 6, 7) AND NEW.gpu_recovery_action = 0)
    EXECUTE FUNCTION gpu_recovered();

-- An operator's reset or reboot done by hand, through the API after the caller's role was checked;
-- a GPU the inventory does not know gets none.
CREATE FUNCTION record_gpu_remedy(gpu text, what text, who text, why text) RETURNS SETOF gpu_remedies
LANGUAGE sql SECURITY DEFINER AS $$
    INSERT INTO gpu_remedies (gpu_uuid, at, remedy, source, actor, note)
    SELECT gpu_uuid, now(), what, 'operator', who, why FROM gpu_assets WHERE gpu_uuid = gpu
    RETURNING *
$$;

-- Dry run and live never meet: a verdict is decided once per mode, so a dry run beside a live
-- remediator never takes the live one's decision.
ALTER TABLE remediation_decisions DROP CONSTRAINT remediation_decisions_pkey;
ALTER TABLE remediation_decisions ADD PRIMARY KEY (decision_key, dry_run);

-- A held plan that a repair made moot is withdrawn (the reason is on its record).
ALTER TABLE remediations DROP CONSTRAINT remediations_state_check;
ALTER TABLE remediations ADD CONSTRAINT remediations_state_check
    CHECK (state IN ('held', 'running', 'done', 'failed', 'escalated', 'withdrawn'));

DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['gpu_recovered()', 'record_gpu_remedy(text, text, text, text)'] LOOP
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
GRANT EXECUTE ON FUNCTION record_gpu_remedy(text, text, text, text) TO gpuhealth_acknowledger;
