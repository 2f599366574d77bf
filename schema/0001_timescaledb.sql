-- TimescaleDB itself. It is created in `public` so that every schema (the
-- services' own, and the throwaway schemas tests use) finds its functions.
-- On the native stack `make services` has already created it as superuser,
-- and the official image creates it in POSTGRES_DB, so this is a no-op there.
CREATE EXTENSION IF NOT EXISTS timescaledb WITH SCHEMA public;
