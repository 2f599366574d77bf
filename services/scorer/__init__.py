"""Health verdicts, scores, alerts, recommended actions and failure predictions per GPU."""
