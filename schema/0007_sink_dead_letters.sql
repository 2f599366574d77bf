-- The sink's dead letters, recorded in the same transaction as the batch they came from
-- and its offsets: a record's offset is never stored unless the record is in the
-- hypertables or here. The sink then sends each one to the dead-letter topic and marks
-- it delivered; the primary key makes a re-read record a no-op, so each record is
-- dead-lettered once per consumer group.
CREATE TABLE sink_dead_letters (
    consumer_group    text NOT NULL,
    source_topic      text NOT NULL,
    source_partition  integer NOT NULL,
    source_offset     bigint NOT NULL CHECK (source_offset >= 0),
    key               bytea,
    value             bytea,
    category          text NOT NULL,
    reason            text NOT NULL,
    failed_at         timestamptz NOT NULL DEFAULT now(),
    -- delivery: tries so far, a lease while one sink is sending it, and when the broker took it
    attempts          integer NOT NULL DEFAULT 0,
    leased_until      timestamptz,
    delivered_at      timestamptz,
    PRIMARY KEY (consumer_group, source_topic, source_partition, source_offset)
);

CREATE INDEX sink_dead_letters_pending ON sink_dead_letters (consumer_group, failed_at)
    WHERE delivered_at IS NULL;

-- Raw, possibly hostile message values: no business of the query API's read-only role.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpuhealth_reader') THEN
        REVOKE ALL ON sink_dead_letters FROM gpuhealth_reader;
    END IF;
END
$$;
