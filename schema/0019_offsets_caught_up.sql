-- A partition whose sink has caught up no longer holds the rollup back.
--
-- While a sink is behind, the rollup's refresh recomputes only the minutes every
-- busy partition has passed (0018). When one sink process has caught up while
-- another is still behind, the first one's refresh recomputed every noted minute,
-- the ones the other was still filling too, and they were recomputed again when
-- it finished. A sink now marks its partitions caught_up once it has stored
-- everything it was handed and nothing more is there to fetch; its next batch
-- clears the mark. The refresh bounds itself by the partitions that are busy and
-- not caught up, and refreshes everything when there are none.
--
-- "Busy" is now judged by frontier_at, when a partition's frontier last moved,
-- rather than by updated_at: a partition whose records were all refused (dead
-- letters) moves its offsets but not its frontier, and must not hold the
-- others back behind its old frontier.
ALTER TABLE kafka_offsets
    ADD COLUMN caught_up boolean NOT NULL DEFAULT false,
    ADD COLUMN frontier_at timestamptz;
UPDATE kafka_offsets SET frontier_at = updated_at WHERE frontier IS NOT NULL;
