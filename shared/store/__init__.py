"""The data-access package: every SQL statement the services, the evaluation and the benches run.

Nothing outside this package (and `schema/`, the migrations) writes SQL; a test
(tests/unit/shared/store/test_owns_sql.py) fails if some does. Callers pass a
psycopg connection (sync or async, as they hold one) and get typed rows back;
driver errors come out translated into the project's own (`errors.translated`).

Modules, one per table family:
- `errors`: psycopg's exceptions into `shared.plumbing.errors` (unavailable / data refused / other).
- `results`: one statement's rows as dicts or tuples, sync or async, errors translated.
- `server`: TimescaleDB's version and license, the search_path, throwaway schemas.
- `migrations`: the migration runner's lock and `schema_migrations` bookkeeping (the files stay in schema/).
- `archive`: chunks past retention, their columns, their rows as Arrow (COPY), hypertable sizes.
- `archive_duckdb`: DuckDB views over the Parquet archive UNION ALL the live rows.
- `retention`: the retention lock, drop_chunks, policies, a chunk's SHARE lock, VACUUM.
- `fleet`: gpu_assets, gpu_status, gpu_latest read fleet-wide: the API's summary, GPU list (its sort
  keys and their psycopg.sql composition) and GPU detail; the newest sample
  (the benches' synthetic fleets are bench/fleets.py).
- `health`: gpu_status, gpu_health_current, gpu_health, gpu_failure_predictions: the scorer's cycle
  writes, the verdicts read back (Prometheus series, evaluation), the API's history and predictions.
- `alerts`: gpu_alerts: the scorer opens, refreshes and resolves; the API lists and acknowledges.
- `repairs`: gpu_repairs (schema/0031): operators' marks that a GPU was repaired or came back.
- `remedies`: gpu_remedies (schema/0080): GPU resets and node reboots carried out, by whom.
- `history`: a GPU's metric series (raw or rollup) and the event list, for the API.
- `verdict_inputs`: the scorer's feature and prediction windows over the settled 1-minute rollup,
  XID, loss and memory events, the inventory; each over every GPU or the given ones.
- `verdict_rows`: the rows those statements return, in their column order.
- `judging`: which GPUs a scorer judges: its share's inventory, and those whose verdict can have changed.
- `correlated_inputs`: what several GPUs show together, for the scorer: a job's application XIDs across
  its GPUs, a fault across a node or a rack.
- `notify`: the scorer's pg_notify at a cycle's commit; the API cache's LISTEN.
- `samples`: gpu_metrics (the straight binary COPY, the staging tables, ON CONFLICT), gpu_latest, gpu_assets.
- `events`: gpu_events (the sink's batches, the scorer's event fast path).
- `rollup`: the 1-minute rollup's noted minutes and their refresh (schema/0014).
- `offsets`: kafka_offsets, every consumer group's position in the database.
- `deadletters`: sink_dead_letters, recorded with their batch, leased, marked delivered.
- `workload`: gpu_processes, gpu_process_polls, gpu_process_latest, gpu_work_1min, llm_sessions,
  llm_server_status.
- `usage`: GPU-hours by job, pod, namespace, user, class or placement over the usage rollups (schema/0050).
- `gpu_timeline`: one GPU over a range: its jobs, classes, processes, verdicts, alerts and events.
- `verifications`: gpu_verifications, gpu_systems, gpu_systems_latest.
- `remediation`: the remediator's decisions, its plans (remediations) and the cordons and drains it
  owns (schema/0030).
- `remediation_ledger`: remediation_events, their outbox to gpu-remediations, the pause and the breaker.
- `lifecycle`: lifecycle_inventory, lifecycle_runs, lifecycle_decisions: the lifecycle service's inputs
  and decisions, the API's reads.
"""
