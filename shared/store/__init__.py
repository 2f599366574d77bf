"""The data-access package: every SQL statement the services, the evaluation and the benches run.

Nothing outside this package (and `schema/`, the migrations) writes SQL; a test
(tests/unit/shared/store/test_owns_sql.py) fails if some does. Callers pass a
psycopg connection (sync or async, as they hold one) and get typed rows back;
driver errors come out translated into the project's own (`errors.translated`).

Modules, one per table family:
- `errors`: psycopg's exceptions into `shared.errors` (unavailable / data refused / other).
- `samples`: gpu_metrics (the straight binary COPY, the staging tables, ON CONFLICT), gpu_latest, gpu_assets.
- `events`: gpu_events.
- `rollup`: the 1-minute rollup's noted minutes and their refresh (schema/0014).
- `offsets`: kafka_offsets, every consumer group's position in the database.
- `deadletters`: sink_dead_letters, recorded with their batch, leased, marked delivered.
- `workload`: gpu_processes, gpu_process_polls, gpu_process_latest, llm_sessions, llm_server_status.
- `verifications`: gpu_verifications, gpu_systems, gpu_systems_latest.
"""
