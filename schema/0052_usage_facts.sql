-- Usage accounting as one function (#36): the facts shared/store/usage.py groups, and the Grafana
-- panels group the same way, so the API, its exports and the dashboards give the same numbers.
--
-- usage_facts(from_time, to_time, max_gap, single_sample_s, gpus) returns one row per GPU, host,
-- minute, label set and (class, user) in [from_time, to_time) (whole minutes), read from the usage
-- rollups (0050): `s`, the seconds each of the row's `n` samples stands for (its share of the
-- minute's class shares included), `busy_n` and `idle_n` of them busy and idle, `util_sum` their
-- utilisation, `allocated` (a job, pod or namespace label, or a process), `energy_mj` its energy.
-- gpus: only these GPUs (NULL: all). How time and energy are counted is said in
-- shared/store/usage.py and docs/usage.md; 2,000,000 mJ/s (2 kW, above any GPU's board power) caps
-- what a reset counter may have gained in a bridged gap.
CREATE FUNCTION usage_facts(from_time timestamptz, to_time timestamptz, max_gap interval,
                            single_sample_s double precision, gpus text[])
RETURNS TABLE (gpu_uuid text, hostname text, cluster text, job text, pod text, namespace text,
               bucket timestamptz, classification text, username text, s double precision,
               allocated boolean, n bigint, busy_n bigint, idle_n bigint, util_sum double precision,
               energy_mj double precision)
LANGUAGE sql STABLE AS $fn$
WITH rows AS (
    SELECT * FROM gpu_usage_1min
     WHERE bucket >= from_time AND bucket < to_time
       AND (gpus IS NULL OR gpu_uuid = ANY (gpus))
), minutes AS (
    SELECT gpu_uuid, hostname, bucket, sum(samples) AS samples,
           min(first_time) AS first_time, max(last_time) AS last_time,
           public.first(energy_first_mj, CASE WHEN energy_first_mj IS NOT NULL THEN first_time END)
               AS e_first,
           public.last(energy_last_mj, CASE WHEN energy_last_mj IS NOT NULL THEN last_time END) AS e_last,
           max(energy_max_mj) AS e_max
      FROM rows GROUP BY gpu_uuid, hostname, bucket
), linked AS (
    SELECT m.*, lag(hostname) OVER w AS prev_host, lag(e_last) OVER w AS prev_e_last,
           max(last_time) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_last
      FROM minutes m WINDOW w AS (PARTITION BY gpu_uuid ORDER BY first_time, hostname)
), marked AS (
    SELECT l.*, (prev_last IS NULL OR first_time - prev_last > max_gap OR hostname <> prev_host) AS starts
      FROM linked l
), runs AS (
    SELECT k.*,
           coalesce(lead(starts) OVER (PARTITION BY gpu_uuid ORDER BY first_time, hostname), true) AS ends
      FROM marked k
), timed AS (
    SELECT r.gpu_uuid, r.hostname, r.bucket, r.samples,
           (extract(epoch FROM r.last_time - CASE WHEN r.starts THEN r.first_time ELSE r.prev_last END)
            + CASE WHEN NOT r.ends THEN 0
                   WHEN r.samples > 1 THEN extract(epoch FROM r.last_time - r.first_time) / (r.samples - 1)
                   WHEN NOT r.starts THEN extract(epoch FROM r.first_time - r.prev_last)
                   ELSE single_sample_s END) / r.samples AS interval_s,
           CASE WHEN r.e_last >= r.e_max THEN r.e_last - r.e_first
                ELSE r.e_max - r.e_first + r.e_last END
           + CASE WHEN r.starts OR r.prev_e_last IS NULL OR r.e_first IS NULL THEN 0
                  WHEN r.e_first >= r.prev_e_last THEN r.e_first - r.prev_e_last
                  ELSE least(r.e_first, extract(epoch FROM r.first_time - r.prev_last) * 2000000.0)
             END AS energy_mj
      FROM runs r
), work AS (
    SELECT gpu_uuid, bucket, classification, username,
           polls / sum(polls) OVER (PARTITION BY gpu_uuid, bucket) AS share
      FROM gpu_work_1min WHERE bucket >= from_time AND bucket < to_time
       AND (gpus IS NULL OR gpu_uuid = ANY (gpus))
)
    SELECT u.gpu_uuid, u.hostname, u.cluster, u.job, u.pod, u.namespace, u.bucket,
           coalesce(w.classification, 'unknown') AS classification, w.username,
           (coalesce(w.share, 1) * t.interval_s)::double precision AS s,
           (u.job IS NOT NULL OR u.pod IS NOT NULL OR u.namespace IS NOT NULL
            OR coalesce(w.classification, 'unknown') NOT IN ('none', 'unknown')) AS allocated,
           u.samples AS n, u.busy_samples AS busy_n, u.idle_samples AS idle_n,
           u.gpu_util_pct_sum AS util_sum,
           (coalesce(w.share, 1) * t.energy_mj * u.samples / t.samples)::double precision AS energy_mj
      FROM rows u JOIN timed t USING (gpu_uuid, hostname, bucket)
      LEFT JOIN work w USING (gpu_uuid, bucket)
$fn$;
