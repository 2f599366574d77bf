-- The 1-minute rollup, compression and retention, by TimescaleDB license.
--
-- The rollup keeps sums and counts (not averages), so it can be maintained
-- incrementally; v_gpu_metrics_1min derives the averages. Its aggregate list
-- is written once, below, and used by whichever path runs, so the columns and
-- the queries on them are the same under both licenses.
--
-- timescale license (official image): a continuous aggregate with a refresh
-- policy, compression after 2 days, retention policies.
-- apache license (Debian build): a plain hypertable that the sink maintains
-- in the same transaction as the rows: the rows a batch really inserted
-- (INSERT ... ON CONFLICT DO NOTHING RETURNING) are grouped by minute and
-- merged in, so a replayed sample adds nothing. Old chunks are removed by the
-- sink's retention loop with drop_chunks.
DO $migration$
DECLARE
    aggregates text := $agg$
        count(*)                              AS samples,
        sum(gpu_temp_c)                       AS gpu_temp_c_sum,
        count(gpu_temp_c)                     AS gpu_temp_c_n,
        max(gpu_temp_c)                       AS gpu_temp_c_max,
        max(memory_temp_c)                    AS memory_temp_c_max,
        sum(power_usage_w)                    AS power_usage_w_sum,
        count(power_usage_w)                  AS power_usage_w_n,
        max(power_usage_w)                    AS power_usage_w_max,
        sum(gpu_util_pct)                     AS gpu_util_pct_sum,
        count(gpu_util_pct)                   AS gpu_util_pct_n,
        sum(mem_copy_util_pct)                AS mem_copy_util_pct_sum,
        count(mem_copy_util_pct)              AS mem_copy_util_pct_n,
        max(fb_used_mib)                      AS fb_used_mib_max,
        sum(sm_clock_mhz)                     AS sm_clock_mhz_sum,
        count(sm_clock_mhz)                   AS sm_clock_mhz_n,
        min(sm_clock_mhz)                     AS sm_clock_mhz_min,
        bit_or(clocks_event_reasons)          AS clocks_event_reasons_any,
        max(xid_last)                         AS xid_last_max,
        max(ecc_sbe_volatile_total)           AS ecc_sbe_volatile_total_max,
        max(ecc_dbe_volatile_total)           AS ecc_dbe_volatile_total_max,
        max(ecc_sbe_aggregate_total)          AS ecc_sbe_aggregate_total_max,
        max(ecc_dbe_aggregate_total)          AS ecc_dbe_aggregate_total_max,
        max(retired_pages_sbe)                AS retired_pages_sbe_max,
        max(retired_pages_dbe)                AS retired_pages_dbe_max,
        max(retired_pages_pending)            AS retired_pages_pending_max,
        max(remapped_rows_correctable)        AS remapped_rows_correctable_max,
        max(remapped_rows_uncorrectable)      AS remapped_rows_uncorrectable_max,
        max(row_remap_failure)                AS row_remap_failure_max,
        max(pcie_replay_total)                AS pcie_replay_total_max,
        max(nvlink_crc_flit_errors_total)     AS nvlink_crc_flit_errors_total_max,
        max(nvlink_crc_data_errors_total)     AS nvlink_crc_data_errors_total_max,
        max(nvlink_replay_errors_total)       AS nvlink_replay_errors_total_max,
        max(nvlink_recovery_errors_total)     AS nvlink_recovery_errors_total_max,
        max(power_violation_us)               AS power_violation_us_max,
        max(thermal_violation_us)             AS thermal_violation_us_max$agg$;
    merge text;
    source_columns text;
