"""The remediation service: acts on the scorer's verdicts (cordon, drain, reset, validate, return), safely."""
