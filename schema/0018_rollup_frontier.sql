-- While the sink is behind, the rollup's refresh recomputes only the minutes every partition has passed.
--
-- A minute is recomputed whole (0014). Several lanes (partitions, sink
-- processes) fill the same minutes at different moments, so while the sink
-- works through a backlog a minute refreshed after one lane's batch was
-- recomputed again after the next lane's: ~2 recomputations a minute on the
-- sink bench, 4.9 µs of database CPU a sample, against 2.2 for one.
--
-- kafka_offsets.frontier is the time of the newest sample a group stored for a
-- partition, moved with its offsets (never backwards). While behind, the
-- refresh is given the slowest busy partition's frontier: minutes before the
-- one it falls in are complete (every partition has stored samples past them),
-- and only their notes are taken; the others stay noted, so readers still keep
-- before them (gpu_metrics_1min_settled()). Once the sink has caught up it
-- refreshes everything noted. The frontier only schedules: a sample arriving
-- late for a minute already refreshed notes it again, and it is recomputed.
ALTER TABLE kafka_offsets ADD COLUMN frontier timestamptz;

DO $migration$
DECLARE
    aggregates text;
BEGIN
    IF current_setting('timescaledb.license', true) = 'timescale' THEN
        -- the continuous aggregate's policy refreshes: the notes are only forgotten
        CREATE FUNCTION gpu_metrics_1min_refresh(keep interval, upto timestamptz) RETURNS integer
        LANGUAGE sql AS $fn$
            WITH gone AS (DELETE FROM gpu_metrics_1min_pending RETURNING 1) SELECT 0
        $fn$;
        RETURN;
    END IF;
    aggregates := substring(gpu_metrics_insert_sql('') FROM 'AS bucket, gpu_uuid, (.*) FROM inserted GROUP BY');
    IF aggregates IS NULL THEN
        RAISE EXCEPTION 'gpu_metrics_insert_sql() has no aggregate list';
    END IF;
    EXECUTE format($fn$
        CREATE FUNCTION gpu_metrics_1min_refresh(keep interval, upto timestamptz) RETURNS integer
        LANGUAGE plpgsql SET work_mem = '64MB' AS $body$
        DECLARE
            r record;
            n integer := 0;
        BEGIN
            PERFORM pg_advisory_xact_lock(1735357810, hashtext(current_schema()));
            FOR r IN
                WITH taken AS (
                    DELETE FROM gpu_metrics_1min_pending
                    WHERE upto IS NULL OR bucket < time_bucket(interval '1 minute', upto)
                    RETURNING bucket),
                minutes AS (SELECT DISTINCT bucket FROM taken WHERE bucket >= now() - keep),
                islands AS (
                    SELECT bucket, bucket - interval '1 minute' * row_number() OVER (ORDER BY bucket) AS island
                    FROM minutes)
                SELECT min(bucket) AS lo, max(bucket) + interval '1 minute' AS hi, count(*) AS k
                FROM islands GROUP BY island
            LOOP
                DELETE FROM gpu_metrics_1min WHERE bucket >= r.lo AND bucket < r.hi;
                INSERT INTO gpu_metrics_1min
                SELECT time_bucket(interval '1 minute', time) AS bucket, gpu_uuid, %s
                FROM gpu_metrics WHERE time >= r.lo AND time < r.hi GROUP BY 1, 2;
                n := n + r.k;
            END LOOP;
            RETURN n;
        END
        $body$ $fn$, aggregates);
    -- every note: the one-argument form, as before (it calls the two-argument one, which sets
    -- work_mem itself: 0017's setting went with the old body)
    CREATE OR REPLACE FUNCTION gpu_metrics_1min_refresh(keep interval) RETURNS integer
    LANGUAGE sql AS $fn$ SELECT gpu_metrics_1min_refresh(keep, NULL) $fn$;
END
$migration$;
