-- Lifecycle decisions with money on them (services/lifecycle): the operator's inventory as last
-- loaded and the rows it refused, each run's fleet-wide assumptions, and every GPU's decision over
-- time (a hypertable; the same decisions are published on gpu-lifecycle).

-- The inventory file's good rows, replaced whole at each load (docs/lifecycle.md: the format).
CREATE TABLE lifecycle_inventory (
    line                 integer PRIMARY KEY CHECK (line > 0),
    serial               text,
    gpu_uuid             text,
    purchase_date        date,
    purchase_price       double precision CHECK (purchase_price >= 0),
    warranty_end         date,
    rma_turnaround_days  integer CHECK (rma_turnaround_days >= 0),
    spares_on_hand       integer CHECK (spares_on_hand >= 0),
    note                 text,
    loaded_at            timestamptz NOT NULL,
    CHECK (serial IS NOT NULL OR gpu_uuid IS NOT NULL),
    CHECK (warranty_end IS NULL OR purchase_date IS NULL OR warranty_end >= purchase_date)
);
-- A GPU named twice is refused by the loader; these say so to anything else that writes here.
CREATE UNIQUE INDEX lifecycle_inventory_serial ON lifecycle_inventory (serial) WHERE serial IS NOT NULL;
CREATE UNIQUE INDEX lifecycle_inventory_gpu ON lifecycle_inventory (gpu_uuid) WHERE gpu_uuid IS NOT NULL;

-- The rows the last load refused, each with every reason; line 0 is the file as a whole (unreadable,
-- an unknown column): then no row loaded.
CREATE TABLE lifecycle_inventory_problems (
    line       integer NOT NULL CHECK (line >= 0),
    gpu        text,
    problem    text NOT NULL,
    loaded_at  timestamptz NOT NULL
);
CREATE INDEX lifecycle_inventory_problems_line ON lifecycle_inventory_problems (line);

-- One row per decision run: why it ran, what it read, and the assumptions every decision was priced with.
CREATE TABLE lifecycle_runs (
    time                timestamptz PRIMARY KEY,
    trigger             text NOT NULL CHECK (trigger IN ('start', 'schedule', 'inventory', 'once')),
    inventory_file      text,
    inventory_rows      integer NOT NULL CHECK (inventory_rows >= 0),
    inventory_problems  integer NOT NULL CHECK (inventory_problems >= 0),
    gpus                integer NOT NULL CHECK (gpus >= 0),
    currency            text NOT NULL,
    horizon_days        double precision NOT NULL CHECK (horizon_days > 0),
    assumptions         jsonb NOT NULL,
    missing_inputs      jsonb NOT NULL DEFAULT '[]'   -- fleet-wide: a source nobody could read this run
);

-- Every GPU's decision at every run: the choice, its cost and keeping's, and the whole reasoning.
CREATE TABLE lifecycle_decisions (
    time                     timestamptz NOT NULL,   -- the run's
    gpu_uuid                 text NOT NULL,
    serial                   text,
    hostname                 text,
    model                    text,
    decision                 text NOT NULL
        CHECK (decision IN ('keep', 'reset', 'rma', 'repair', 'repurpose', 'retire', 'undecided')),
    expected_cost            double precision CHECK (expected_cost >= 0),   -- the choice's; null: undecided
    keep_cost                double precision CHECK (keep_cost >= 0),
    cost_of_waiting_per_day  double precision NOT NULL CHECK (cost_of_waiting_per_day >= 0),
    p_fail_30d               double precision CHECK (p_fail_30d BETWEEN 0 AND 1),
    warranty_end             date,
    why                      text NOT NULL,
    options                  jsonb NOT NULL,
    terms                    jsonb NOT NULL,
    missing                  jsonb NOT NULL,
    PRIMARY KEY (gpu_uuid, time)
);
SELECT public.create_hypertable('lifecycle_decisions', 'time', chunk_time_interval => interval '7 days');
CREATE INDEX lifecycle_decisions_run ON lifecycle_decisions (time DESC, decision);

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpuhealth_reader') THEN
        GRANT SELECT ON lifecycle_inventory, lifecycle_inventory_problems, lifecycle_runs, lifecycle_decisions
            TO gpuhealth_reader;
    END IF;
END
$$;
