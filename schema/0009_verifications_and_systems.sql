-- gpu-verifications (compute checks and logged operations, chained per GPU by SHA-256)
-- and gpu-systems (each node's identity), as the sink stores them.

-- Every record, kept: the audit trail is never dropped by retention. `sha256` is the
-- record's own link (the SHA-256 of its canonical JSON, shared/chain.py); the next
-- record of the same GPU carries it as `prev_sha256`. A replayed record is the same
-- (gpu_uuid, time, sha256) and adds nothing; a forged one with the same seq but other
-- content is kept beside the real one, as evidence.
CREATE TABLE gpu_verifications (
    time             timestamptz NOT NULL,
    gpu_uuid         text NOT NULL,
    seq              bigint NOT NULL CHECK (seq >= 0),
    kind             text NOT NULL,
    name             text NOT NULL,
    outcome          text NOT NULL,
    hostname         text NOT NULL,
    device           text NOT NULL,
    backend          text,
    device_ms        double precision,
    cpu_ms           double precision,
    speedup          double precision,
    prev_sha256      text NOT NULL CHECK (prev_sha256 ~ '^[0-9a-f]{64}$'),
    sha256           text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    record           jsonb NOT NULL,
    source_partition integer NOT NULL,
    source_offset    bigint NOT NULL,
    UNIQUE (gpu_uuid, time, sha256)
);
SELECT create_hypertable('gpu_verifications', 'time', chunk_time_interval => interval '30 days');
CREATE INDEX gpu_verifications_gpu_seq ON gpu_verifications (gpu_uuid, seq DESC, time DESC);

-- Every identity a node announced (at collector start and when it changed).
CREATE TABLE gpu_systems (
    time             timestamptz NOT NULL,
    hostname         text NOT NULL,
    identity_sha256  text NOT NULL,
    source           text NOT NULL,
    gpus             integer NOT NULL CHECK (gpus >= 0),
    record           jsonb NOT NULL,
    PRIMARY KEY (hostname, time, identity_sha256)
);

-- The newest identity per node, kept by the sink (no scan of the history for "latest").
CREATE TABLE gpu_systems_latest (
    hostname         text PRIMARY KEY,
    time             timestamptz NOT NULL,
    identity_sha256  text NOT NULL,
    source           text NOT NULL,
    gpus             integer NOT NULL CHECK (gpus >= 0),
    record           jsonb NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The query API's role reads these (0006 set default privileges; granted again here so the
-- rights hold however the schema was created).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpuhealth_reader') THEN
        GRANT SELECT ON gpu_verifications, gpu_systems, gpu_systems_latest TO gpuhealth_reader;
    END IF;
END
$$;
