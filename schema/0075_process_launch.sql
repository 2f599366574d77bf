-- A launched worker's job (#32): the launcher that started a GPU process (torchrun, deepspeed,
-- accelerate), the job key the GPUs of one job share (the elastic run id, else the master's
-- address and port), its ranks, and why they are not known where /proc refused them. The
-- scorer groups GPUs into a job by job_key where their samples carry no pod or job label.
ALTER TABLE gpu_processes
    ADD COLUMN launcher    text CHECK (launcher IN ('torchrun', 'deepspeed', 'accelerate')),
    ADD COLUMN job_key     text,
    ADD COLUMN rank        integer,
    ADD COLUMN local_rank  integer,
    ADD COLUMN world_size  integer,
    ADD COLUMN launch_note text;
CREATE INDEX gpu_processes_job_key ON gpu_processes (job_key, time DESC) WHERE job_key IS NOT NULL;
