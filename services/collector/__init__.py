"""Per-node collector: dcgm-exporter, NVML or nvidia-smi readings, enriched, published to Kafka."""
