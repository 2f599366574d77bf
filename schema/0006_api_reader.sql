-- The query API connects as gpuhealth_reader: it reads, and it can acknowledge an
-- alert through one function, and nothing else. The role is cluster-wide; the
-- bootstrap (scripts/services.sh, or the container's init) gives it a login and a
-- password, this migration gives it its rights in this schema.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpuhealth_reader') THEN
        CREATE ROLE gpuhealth_reader NOLOGIN;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO gpuhealth_reader', current_schema());
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO gpuhealth_reader', current_schema());
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT ON TABLES TO gpuhealth_reader',
                   current_schema());
END
$$;

CREATE FUNCTION acknowledge_alert(alert_id bigint, who text)
RETURNS SETOF gpu_alerts LANGUAGE sql SECURITY DEFINER AS $$
    UPDATE gpu_alerts
       SET state = 'acknowledged', acknowledged_at = now(), acknowledged_by = who, updated_at = now()
     WHERE id = alert_id AND state = 'open'
    RETURNING *
$$;
DO $$
BEGIN
    -- A SECURITY DEFINER function must not resolve names through the caller's search_path.
    EXECUTE format('ALTER FUNCTION acknowledge_alert(bigint, text) SET search_path = %I, pg_catalog',
                   current_schema());
END
$$;
REVOKE ALL ON FUNCTION acknowledge_alert(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION acknowledge_alert(bigint, text) TO gpuhealth_reader;
