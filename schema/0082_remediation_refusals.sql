-- #41: the remediator believes only what it can check. A verdict or alert it refuses (unsigned, wrongly
-- signed, stale, of an unknown GPU or the wrong host) is recorded as a `refusal` record, and a plan may
-- wait (`nodes_out`) because the remediator already holds as many nodes out as its cap allows.
ALTER TABLE remediation_events DROP CONSTRAINT remediation_events_kind_check;
ALTER TABLE remediation_events ADD CONSTRAINT remediation_events_kind_check
    CHECK (kind IN ('decision', 'action', 'outcome', 'validation', 'breaker', 'control', 'refusal'));

ALTER TABLE remediations DROP CONSTRAINT remediations_held_for_check;
ALTER TABLE remediations ADD CONSTRAINT remediations_held_for_check
    CHECK (held_for IN ('approval', 'breaker', 'rate_limit', 'class_limit', 'nodes_out'));
