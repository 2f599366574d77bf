"""Kafka -> TimescaleDB: idempotent batches, offsets stored with the rows, dead letters."""
