"""Verifier: GPU compute checks, a tamper-evident audit log, system identity and MLPerf descriptions."""
