-- Usage accounting (#36): what each GPU-minute carried and what ran on it, kept like the rollup.
--
-- gpu_usage_1min: per GPU, minute and the labels its samples carried (hostname, cluster, job,
-- pod, namespace): how many samples, the first and last sample's time, how many were busy
-- (utilisation >= 1 %) and idle (< 1 %: the scorer's [idle] util_pct_below in
-- config/health-rules.toml, checked by a test), their utilisation sum, and the energy
-- counter's first, last and largest value in the minute (the first and last of the samples
-- that had one). The accounting (shared/store/usage.py) joins a GPU's minutes into runs of
-- reporting, so a GPU that stopped reporting counts as neither busy nor idle, and takes
-- energy from the counter's differences (resets included), never from power x time.
--
-- apache license: a hypertable that follows gpu_metrics_1min. The rollup's refresh deletes
-- the notes it takes from gpu_metrics_1min_pending (0014, 0018); a statement trigger on that
-- delete recomputes the same minutes here from gpu_metrics, in the refresh's transaction. A
-- recomputed minute's rows replace the stored ones (an upsert on the labels): gpu_metrics only
-- gains rows, so a recomputation holds every group the one before had, and a minute whose raw
-- rows retention has dropped is left as it was.
-- timescale license: a continuous aggregate with the rollup's refresh policy (history from
-- before this migration: CALL refresh_continuous_aggregate('gpu_usage_1min', NULL, now())).
--
-- gpu_work_1min: per GPU and minute, the process polls' shares by class and user: a poll with
-- n processes gives each 1/n, a poll with none gives class 'none' 1, so a minute's shares sum
-- to its number of polls. The sink adds a poll's shares when it stores the poll
-- (shared.store.workload.insert_process_poll; a replayed poll adds nothing), under either
-- license.
DO $migration$
DECLARE
    aggregates text := $agg$
        count(*)                                                                AS samples,
        min(time)                                                               AS first_time,
        max(time)                                                               AS last_time,
        sum(CASE WHEN gpu_util_pct >= 1 THEN 1 ELSE 0 END)                      AS busy_samples,
        sum(CASE WHEN gpu_util_pct < 1 THEN 1 ELSE 0 END)                       AS idle_samples,
        sum(gpu_util_pct)                                                       AS gpu_util_pct_sum,
        public.first(total_energy_mj, CASE WHEN total_energy_mj IS NOT NULL THEN time END) AS energy_first_mj,
        public.last(total_energy_mj, CASE WHEN total_energy_mj IS NOT NULL THEN time END)  AS energy_last_mj,
        max(total_energy_mj)                                                    AS energy_max_mj$agg$;
    labels text := 'gpu_uuid, hostname, cluster, job, pod, namespace';
    replace text;
BEGIN
    SELECT string_agg(format('%1$I = EXCLUDED.%1$I', m[1]), ', ')
      INTO replace
      FROM regexp_matches(aggregates, 'AS (\w+)', 'g') AS m;

    IF current_setting('timescaledb.license', true) = 'timescale' THEN
        EXECUTE format(
            'CREATE MATERIALIZED VIEW gpu_usage_1min WITH (timescaledb.continuous) AS '
            'SELECT public.time_bucket(interval ''1 minute'', time) AS bucket, %s, %s '
            'FROM gpu_metrics GROUP BY bucket, %s WITH NO DATA', labels, aggregates, labels);
        PERFORM add_continuous_aggregate_policy('gpu_usage_1min',
            start_offset => interval '2 hours', end_offset => interval '1 minute',
            schedule_interval => interval '1 minute');
        RETURN;
    END IF;

    EXECUTE format(
        'CREATE TABLE gpu_usage_1min AS '
        'SELECT public.time_bucket(interval ''1 minute'', time) AS bucket, %s, %s '
        'FROM gpu_metrics GROUP BY bucket, %s WITH NO DATA', labels, aggregates, labels);
    ALTER TABLE gpu_usage_1min ALTER COLUMN bucket SET NOT NULL,
                               ALTER COLUMN gpu_uuid SET NOT NULL,
                               ALTER COLUMN hostname SET NOT NULL,
                               ADD UNIQUE NULLS NOT DISTINCT (gpu_uuid, bucket, hostname, cluster, job, pod, namespace);
    PERFORM public.create_hypertable('gpu_usage_1min', 'bucket', chunk_time_interval => interval '7 days');
    -- what the raw retention still holds
    EXECUTE format(
        'INSERT INTO gpu_usage_1min SELECT public.time_bucket(interval ''1 minute'', time) AS bucket, %s, %s '
        'FROM gpu_metrics GROUP BY bucket, %s', labels, aggregates, labels);

    EXECUTE format($fn$
        CREATE FUNCTION gpu_usage_1min_follow() RETURNS trigger
        LANGUAGE plpgsql SET work_mem = '64MB' AS $body$
        DECLARE
            r record;
        BEGIN
            FOR r IN
                WITH minutes AS (SELECT DISTINCT bucket FROM taken),
                islands AS (
                    SELECT bucket, bucket - interval '1 minute' * row_number() OVER (ORDER BY bucket) AS island
                    FROM minutes)
                SELECT min(bucket) AS lo, max(bucket) + interval '1 minute' AS hi
                FROM islands GROUP BY island
            LOOP
                INSERT INTO gpu_usage_1min
                SELECT public.time_bucket(interval '1 minute', time) AS bucket, %1$s, %2$s
                FROM gpu_metrics WHERE time >= r.lo AND time < r.hi
                GROUP BY bucket, %1$s
                ON CONFLICT (gpu_uuid, bucket, hostname, cluster, job, pod, namespace) DO UPDATE SET %3$s;
            END LOOP;
            RETURN NULL;
        END
        $body$ $fn$, labels, aggregates, replace);
    CREATE TRIGGER gpu_usage_1min_follows AFTER DELETE ON gpu_metrics_1min_pending
        REFERENCING OLD TABLE AS taken FOR EACH STATEMENT EXECUTE FUNCTION gpu_usage_1min_follow();
END
$migration$;

CREATE TABLE gpu_work_1min (
    bucket          timestamptz NOT NULL,
    gpu_uuid        text NOT NULL,
    classification  text NOT NULL
        CHECK (classification IN ('training', 'inference', 'llm_serving', 'gaming', 'compute', 'none')),
    username        text,
    polls           double precision NOT NULL CHECK (polls > 0),
    UNIQUE NULLS NOT DISTINCT (gpu_uuid, bucket, classification, username)
);
SELECT create_hypertable('gpu_work_1min', 'bucket', chunk_time_interval => interval '7 days');

-- what the process tables still hold
INSERT INTO gpu_work_1min (bucket, gpu_uuid, classification, username, polls)
SELECT time_bucket(interval '1 minute', pp.time), pp.gpu_uuid, coalesce(p.classification, 'none'), p.username,
       sum(CASE WHEN p.pid IS NULL THEN 1.0 ELSE 1.0 / n.processes END)
  FROM gpu_process_polls pp
  LEFT JOIN gpu_processes p ON p.gpu_uuid = pp.gpu_uuid AND p.time = pp.time
  LEFT JOIN LATERAL (SELECT count(*) AS processes FROM gpu_processes q
                      WHERE q.gpu_uuid = pp.gpu_uuid AND q.time = pp.time) n ON true
 GROUP BY 1, 2, 3, 4;
