"""GPUHEALTH_LIFECYCLE__* (schedule, inventory file) and GPUHEALTH_ECONOMICS__* (the fleet's prices).

The economics are the fleet-wide assumptions every decision is priced with;
each decision lists the ones it used beside its terms. The defaults are an
example fleet's (H100-class GPUs rented out at about $2 an hour), not advice:
set your own. Money is in `currency`, whatever it is; times in hours or days
as named.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from shared.settings.common import Section, Settings

PREDICTOR_WEIGHTS_FILE = Path(__file__).resolve().parents[2] / "config" / "predictor-weights.toml"
PREDICTOR_CALIBRATION_FILE = PREDICTOR_WEIGHTS_FILE.with_name("predictor-calibration.toml")


class EconomicsSection(Section):
    """GPUHEALTH_ECONOMICS__*: what a GPU-hour is worth, what power, failures, visits and repairs cost."""

    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    """The currency of every amount here and in the inventory (ISO 4217 code); only a label."""
    training_value_per_gpu_hour: float = Field(default=2.0, ge=0, le=10_000)
    """What an hour of a busy GPU is worth to training (and other compute) work."""
    inference_value_per_gpu_hour: float = Field(default=1.0, ge=0, le=10_000)
    """What an hour of a busy GPU is worth to inference (and LLM serving)."""
    power_price_per_kwh: float = Field(default=0.10, ge=0, le=100)
    """The price of a kWh at the meter."""
    pue: float = Field(default=1.3, ge=1, le=5)
    """Power usage effectiveness: the facility's kWh per kWh the GPU draws (cooling, conversion)."""
    checkpoint_interval_h: float = Field(default=2.0, gt=0, le=1000)
    """Hours between a training job's checkpoints: a failure loses half of it on average, on every GPU of
    the job."""
    job_restart_h: float = Field(default=0.5, ge=0, le=1000)
    """Hours a failed or drained job's GPUs stand idle while it restarts."""
    job_gpus_when_unknown: int = Field(default=8, ge=1, le=1_000_000)
    """GPUs a training job spans where the workload tables cannot tell (a decision lists it as missing)."""
    inference_failure_h: float = Field(default=0.05, ge=0, le=1000)
    """GPU-hours of work an inference server loses when its GPU fails (requests are retried elsewhere)."""
    technician_visit_cost: float = Field(default=200.0, ge=0, le=1_000_000)
    """What a technician's visit to a node costs (a reseat, a swap, packing a GPU for shipping)."""
    reset_downtime_h: float = Field(default=2.0, ge=0, le=1000)
    """Hours a reset or reseat keeps the GPU out of service, re-validation included."""
    reset_fix_probability: float = Field(default=0.6, ge=0, le=1)
    """The chance a reset or reseat clears a finding the action ladder says a reset or reseat addresses,
    on a GPU not reset in the last 30 days."""
    reset_fix_probability_after_reset: float = Field(default=0.15, ge=0, le=1)
    """The same chance for a reset where the GPU was already reset in the last 30 days (the remediation
    history); a reseat, another remedy, keeps the first try's chance."""
    rma_shipping_cost: float = Field(default=150.0, ge=0, le=1_000_000)
    """Shipping and handling of one GPU to the vendor and back."""
    no_fault_found_cost: float = Field(default=300.0, ge=0, le=1_000_000)
    """What the vendor charges for a returned GPU in which it finds no fault."""
    rma_turnaround_days_when_unknown: float = Field(default=21.0, ge=0, le=365)
    """Days a GPU is away under RMA where the inventory does not say (listed as missing)."""
    repair_cost_fraction: float = Field(default=0.35, ge=0, le=10)
    """An out-of-warranty repair's price, as a fraction of the GPU's purchase price."""
    repair_turnaround_days: float = Field(default=30.0, ge=0, le=365)
    """Days a GPU is away for an out-of-warranty repair."""
    replacement_price: float = Field(default=30_000.0, ge=0, le=10_000_000)
    """What a GPU costs where the inventory has no purchase price (listed as missing)."""
    useful_life_years: float = Field(default=5.0, gt=0, le=50)
    """Years a GPU serves from its purchase: retiring it earlier loses the work it would have done in the
    years left."""
    spare_swap_h: float = Field(default=4.0, ge=0, le=1000)
    """Hours a GPU's slot stands empty when a spare is on hand to take its place."""
    repurposed_utilisation: float = Field(default=0.5, ge=0, le=1)
    """The utilisation a GPU moved from training to inference can expect."""
    horizon_days: float = Field(default=30.0, gt=0, le=365)
    """The horizon every option's expected cost is summed over (the predictor's is 30 days)."""


class LifecycleSection(Section):
    """GPUHEALTH_LIFECYCLE__*: when decisions are made and where the inventory is."""

    inventory_file: Path | None = None
    """The operator's inventory CSV (docs/services/lifecycle.md); unset: every decision lists the inventory as
    missing."""
    interval_s: float = Field(default=3600.0, ge=1, le=7 * 86400)
    """How often every GPU is decided; a changed inventory file is decided on at the next check."""
    check_every_s: float = Field(default=5.0, ge=0.1, le=3600)
    """How often the inventory file is looked at for a change (and a stop for)."""
    once: bool = False
    """Decide once and exit (a cron job, or an operator asking now)."""
    window_h: float = Field(default=24.0 * 7, ge=1, le=24 * 90)
    """The hours of utilisation, power and failure predictions a decision reads."""
    processes_window_h: float = Field(default=1.0, gt=0, le=24 * 7)
    """The hours of process listings that say a GPU's work and its job's size."""
    predictor_weights_file: Path = PREDICTOR_WEIGHTS_FILE
    """The failure predictor's weights: its intercept gives the score of a GPU with no precursor (whose
    calibrated p30 a GPU back from a reset, a repair or an RMA is priced at)."""
    predictor_calibration_file: Path = PREDICTOR_CALIBRATION_FILE
    """What maps the predictor's score to an observed p(fail within 30 days) (`make calibrate-predictor`);
    it must have been fitted for the weights above, or the service refuses to start."""
    metrics_port: int = Field(default=9505, ge=0, le=65535)
    """Port of the service's `/metrics`."""
    metrics_bind: str = "127.0.0.1"
    """Address of the service's `/metrics`."""


class LifecycleSettings(Settings):
    lifecycle: LifecycleSection = Field(default_factory=LifecycleSection)
    economics: EconomicsSection = Field(default_factory=EconomicsSection)
