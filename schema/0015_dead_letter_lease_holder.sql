-- A dead-letter lease names the database session that took it (its backend pid), so a
-- lease whose holder is gone (a sink killed between leasing and delivering) is void at
-- once instead of blocking the letters until leased_until: a restarted sink relays them.
-- A reused pid only falls back to the time bound.
ALTER TABLE sink_dead_letters ADD COLUMN leased_by integer;
