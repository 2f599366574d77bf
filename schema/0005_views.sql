-- Views for people at psql. Both read small per-GPU tables (gpu_latest,
-- gpu_status, gpu_assets), never a DISTINCT ON scan of the hypertable, so they
-- stay fast at 10,000 GPUs.

CREATE VIEW v_latest_gpu_metrics AS
SELECT l.*, a.model, a.gpu_index
FROM gpu_latest l
JOIN gpu_assets a USING (gpu_uuid);

-- "Missing" is measured against the newest sample in the fleet rather than
-- now(), so a fleet replayed or simulated on its own clock is judged on it.
CREATE VIEW v_fleet_health_summary AS
WITH newest AS (SELECT max(time) AS t FROM gpu_latest),
     open_alerts AS (
        SELECT gpu_uuid, count(*) AS n FROM gpu_alerts WHERE state <> 'resolved' GROUP BY gpu_uuid
     )
SELECT a.cluster,
       a.datacenter,
       count(*)                                                   AS gpus,
       count(*) FILTER (WHERE s.state = 'healthy')                AS healthy,
       count(*) FILTER (WHERE s.state = 'degraded')               AS degraded,
       count(*) FILTER (WHERE s.state = 'unhealthy')              AS unhealthy,
       count(*) FILTER (WHERE s.state IS NULL)                    AS not_scored,
       count(*) FILTER (WHERE l.time IS NULL
                           OR l.time < newest.t - interval '2 minutes') AS missing,
       coalesce(sum(oa.n), 0)::bigint                             AS open_alerts,
       round(avg(l.gpu_temp_c)::numeric, 1)                       AS avg_temp_c,
       round(sum(l.power_usage_w)::numeric, 0)                    AS power_w,
       round(avg(l.gpu_util_pct)::numeric, 1)                     AS avg_util_pct,
       round(avg(s.score)::numeric, 1)                            AS avg_score
FROM gpu_assets a
CROSS JOIN newest
LEFT JOIN gpu_latest l USING (gpu_uuid)
LEFT JOIN gpu_status s USING (gpu_uuid)
LEFT JOIN open_alerts oa USING (gpu_uuid)
GROUP BY a.cluster, a.datacenter;
