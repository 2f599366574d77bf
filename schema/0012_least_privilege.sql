-- Least privilege for the query API's logins.
--
-- gpuhealth_reader reads the tables and views the API and the dashboards show, and
-- nothing else: it no longer may acknowledge (that was a write that skipped the
-- API key) and it loses the bookkeeping tables. Acknowledging moves to
-- gpuhealth_acknowledger, which may execute acknowledge_alert() and nothing else;
-- the API uses it only after the key was checked.
--
-- Roles are cluster-wide and this file runs once per schema (every test has its
-- own), so creating a role tolerates its existence and a concurrent creator. The
-- bootstrap (scripts/services.sh, the container's init) gives both roles their
-- logins and passwords. What needs a superuser -- taking large objects and
-- SECURITY DEFINER functions away from PUBLIC -- is
-- deploy/timescaledb-init/20-least-privilege.sql, run by that same bootstrap; a
-- database where it has not run gets a warning here, not an error.
DO $$
BEGIN
    BEGIN
        CREATE ROLE gpuhealth_acknowledger NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- the bootstrap, an earlier schema or a concurrent runner made it
    END;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO gpuhealth_acknowledger', current_schema());
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM gpuhealth_reader', current_schema());

    -- Temporary tables are a write every login gets through PUBLIC; the owner keeps
    -- them (the sink stages its batches in one). Only the database's owner may revoke.
    IF has_database_privilege('public', current_database(), 'TEMPORARY') THEN
        BEGIN
            EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'every login may still create temporary tables in %: run '
                          '"REVOKE TEMPORARY ON DATABASE % FROM PUBLIC" as its owner',
                          current_database(), current_database();
        END;
    END IF;
    IF has_function_privilege('public', 'pg_catalog.lo_from_bytea(oid, bytea)', 'EXECUTE') THEN
        RAISE WARNING 'every login may still create large objects in %: run '
                      'deploy/timescaledb-init/20-least-privilege.sql as a superuser', current_database();
    END IF;
END
$$;

REVOKE ALL ON schema_migrations, kafka_offsets FROM gpuhealth_reader;

REVOKE ALL ON FUNCTION acknowledge_alert(bigint, text) FROM PUBLIC, gpuhealth_reader;
GRANT EXECUTE ON FUNCTION acknowledge_alert(bigint, text) TO gpuhealth_acknowledger;
