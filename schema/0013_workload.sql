-- Workload telemetry (#19): processes per GPU with their classification, and LLM serving
-- sessions and server snapshots. All three are hypertables with an idempotency key, so a
-- re-delivered Kafka message changes nothing.

-- One row per process per poll. A poll of a GPU with no processes leaves no row here but
-- one in gpu_process_polls, so "what runs on this GPU now" can be answered as "nothing".
CREATE TABLE gpu_processes (
    time            timestamptz NOT NULL,
    gpu_uuid        text NOT NULL,
    pid             integer NOT NULL,
    hostname        text NOT NULL,
    type            text NOT NULL CHECK (type IN ('compute', 'graphics', 'compute+graphics')),
    used_memory_mib bigint,
    sm_util_pct     double precision,
    mem_util_pct    double precision,
    executable      text,
    command_line    text,
    username        text,
    start_time      timestamptz,
    container_id    text,
    pod_uid         text,
    qos_class       text,
    classification  text NOT NULL
        CHECK (classification IN ('training', 'inference', 'llm_serving', 'gaming', 'compute')),
    rule            text NOT NULL,
    PRIMARY KEY (gpu_uuid, time, pid)
);
SELECT create_hypertable('gpu_processes', 'time', chunk_time_interval => interval '1 day');
CREATE INDEX gpu_processes_pod ON gpu_processes (pod_uid, time DESC) WHERE pod_uid IS NOT NULL;

CREATE TABLE gpu_process_polls (
    time            timestamptz NOT NULL,
    gpu_uuid        text NOT NULL,
    gpu_index       integer NOT NULL,
    hostname        text NOT NULL,
    collector_id    text NOT NULL,
    source          text NOT NULL,
    process_count   integer NOT NULL,
    PRIMARY KEY (gpu_uuid, time)
);
SELECT create_hypertable('gpu_process_polls', 'time', chunk_time_interval => interval '1 day');

-- Each GPU's newest poll: the API's "now" without scanning the hypertable.
CREATE TABLE gpu_process_latest (
    gpu_uuid        text PRIMARY KEY,
    time            timestamptz NOT NULL,
    gpu_index       integer NOT NULL,
    hostname        text NOT NULL,
    process_count   integer NOT NULL
);

CREATE TABLE llm_sessions (
    time                timestamptz NOT NULL,
    request_id          text NOT NULL,
    source              text NOT NULL,
    monitor_id          text NOT NULL,
    server              text NOT NULL,
    engine              text NOT NULL,
    endpoint            text NOT NULL,
    model               text NOT NULL,
    streamed            boolean NOT NULL,
    http_status         integer NOT NULL,
    ok                  boolean NOT NULL,
    error               text,
    prompt_tokens       bigint,
    completion_tokens   bigint,
    load_ms             double precision,
    prompt_eval_ms      double precision,
    eval_ms             double precision,
    total_ms            double precision,
    ttft_ms             double precision,
    wall_ms             double precision NOT NULL,
    tokens_per_s        double precision,
    tpot_ms             double precision,
    PRIMARY KEY (request_id, time)
);
SELECT create_hypertable('llm_sessions', 'time', chunk_time_interval => interval '1 day');
CREATE INDEX llm_sessions_model ON llm_sessions (model, time DESC);

CREATE TABLE llm_server_status (
    time                    timestamptz NOT NULL,
    server                  text NOT NULL,
    engine                  text NOT NULL,
    monitor_id              text NOT NULL,
    up                      boolean NOT NULL,
    version                 text,
    models                  jsonb NOT NULL DEFAULT '[]',
    requests_running        double precision,
    requests_waiting        double precision,
    kv_cache_usage_ratio    double precision,
    ttft_ms                 double precision,
    tpot_ms                 double precision,
    prompt_tokens           bigint,
    completion_tokens       bigint,
    PRIMARY KEY (server, time)
);
SELECT create_hypertable('llm_server_status', 'time', chunk_time_interval => interval '1 day');

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpuhealth_reader') THEN
        EXECUTE format('GRANT SELECT ON gpu_processes, gpu_process_polls, gpu_process_latest, llm_sessions,'
                       ' llm_server_status TO gpuhealth_reader');
    END IF;
END
$$;
