-- A GPU's alerts over a time range (#36: what ran on a GPU, its verdicts and alerts): found by GPU,
-- not by scanning every alert the fleet ever had.
CREATE INDEX gpu_alerts_gpu ON gpu_alerts (gpu_uuid, opened_at);