BEGIN
    -- How a minute's stored aggregate and a batch's new one combine.
    SELECT string_agg(
             CASE
               WHEN col ~ '_(sum|n)$' OR col = 'samples' THEN format('%1$I = gpu_metrics_1min.%1$I + EXCLUDED.%1$I', col)
               WHEN col ~ '_min$' THEN format('%1$I = least(gpu_metrics_1min.%1$I, EXCLUDED.%1$I)', col)
               WHEN col ~ '_any$' THEN format('%1$I = gpu_metrics_1min.%1$I | EXCLUDED.%1$I', col)
               ELSE format('%1$I = greatest(gpu_metrics_1min.%1$I, EXCLUDED.%1$I)', col)
             END, ', ')
      INTO merge
      FROM (SELECT m[1] AS col FROM regexp_matches(aggregates, 'AS (\w+)', 'g') AS m) cols;
    -- The raw columns the aggregates read, for the RETURNING list.
    SELECT string_agg(DISTINCT m[1], ', ')
      INTO source_columns
      FROM regexp_matches(aggregates, '\((\w+)\)', 'g') AS m
     WHERE m[1] <> '*';

    IF current_setting('timescaledb.license', true) = 'timescale' THEN
        EXECUTE format(
            'CREATE MATERIALIZED VIEW gpu_metrics_1min WITH (timescaledb.continuous) AS '
            'SELECT time_bucket(interval ''1 minute'', time) AS bucket, gpu_uuid, %s '
            'FROM gpu_metrics GROUP BY bucket, gpu_uuid WITH NO DATA', aggregates);
        PERFORM add_continuous_aggregate_policy('gpu_metrics_1min',
            start_offset => interval '2 hours', end_offset => interval '1 minute',
            schedule_interval => interval '1 minute');
        EXECUTE 'ALTER TABLE gpu_metrics SET (timescaledb.compress, '
                'timescaledb.compress_segmentby = ''gpu_uuid'', timescaledb.compress_orderby = ''time DESC'')';
        PERFORM add_compression_policy('gpu_metrics', interval '2 days');
        PERFORM add_retention_policy('gpu_metrics', interval '30 days');
        PERFORM add_retention_policy('gpu_events', interval '180 days');
        PERFORM add_retention_policy('gpu_metrics_1min', interval '365 days');
    ELSE
        EXECUTE format(
            'CREATE TABLE gpu_metrics_1min AS '
            'SELECT time_bucket(interval ''1 minute'', time) AS bucket, gpu_uuid, %s '
            'FROM gpu_metrics GROUP BY bucket, gpu_uuid WITH NO DATA', aggregates);
        ALTER TABLE gpu_metrics_1min ALTER COLUMN bucket SET NOT NULL,
                                     ALTER COLUMN gpu_uuid SET NOT NULL,
                                     ADD PRIMARY KEY (gpu_uuid, bucket);
        PERFORM create_hypertable('gpu_metrics_1min', 'bucket', chunk_time_interval => interval '7 days');
    END IF;

    -- The sink's statement for a staged batch: insert the new rows and, under the
    -- apache license, fold exactly those rows into the rollup. Kept here, beside
    -- the aggregate list it depends on; the sink reads it from this function.
    EXECUTE format($fn$
        CREATE FUNCTION gpu_metrics_insert_sql(columns text) RETURNS text
        LANGUAGE sql IMMUTABLE AS $body$ SELECT %L $body$ $fn$,
        CASE WHEN current_setting('timescaledb.license', true) = 'timescale' THEN
            'INSERT INTO gpu_metrics ({cols}) SELECT {cols} FROM _stage_metrics'
            ' ON CONFLICT (gpu_uuid, time) DO NOTHING'
        ELSE
            'WITH inserted AS (INSERT INTO gpu_metrics ({cols}) SELECT {cols} FROM _stage_metrics'
            ' ON CONFLICT (gpu_uuid, time) DO NOTHING RETURNING time, gpu_uuid, ' || source_columns || '),'
            ' rolled AS (INSERT INTO gpu_metrics_1min'
            ' SELECT time_bucket(interval ''1 minute'', time) AS bucket, gpu_uuid, ' || aggregates ||
            ' FROM inserted GROUP BY bucket, gpu_uuid'
            ' ON CONFLICT (gpu_uuid, bucket) DO UPDATE SET ' || merge || ' RETURNING 1)'
            ' SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM rolled)'
        END);
END
$migration$;

-- Averages for people and dashboards, the same under both licenses.
CREATE VIEW v_gpu_metrics_1min AS
SELECT bucket, gpu_uuid, samples,
       gpu_temp_c_sum / nullif(gpu_temp_c_n, 0)               AS gpu_temp_c_avg,
       gpu_temp_c_max, memory_temp_c_max,
       power_usage_w_sum / nullif(power_usage_w_n, 0)         AS power_usage_w_avg,
       power_usage_w_max,
       gpu_util_pct_sum / nullif(gpu_util_pct_n, 0)           AS gpu_util_pct_avg,
       mem_copy_util_pct_sum / nullif(mem_copy_util_pct_n, 0) AS mem_copy_util_pct_avg,
       fb_used_mib_max,
       sm_clock_mhz_sum / nullif(sm_clock_mhz_n, 0)           AS sm_clock_mhz_avg,
       sm_clock_mhz_min, clocks_event_reasons_any, xid_last_max,
       ecc_sbe_volatile_total_max, ecc_dbe_volatile_total_max,
       ecc_sbe_aggregate_total_max, ecc_dbe_aggregate_total_max,
       retired_pages_sbe_max, retired_pages_dbe_max, retired_pages_pending_max,
       remapped_rows_correctable_max, remapped_rows_uncorrectable_max, row_remap_failure_max,
       pcie_replay_total_max, nvlink_crc_flit_errors_total_max, nvlink_crc_data_errors_total_max,
       nvlink_replay_errors_total_max, nvlink_recovery_errors_total_max,
       power_violation_us_max, thermal_violation_us_max
FROM gpu_metrics_1min;
