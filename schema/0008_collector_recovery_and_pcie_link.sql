-- Issue 17: the collector reports the driver's GPU recovery action and the PCIe link
-- (generation and width, now and at most). New nullable columns, in the hypertable and in
-- the per-GPU latest table that mirrors it; older samples read NULL.
ALTER TABLE gpu_metrics
    ADD COLUMN pcie_link_gen        bigint,
    ADD COLUMN pcie_link_gen_max    bigint,
    ADD COLUMN pcie_link_width      bigint,
    ADD COLUMN pcie_link_width_max  bigint,
    ADD COLUMN gpu_recovery_action  bigint;

ALTER TABLE gpu_latest
    ADD COLUMN pcie_link_gen        bigint,
    ADD COLUMN pcie_link_gen_max    bigint,
    ADD COLUMN pcie_link_width      bigint,
    ADD COLUMN pcie_link_width_max  bigint,
    ADD COLUMN gpu_recovery_action  bigint;
