"""A simulated GPU fleet that speaks NVIDIA dcgm-exporter's Prometheus exposition format."""
