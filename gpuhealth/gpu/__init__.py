"""Reading a node's GPUs through NVML or nvidia-smi: the collector's sources, and `gpuhealth.training`'s."""
