-- The sink's retention drops expired chunks, and under the timescale license first removes the
-- retention policies it replaces: both are the hypertable owner's alone, which kept the sink on the
-- owner's login after 0084. It does both through these two functions instead, which act only on the
-- three hypertables retention keeps (gpu_metrics, gpu_events, gpu_metrics_1min) in this schema; the
-- sink logs in as gpuhealth_sink. Dropping exactly one chunk (the archive's) passes newer_than too.
CREATE FUNCTION sink_drop_chunks(hypertable regclass, older_than timestamptz, newer_than timestamptz DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    dropped integer;
BEGIN
    IF hypertable IS DISTINCT FROM to_regclass('gpu_metrics') AND hypertable IS DISTINCT FROM to_regclass('gpu_events')
       AND hypertable IS DISTINCT FROM to_regclass('gpu_metrics_1min') THEN
        RAISE EXCEPTION 'sink_drop_chunks: % is not a table whose chunks the sink keeps', hypertable
              USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF newer_than IS NULL THEN
        SELECT count(*) INTO dropped FROM public.drop_chunks(hypertable, older_than => older_than);
    ELSE
        SELECT count(*) INTO dropped
          FROM public.drop_chunks(hypertable, older_than => older_than, newer_than => newer_than);
    END IF;
    RETURN dropped;
END
$$;

CREATE FUNCTION sink_remove_retention_policy(hypertable regclass) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF hypertable IS DISTINCT FROM to_regclass('gpu_metrics') AND hypertable IS DISTINCT FROM to_regclass('gpu_events')
       AND hypertable IS DISTINCT FROM to_regclass('gpu_metrics_1min') THEN
        RAISE EXCEPTION 'sink_remove_retention_policy: % is not a table whose chunks the sink keeps', hypertable
              USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM public.remove_retention_policy(hypertable, if_exists => true);
END
$$;

DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['sink_drop_chunks(regclass, timestamptz, timestamptz)',
                              'sink_remove_retention_policy(regclass)'] LOOP
        -- A SECURITY DEFINER function must not resolve names through the caller's search_path.
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_catalog', fn, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;
END
$$;
GRANT EXECUTE ON FUNCTION sink_drop_chunks(regclass, timestamptz, timestamptz), sink_remove_retention_policy(regclass)
    TO gpuhealth_sink;
