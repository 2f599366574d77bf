"""GPU domain knowledge: DCGM fields and counters, NVIDIA's XID catalogue, NVLink,
process rules, GPU identity, the host."""
