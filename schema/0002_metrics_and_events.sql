-- Samples and events: the hypertables the sink writes, with their idempotency keys.
-- Column names are the contract's field names (shared/models.py), units in the name.

CREATE TABLE gpu_metrics (
    time                          timestamptz NOT NULL,
    gpu_uuid                      text NOT NULL,
    hostname                      text NOT NULL,
    cluster                       text,
    datacenter                    text,
    region                        text,
    rack                          text,
    job                           text,
    pod                           text,
    namespace                     text,
    container                     text,
    source                        text NOT NULL,
    collector_id                  text NOT NULL,
    collection_latency_ms         double precision,
    mig                           jsonb,
    sm_clock_mhz                  double precision,
    mem_clock_mhz                 double precision,
    gpu_temp_c                    double precision,
    memory_temp_c                 double precision,
    power_usage_w                 double precision,
    total_energy_mj               bigint,
    gpu_util_pct                  double precision,
    mem_copy_util_pct             double precision,
    fb_total_mib                  bigint,
    fb_free_mib                   bigint,
    fb_used_mib                   bigint,
    fb_reserved_mib               bigint,
    pcie_tx_bytes_per_s           bigint,
    pcie_rx_bytes_per_s           bigint,
    pcie_replay_total             bigint,
    xid_last                      bigint,
    clocks_event_reasons          bigint,
    power_violation_us            bigint,
    thermal_violation_us          bigint,
    ecc_sbe_volatile_total        bigint,
    ecc_dbe_volatile_total        bigint,
    ecc_sbe_aggregate_total       bigint,
    ecc_dbe_aggregate_total       bigint,
    retired_pages_sbe             bigint,
    retired_pages_dbe             bigint,
    retired_pages_pending         bigint,
    remapped_rows_correctable     bigint,
    remapped_rows_uncorrectable   bigint,
    row_remap_failure             bigint,
    row_remap_pending             bigint,
    nvlink_bandwidth_total        bigint,
    nvlink_crc_flit_errors_total  bigint,
    nvlink_crc_data_errors_total  bigint,
    nvlink_replay_errors_total    bigint,
    nvlink_recovery_errors_total  bigint,
    prof_gr_engine_active_ratio   double precision,
    prof_sm_active_ratio          double precision,
    prof_sm_occupancy_ratio       double precision,
    prof_tensor_active_ratio      double precision,
    prof_dram_active_ratio        double precision,
    slowdown_temp_c               double precision,
    shutdown_temp_c               double precision,
    power_limit_w                 double precision,
    -- The idempotency key: a replayed or re-delivered sample is the same row.
    UNIQUE (gpu_uuid, time)
);
-- Six-hour chunks: at 10,000 GPUs sampled every 10 s that is ~22M rows a chunk.
SELECT create_hypertable('gpu_metrics', 'time', chunk_time_interval => interval '6 hours');
-- No further index: every query goes by GPU (via gpu_assets for host, rack or cluster),
-- and each extra index costs the sink on every row.

-- The newest sample of each GPU, kept by the sink: "latest" never scans the hypertable.
CREATE TABLE gpu_latest (LIKE gpu_metrics INCLUDING DEFAULTS, PRIMARY KEY (gpu_uuid));
CREATE INDEX gpu_latest_time ON gpu_latest (time);

CREATE TABLE gpu_events (
    time          timestamptz NOT NULL,
    gpu_uuid      text NOT NULL,
    kind          text NOT NULL,
    hostname      text NOT NULL,
    cluster       text,
    datacenter    text,
    rack          text,
    source        text NOT NULL,
    collector_id  text NOT NULL,
    details       jsonb NOT NULL DEFAULT '{}',
    UNIQUE (gpu_uuid, time, kind)
);
SELECT create_hypertable('gpu_events', 'time', chunk_time_interval => interval '7 days');
CREATE INDEX gpu_events_kind_time ON gpu_events (kind, time DESC);

-- Inventory: identity, placement and the limits each GPU reports about itself.
CREATE TABLE gpu_assets (
    gpu_uuid          text PRIMARY KEY,
    model             text NOT NULL,
    gpu_index         smallint NOT NULL,
    pci_bus_id        text,
    driver_version    text,
    hostname          text NOT NULL,
    cluster           text,
    datacenter        text,
    region            text,
    rack              text,
    slowdown_temp_c   double precision,
    shutdown_temp_c   double precision,
    power_limit_w     double precision,
    fb_total_mib      bigint,
    first_seen        timestamptz NOT NULL,
    last_seen         timestamptz NOT NULL
);
CREATE INDEX gpu_assets_place ON gpu_assets (cluster, datacenter, rack, hostname);

-- The sink's consumed positions, written in the same transaction as the rows.
CREATE TABLE kafka_offsets (
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    partition       integer NOT NULL,
    next_offset     bigint NOT NULL CHECK (next_offset >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);
