-- The 1-minute rollup is refreshed after the batch, not inside it (apache license).
--
-- The sink now COPYs a batch straight into gpu_metrics; it no longer folds the
-- rows into gpu_metrics_1min in the batch's transaction. Instead the batch
-- notes the minutes it stored rows in (gpu_metrics_1min_pending, committed
-- with the rows, so a crash loses no note), and a refresh loop recomputes
-- those minutes from gpu_metrics, as a continuous aggregate would: a
-- recomputed minute is exact however often its rows were replayed.
--
-- gpu_metrics_1min_refresh(keep) takes every committed note, recomputes the
-- notes' minutes (contiguous minutes in one statement) and returns how many it
-- recomputed. Minutes older than `keep` (the raw retention) are not recomputed:
-- their raw rows may be gone, and the rollup outlives them. One refresh at a
-- time per schema (an advisory transaction lock), so several sinks may call it.
-- gpu_metrics_1min_settled() is the first minute that may be stale: readers
-- (the scorer) read buckets before it only. Under the timescale license the
-- continuous aggregate's policy refreshes the rollup: the refresh just forgets
-- the notes and nothing is held back.
--
-- The aggregate list is the one 0003 wrote into gpu_metrics_insert_sql(), read
-- back from it so that the two cannot differ.
CREATE TABLE gpu_metrics_1min_pending (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    bucket   timestamptz NOT NULL,
    noted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX gpu_metrics_1min_pending_bucket ON gpu_metrics_1min_pending (bucket);

DO $migration$
DECLARE
    aggregates text;
BEGIN
    IF current_setting('timescaledb.license', true) = 'timescale' THEN
        CREATE FUNCTION gpu_metrics_1min_refresh(keep interval) RETURNS integer
        LANGUAGE sql AS $fn$
            WITH gone AS (DELETE FROM gpu_metrics_1min_pending RETURNING 1) SELECT 0
        $fn$;
        CREATE FUNCTION gpu_metrics_1min_settled() RETURNS timestamptz
        LANGUAGE sql STABLE AS $fn$ SELECT 'infinity'::timestamptz $fn$;
        RETURN;
    END IF;
    aggregates := substring(gpu_metrics_insert_sql('') FROM 'AS bucket, gpu_uuid, (.*) FROM inserted GROUP BY');
    IF aggregates IS NULL THEN
        RAISE EXCEPTION 'gpu_metrics_insert_sql() has no aggregate list';
    END IF;
    EXECUTE format($fn$
        CREATE FUNCTION gpu_metrics_1min_refresh(keep interval) RETURNS integer
        LANGUAGE plpgsql AS $body$
        DECLARE
            r record;
            n integer := 0;
        BEGIN
            PERFORM pg_advisory_xact_lock(1735357810, hashtext(current_schema()));
            FOR r IN
                WITH taken AS (DELETE FROM gpu_metrics_1min_pending RETURNING bucket),
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
    CREATE FUNCTION gpu_metrics_1min_settled() RETURNS timestamptz
    LANGUAGE sql STABLE AS $fn$
        SELECT coalesce(min(bucket), 'infinity'::timestamptz) FROM gpu_metrics_1min_pending
    $fn$;
END
$migration$;
