"""The query API: REST over the hypertables, read-only but for acknowledging an alert."""
