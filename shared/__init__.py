"""Code every gpu-health service shares: settings, errors, logging, Kafka, database, migrations."""
