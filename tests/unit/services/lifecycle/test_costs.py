"""The cost model's arithmetic worked by hand, and decisions that turn on the warranty and the prediction."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.lifecycle.costs import (
    Option,
    Situation,
    cheapest,
    horizon_probability,
    keep_cost,
    price_options,
    send_back_cost,
)
from services.lifecycle.decide import Decision, GpuFacts, decide
from services.lifecycle.settings import EconomicsSection
from tests.helpers.lifecycle import TODAY, bought, busy

E = EconomicsSection()  # the defaults: $2/h training, $1/h inference, $0.10/kWh, PUE 1.3, 30 days
P0 = 0.031  # the predictor's baseline (no precursor)
# A busy H100 in an 8-GPU training job: m = 0.9 x 2 - 0.7 kW x 1.3 x 0.10 = 1.709 per hour
M = 0.9 * 2.0 - 0.7 * 1.3 * 0.10


def run(facts: GpuFacts) -> Decision:
    """The cost model on the probability as given (calibration None: test_calibration.py covers it)."""
    return decide(facts, E, baseline_p30=P0, today=TODAY, calibration=None)


def cost(d: Decision, option: Option) -> float:
    found = next(o for o in d.options if o.option is option)
    assert found.expected_cost is not None, found.note
    return found.expected_cost


def test_horizon_probability_is_a_constant_hazard() -> None:
    assert horizon_probability(0.3, 30) == pytest.approx(0.3)
    assert horizon_probability(0.3, 10) == pytest.approx(1 - 0.7 ** (1 / 3))
    assert horizon_probability(0.3, 0) == 0.0


def test_keeping_a_gpu_under_warranty_for_the_whole_horizon_worked_by_hand() -> None:
    d = run(busy(0.3, bought(warranty_days=400)))
    # a failure mid-job: 0.9 busy x 8 GPUs x (2 h / 2 + 0.5 h restart) x $2 = 21.6
    # downtime: 21 days x 24 h x m; back to the vendor: $150 shipping + $200 visit
    by_hand = 0.3 * 21.6 + 0.3 * 504 * M + 0.3 * 350
    assert cost(d, Option.KEEP) == pytest.approx(by_hand)  # 369.89
    # RMA now: drain 0.9 x 8 x 0.5 h x $2 = 7.2, shipping and visit, 504 h empty,
    # the no-fault-found fee (1 - 0.3) x $300,
    # then a healthy GPU (p30 0.031) for the 216 h left: p = 1 - 0.969^(9/30)
    p_rest = 1 - (1 - P0) ** (9 / 30)
    rma_by_hand = 7.2 + 350 + 504 * M + 0.7 * 300 + p_rest * (21.6 + 504 * M + 350)
    assert cost(d, Option.RMA) == pytest.approx(rma_by_hand)  # 1440.1
    assert d.choice is Option.KEEP
    assert d.cost_of_waiting_per_day == 0.0
    assert not d.missing


def test_the_same_gpu_goes_back_while_its_warranty_still_runs_and_not_after() -> None:
    ends_in_10 = run(busy(0.3, bought(warranty_days=10)))
    # 10 of the 30 days are covered: p_in = 1 - 0.7^(1/3) = 0.112; the rest fails out of warranty and
    # costs the cheaper of repair (0.35 x 30000 + 350 + 720 h x m) and retirement (3 years of work lost)
    p_in = 1 - 0.7 ** (1 / 3)
    repair = 10_500 + 350 + 720 * M
    by_hand = 0.3 * 21.6 + p_in * (504 * M + 350) + (0.3 - p_in) * repair
    assert cost(ends_in_10, Option.KEEP) == pytest.approx(by_hand)  # 2412.2
    assert ends_in_10.choice is Option.RMA
    assert ends_in_10.cost_of_waiting_per_day == pytest.approx((by_hand - cost(ends_in_10, Option.RMA)) / 30)

    ended = run(busy(0.3, bought(warranty_days=-1)))
    assert ended.choice is Option.KEEP  # a repair now costs what a failure would, for sure instead of at 0.3
    assert next(o for o in ended.options if o.option is Option.RMA).note == "the warranty has ended"
    assert cost(ended, Option.REPAIR) > cost(ended, Option.KEEP)


def test_a_rising_prediction_sends_a_gpu_of_a_big_job_back_once_failure_costs_more_than_the_drain() -> None:
    # a 256-GPU job and a spare on hand: a failure loses 0.9 x 256 x 1.5 h x $2 = 691.2; the slot is empty 4 h
    def at(p30: float) -> Decision:
        return run(busy(p30, bought(warranty_days=400, spares=2), job_gpus=256))

    low, high = at(0.05), at(0.9)
    assert cost(low, Option.KEEP) == pytest.approx(0.05 * (691.2 + 4 * M + 350))
    assert low.choice is Option.KEEP
    # RMA: drain 0.9 x 256 x 0.5 h x $2 = 230.4, $350, 4 h empty, (1 - 0.9) x $300, then healthy for 716 h
    p_rest = 1 - (1 - P0) ** (716 / 24 / 30)
    assert cost(high, Option.RMA) == pytest.approx(
        230.4 + 350 + 4 * M + 0.1 * 300 + p_rest * (691.2 + 4 * M + 350)
    )
    assert high.choice is Option.RMA
    choices = [at(p / 20).choice for p in range(21)]
    first = choices.index(Option.RMA)
    assert set(choices[:first]) == {Option.KEEP}, choices
    assert set(choices[first:]) == {Option.RMA}, choices


def test_a_failed_gpu_is_reseated_first_and_sent_back_once_the_scorer_says_repair() -> None:
    failed = dict(failed=True, finding="check_mechanicals", p_fail_30d=None)
    first = run(busy(None, bought(warranty_days=400), **failed))
    # left alone it serves nothing for 720 h, and the RMA is still due after (504 h away, shipping, visit)
    rma_later = 350 + 504 * M
    assert cost(first, Option.KEEP) == pytest.approx(720 * M + rma_later)
    # RMA now: 504 h away, the no-fault-found fee unless the vendor finds a defect (with no prediction, the
    # predictor's baseline: 1 - 0.031 of $300), then a healthy GPU for the 216 h left
    healthy = replace(_situation(first), failed=False, finding=None, p30=P0)
    rma_now = 350 + 504 * M + (1 - P0) * 300 + keep_cost(healthy, E, 216)[0]
    assert cost(first, Option.RMA) == pytest.approx(rma_now)
    # reseat: a visit and 2 h out; with 0.6 a healthy GPU for 718 h, with 0.4 sent back then (718 h left)
    then = 350 + 504 * M + (1 - (1 - (1 - P0) ** (718 / 720))) * 300 + keep_cost(healthy, E, 718 - 504)[0]
    reseat = 200 + 2 * M + 0.6 * keep_cost(healthy, E, 718)[0] + 0.4 * then
    assert cost(first, Option.RESET) == pytest.approx(reseat)  # 833 against 1517 for the RMA
    assert first.choice is Option.RESET
    assert first.missing[0].input == "the failure prediction (would the vendor find a fault?)"

    # reset twice this month already: a reseat is another remedy and keeps its 0.6; a third reset (no visit)
    # clears it with 0.15 only, and the vendor would most likely find nothing either
    again = run(busy(None, bought(warranty_days=400), resets_30d=2, **failed))
    assert cost(again, Option.RESET) == pytest.approx(reseat)
    soft = run(busy(None, bought(warranty_days=400), resets_30d=2, **{**failed, "finding": "reset_gpu"}))
    assert cost(soft, Option.RESET) == pytest.approx(
        2 * M + 0.15 * keep_cost(healthy, E, 718)[0] + 0.85 * then
    )
    assert soft.choice is Option.RESET
    assert (
        soft.missing[0].effect == "reset from 0.0 to 1.0"
    )  # cheap enough to try, whatever the vendor would say
    # the scorer's patterns escalate repeated remediations to send_for_repair: then the vendor finds it
    escalated = run(
        busy(None, bought(warranty_days=400), resets_30d=3, failed=True, finding="send_for_repair")
    )
    assert escalated.choice is Option.RMA


def test_a_failed_gpu_out_of_warranty_is_repaired_while_young_and_retired_when_its_years_are_spent() -> None:
    failed = dict(failed=True, finding="send_for_repair", p_fail_30d=None)
    young = run(busy(None, bought(warranty_days=-30, age_days=3 * 365 + 30), **failed))
    assert young.choice is Option.REPAIR
    # repair: $350 + $10,500 and 30 days away, which is the whole horizon
    assert cost(young, Option.REPAIR) == pytest.approx(350 + 10_500 + 720 * M)
    old = run(busy(None, bought(warranty_days=-700, age_days=6 * 365), **failed))
    # nothing of its useful life is left: a visit and an empty slot for the horizon; keeping it is the same
    # money (retired after waiting), and a GPU that cannot serve is acted on at a tie
    assert cost(old, Option.RETIRE) == pytest.approx(200 + 720 * M)
    assert cost(old, Option.KEEP) == pytest.approx(200 + 720 * M)
    assert old.choice is Option.RETIRE


def test_a_gpu_kept_failed_past_its_warranty_pays_for_the_repair_its_rma_would_have_been() -> None:
    d = run(busy(None, bought(warranty_days=5), failed=True, finding="send_for_repair"))
    assert cost(d, Option.KEEP) == pytest.approx(720 * M + 10_500 + 350 + 720 * M)
    assert d.choice is Option.RMA


def test_a_failing_gpu_of_a_huge_job_out_of_warranty_moves_to_inference_once_failures_cost_more() -> None:
    def at(p30: float) -> Decision:
        return run(busy(p30, bought(warranty_days=-100, age_days=1300), job_gpus=1024))

    d = at(0.6)
    # inference at 0.5 busy: m2 = 0.5 x $1 - 0.091 = 0.409; the value lost is 720 h x (m - m2); the drain
    # 0.9 x 1024 x 0.5 h x $2 = 921.6; an inference failure loses 0.5 x 0.05 h x $1, then the repair
    m2 = 0.5 * 1.0 - 0.091
    value_lost = 720 * (M - m2)
    assert next(o for o in d.options if o.option is Option.REPURPOSE).parts["value_lost"] == pytest.approx(
        value_lost
    )
    assert cost(d, Option.REPURPOSE) == pytest.approx(value_lost + 921.6 + _inference_keep(0.6, m2))
    assert d.choice is Option.REPURPOSE
    assert at(0.3).choice is Option.KEEP  # a failure at 0.3 costs less than the value inference gives up


def _inference_keep(p30: float, m2: float) -> float:
    """Keeping it in inference out of warranty: a failure loses 0.025 GPU-hours, then is repaired."""
    repair = 10_500 + 350 + 720 * m2
    return p30 * (0.5 * 0.05 * 1.0) + p30 * repair


def test_without_a_prediction_the_decision_is_left_open_with_where_each_option_wins() -> None:
    d = run(busy(None, bought(warranty_days=10)))
    assert d.choice is None
    assert d.options == ()
    assert "p_fail_30d" not in {t.name for t in d.terms}, "a guessed probability"
    assert d.missing[0].input == "the failure probability"
    assert d.missing[0].effect.startswith("no failure prediction for this GPU (too little history); keep")
    assert "; keep for p30 0-0." in d.missing[0].effect, d.missing[0].effect
    assert "rma for p30" in d.missing[0].effect
    assert d.to_json()["decision"] == "undecided"


def test_missing_inputs_are_listed_with_what_their_range_does_to_the_answer() -> None:
    d = run(busy(0.3, None, job_gpus=None, resets_30d=None, utilisation=None))
    said = {m.input: m for m in d.missing}
    assert said["the warranty's end (the GPU has no inventory row)"].assumed == 0.0
    assert said["utilisation (no metrics in the window)"].assumed == 0.5
    assert said["the remediation history (resets in the last 30 days)"].effect == "keep from 0 to 1"
    # priced as out of warranty; were the warranty running for the whole horizon, nothing would change
    assert all(m.effect for m in d.missing)
    sources = {t.name: t.source for t in d.terms}
    assert sources["job_gpus"] == "assumption"
    assert sources["p_fail_30d"] == "predictor"


def test_a_decision_is_json_with_every_option_and_term() -> None:
    d = run(busy(0.3, bought(warranty_days=10)))
    body = json.loads(json.dumps(d.to_json()))
    assert body["decision"] == "rma"
    assert {o["option"] for o in body["options"]} == {o.value for o in Option}
    assert [o for o in body["options"] if o["expected_cost"] is None] == body["options"][-2:]


def _situation(d: Decision) -> Situation:
    values = {t.name: t.value for t in d.terms}
    return Situation(
        p30=values.get("p_fail_30d", 0.0),
        failed=values["failed"],
        finding=values["finding"],
        utilisation=values["utilisation"],
        power_w=values["power_w"],
        work=values["work"],
        job_gpus=values["job_gpus"],
        resets_30d=values["resets_30d"],
        warranty_days_left=values["warranty_days_left"],
        rma_turnaround_days=values["rma_turnaround_days"],
        spares=values["spares"],
        purchase_price=values["purchase_price"],
        age_years=values["age_years"],
    )


_situations = st.builds(
    Situation,
    p30=st.floats(0, 1),
    failed=st.booleans(),
    finding=st.sampled_from([None, "reset_gpu", "check_mechanicals", "send_for_repair", "inspect"]),
    utilisation=st.floats(0, 1),
    power_w=st.floats(0, 1500),
    work=st.sampled_from(["training", "inference", "idle"]),
    job_gpus=st.integers(1, 100_000),
    resets_30d=st.integers(0, 50),
    warranty_days_left=st.floats(-5000, 5000),
    rma_turnaround_days=st.floats(0, 365),
    spares=st.booleans(),
    purchase_price=st.floats(0, 1e7),
    age_years=st.floats(0, 30),
)


@settings(max_examples=300, deadline=None)
@given(s=_situations, baseline=st.floats(0, 1))
def test_every_cost_is_finite_and_non_negative_and_the_cheapest_comes_first(
    s: Situation, baseline: float
) -> None:
    options = price_options(s, E, baseline)
    priced = [o.expected_cost for o in options if o.expected_cost is not None]
    assert len(options) == len(Option)
    assert all(c >= 0 and c < float("inf") for c in priced)
    assert priced == sorted(priced)
    assert all(v >= -1e-9 for o in options for v in o.parts.values())


@settings(max_examples=200, deadline=None)
@given(
    s=_situations.filter(lambda s: not s.failed and not 0 < s.warranty_days_left < 30),
    lo=st.floats(0, 1),
    hi=st.floats(0, 1),
)
def test_a_higher_prediction_never_makes_keeping_cheaper(s: Situation, lo: float, hi: float) -> None:
    """Unless the warranty ends inside the horizon: there a GPU sure to fail at once fails while it runs, and
    one likely to fail later does so after (hypothesis found that; the case below keeps it)."""
    lo, hi = min(lo, hi), max(lo, hi)
    assert keep_cost(replace(s, p30=lo), E)[0] <= keep_cost(replace(s, p30=hi), E)[0] + 1e-6


def test_inside_the_horizon_a_surer_failure_can_be_cheaper_because_it_comes_under_warranty() -> None:
    s = Situation(
        p30=0.0,
        failed=False,
        finding=None,
        utilisation=1.0,
        power_w=0.0,
        work="training",
        job_gpus=1,
        resets_30d=0,
        warranty_days_left=1.0,
        rma_turnaround_days=0.0,
        spares=False,
        purchase_price=0.0,
        age_years=0.0,
    )
    assert keep_cost(replace(s, p30=1.0), E)[0] < keep_cost(replace(s, p30=0.9), E)[0]


@settings(max_examples=200, deadline=None)
@given(
    s=_situations.filter(lambda s: not s.failed and not 0 < s.warranty_days_left < 30),
    lo=st.floats(0, 1),
    hi=st.floats(0, 1),
    baseline=st.floats(0, 1),
)
def test_a_rising_prediction_never_turns_a_send_back_into_keeping_it(
    s: Situation, lo: float, hi: float, baseline: float
) -> None:
    """Keeping only gets dearer as p30 rises, and sending back only cheaper (the vendor more likely finds a
    fault): a GPU sent back at one prediction is never kept at a higher one."""
    lo, hi = min(lo, hi), max(lo, hi)
    at_lo = cheapest(price_options(replace(s, p30=lo), E, baseline)).option
    at_hi = cheapest(price_options(replace(s, p30=hi), E, baseline)).option
    if at_lo in (Option.RMA, Option.REPAIR):
        assert at_hi is not Option.KEEP


@settings(max_examples=200, deadline=None)
@given(s=_situations, baseline=st.floats(0, 1))
def test_a_send_back_is_an_rma_exactly_while_the_warranty_runs_and_never_dearer_for_it(
    s: Situation, baseline: float
) -> None:
    """At the warranty's end the send-back turns from an RMA into a paid repair; with the vendor no slower
    under warranty than a repairer, the warranty only ever makes the send-back itself cheaper (what follows
    its return is the keep cost's business: a GPU back sooner has more of the horizon left to fail in)."""
    priced = {o.option: o for o in price_options(s, E, baseline)}
    under = s.warranty_days_left > 0
    assert (priced[Option.RMA].expected_cost is not None) is under
    assert (priced[Option.REPAIR].expected_cost is not None) is not under
    if s.rma_turnaround_days <= E.repair_turnaround_days:
        rma = send_back_cost(replace(s, warranty_days_left=max(s.warranty_days_left, 1.0)), E, baseline, 720)
        repair = send_back_cost(replace(s, warranty_days_left=0.0), E, baseline, 720)
        assert (rma.option, repair.option) == (Option.RMA, Option.REPAIR)
        itself = [sum(v for k, v in o.parts.items() if k != "after_return") for o in (rma, repair)]
        assert itself[0] <= itself[1] + 1e-6
