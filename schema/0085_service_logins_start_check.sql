-- Each service's start check (shared.migrate.check_migrated) reads which migrations are applied, so
-- that a half-applied upgrade refuses to start rather than failing table by table. 0084 took
-- schema_migrations away from the service logins whole, and `make up` then failed: the scorer,
-- remediator and lifecycle exited with "permission denied for table schema_migrations". They may
-- read the applied versions, and nothing else of the table (its names, checksums and times stay the
-- owner's, as does every write).
DO $$
DECLARE
    role text;
BEGIN
    FOREACH role IN ARRAY ARRAY['gpuhealth_sink', 'gpuhealth_scorer', 'gpuhealth_remediator', 'gpuhealth_lifecycle'] LOOP
        EXECUTE format('GRANT SELECT (version) ON schema_migrations TO %I', role);
    END LOOP;
END
$$;
