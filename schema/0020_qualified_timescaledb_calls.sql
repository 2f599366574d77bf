-- A service bound to its own schema has that schema alone on its search_path (no table of another
-- schema, `public` included, can be reached by a missing one's name). TimescaleDB's functions live
-- in `public`, so this schema's own functions call them by that name: each function whose body
-- calls one unqualified is defined again with the call qualified, and nothing else changed. The
-- bodies were built by earlier migrations from the license and the aggregate list; editing their
-- definitions keeps that one source.
DO $migration$
DECLARE
    fn record;
    qualified text;
BEGIN
    FOR fn IN
        SELECT p.oid, pg_get_functiondef(p.oid) AS def
        FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace AND p.prokind = 'f'
    LOOP
        qualified := regexp_replace(
            fn.def,
            '(?<![.[:alnum:]_])(time_bucket|drop_chunks|show_chunks|create_hypertable)\(',
            'public.\1(', 'g');
        IF qualified <> fn.def THEN
            EXECUTE qualified;
        END IF;
    END LOOP;
END
$migration$;
