-- Run as a superuser in the project's database: at the container's first start (this
-- folder is its docker-entrypoint-initdb.d) and at every `scripts/services.sh start`.
-- Idempotent. It takes from PUBLIC -- every login, the API's read-only one included --
-- what only a superuser can take, because the objects belong to the bootstrap superuser:
--   * large objects: lo_from_bytea(), lo_create() ... would let any login store data
--     permanently, outside every table's privileges (nothing in the project uses them);
--   * SECURITY DEFINER functions of the extensions (they run as their owner).
-- The per-schema rights (the reader's SELECTs, acknowledging) are migration 0012's.
CREATE EXTENSION IF NOT EXISTS timescaledb;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE ((n.nspname = 'pg_catalog' AND (p.proname LIKE 'lo\_%' OR p.proname IN ('loread', 'lowrite')))
                OR p.prosecdef)
           AND has_function_privilege('public', p.oid, 'EXECUTE')
    LOOP
        EXECUTE format('REVOKE EXECUTE ON ROUTINE %s FROM PUBLIC', fn);
    END LOOP;
END
$$;
