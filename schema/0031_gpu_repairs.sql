-- An operator's word that a GPU was repaired or came back from repair (issue 32): the way back to
-- healthy. Each mark is kept (the audit trail: who, when, what, why); the scorer counts a GPU's
-- XIDs, losses, error rates and pattern rules only from its newest mark on, so its findings
-- resolve and its repeat counters start again, while gpu_health keeps the history as it was.
CREATE TABLE gpu_repairs (
    id           bigserial PRIMARY KEY,
    gpu_uuid     text NOT NULL,
    time         timestamptz NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('repaired', 'returned')),
    marked_by    text NOT NULL,
    note         text NOT NULL DEFAULT ''
);
CREATE INDEX gpu_repairs_gpu ON gpu_repairs (gpu_uuid, time DESC);

-- The API's acknowledging login marks a GPU through this function, after the key was checked,
-- and can write nothing else; a GPU the inventory does not know gets no mark.
CREATE FUNCTION mark_gpu_repaired(gpu text, what text, who text, why text) RETURNS SETOF gpu_repairs
LANGUAGE sql SECURITY DEFINER AS $$
    INSERT INTO gpu_repairs (gpu_uuid, time, kind, marked_by, note)
    SELECT gpu_uuid, now(), what, who, why FROM gpu_assets WHERE gpu_uuid = gpu
    RETURNING *
$$;

DO $$
BEGIN
    -- A SECURITY DEFINER function must not resolve names through the caller's search_path.
    EXECUTE format('ALTER FUNCTION mark_gpu_repaired(text, text, text, text) SET search_path = %I, pg_catalog',
                   current_schema());
    BEGIN
        CREATE ROLE gpuhealth_acknowledger NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- 0012, the bootstrap or a concurrent runner made it
    END;
END
$$;
REVOKE ALL ON FUNCTION mark_gpu_repaired(text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION mark_gpu_repaired(text, text, text, text) TO gpuhealth_acknowledger;
