"""The remediator's drivers: the schedulers a node is taken out of (Kubernetes, Slurm) and what runs on it."""
