"""Failure prediction: a transparent hazard model whose every term is reported as a reason.

p(fail within d days) = 1 - exp(-d * (base + sum_i w_i * x_i)), with the weights
in config/health-rules.toml. The factors are the early signs the field knows:
SBE rate and its trend, retired pages, uncorrectable remapped rows, DBEs, XIDs
of unhealthy severity, time spent near the slowdown temperature, PCIe replays
and NVLink errors. Each is computed in SQL over the rollup and events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .features import Conn
from .rules_config import Rules

_QUERY = """
WITH r AS (
    SELECT r.gpu_uuid, r.bucket, r.gpu_temp_c_max,
           greatest(r.ecc_sbe_volatile_total_max - lag(r.ecc_sbe_volatile_total_max) OVER w, 0) AS d_sbe,
           greatest(r.pcie_replay_total_max - lag(r.pcie_replay_total_max) OVER w, 0) AS d_pcie,
           greatest(coalesce(r.nvlink_crc_flit_errors_total_max, 0) + coalesce(r.nvlink_replay_errors_total_max, 0)
             - lag(coalesce(r.nvlink_crc_flit_errors_total_max, 0) + coalesce(r.nvlink_replay_errors_total_max, 0)) OVER w, 0) AS d_nvl,
           coalesce(r.retired_pages_sbe_max, 0) + coalesce(r.retired_pages_dbe_max, 0) AS retired,
           r.remapped_rows_uncorrectable_max AS remapped_unc
    FROM gpu_metrics_1min r
    WHERE r.bucket > %(t)s - interval '24 hours' AND r.bucket <= %(t)s
      AND r.bucket < (SELECT gpu_metrics_1min_settled())
    WINDOW w AS (PARTITION BY r.gpu_uuid ORDER BY r.bucket)
)
SELECT r.gpu_uuid,
       coalesce(sum(d_sbe), 0), coalesce(sum(d_sbe) FILTER (WHERE bucket > %(t)s - interval '6 hours'), 0),
       count(*), count(*) FILTER (WHERE bucket > %(t)s - interval '6 hours'),
       coalesce(sum(d_pcie), 0), coalesce(sum(d_nvl), 0),
       coalesce(max(retired), 0), coalesce(max(remapped_unc), 0),
       count(*) FILTER (WHERE gpu_temp_c_max >= coalesce(a.slowdown_temp_c, %(slowdown)s) - %(margin)s)
FROM r JOIN gpu_assets a USING (gpu_uuid)
GROUP BY r.gpu_uuid
"""

_EVENTS = """
SELECT gpu_uuid,
       count(*) FILTER (WHERE kind = 'ecc_dbe'),
       count(*) FILTER (WHERE kind = 'xid' AND time > %(t)s - interval '7 days'
                        AND (details->>'xid')::int = ANY (%(critical)s))
FROM gpu_events WHERE time > %(t)s - interval '30 days' AND time <= %(t)s
GROUP BY gpu_uuid
"""


@dataclass(slots=True)
class Prediction:
    gpu_uuid: str
    p_fail_7d: float
    p_fail_30d: float
    reasons: list[dict[str, Any]] = field(default_factory=list)


def predict_all(conn: Conn, as_of: datetime, rules: Rules) -> dict[str, Prediction]:
    pr = rules.prediction
    critical = [code for code, x in rules.xid.items() if x.severity == "unhealthy"]
    params = {"t": as_of, "slowdown": rules.thermal.default_slowdown_c,
              "margin": rules.thermal.warn_margin_c, "critical": critical}  # fmt: skip
    events = {str(u): (int(d), int(x)) for u, d, x in conn.execute(_EVENTS, params)}
    out: dict[str, Prediction] = {}
    for row in conn.execute(_QUERY, params):
        uuid, sbe24, sbe6, mins24, mins6, pcie, nvl, retired, remapped, hot_minutes = row
        sbe_rate = float(sbe24) * 60 / max(int(mins24), 60)
        older = max(int(mins24) - int(mins6), 60)
        earlier_rate = (float(sbe24) - float(sbe6)) * 60 / older
        recent_rate = float(sbe6) * 60 / max(int(mins6), 60)
        trend = (recent_rate / earlier_rate - 1) if earlier_rate > 0 else (1.0 if recent_rate >= 10 else 0.0)
        dbe, xids = events.get(str(uuid), (0, 0))
        terms = {
            "sbe_per_hour": (pr.sbe_per_hour, sbe_rate),
            "sbe_trend": (pr.sbe_trend, max(trend, 0.0)),
            "retired_pages": (pr.retired_pages, float(retired)),
            "remapped_rows_uncorrectable": (pr.remapped_rows_uncorrectable, float(remapped)),
            "dbe_30d": (pr.dbe_30d, float(dbe)),
            "critical_xids_7d": (pr.critical_xids_7d, float(xids)),
            "thermal_minutes_24h": (pr.thermal_minutes_24h, float(hot_minutes)),
            "pcie_replays_per_hour": (pr.pcie_replays_per_hour, float(pcie) * 60 / max(int(mins24), 60)),
            "nvlink_errors_per_hour": (pr.nvlink_errors_per_hour, float(nvl) * 60 / max(int(mins24), 60)),
        }
        out[str(uuid)] = hazard(str(uuid), pr.base_per_day, terms)
    return out


def hazard(uuid: str, base: float, terms: dict[str, tuple[float, float]]) -> Prediction:
    """Combine weighted factors; reasons are the factors that add risk, largest first."""
    contributions = {name: w * x for name, (w, x) in terms.items()}
    per_day = base + sum(contributions.values())
    reasons = [
        {"factor": name, "value": round(terms[name][1], 3), "hazard_per_day": round(c, 6)}
        for name, c in sorted(contributions.items(), key=lambda kv: -kv[1])
        if c > 0
    ]
    return Prediction(
        gpu_uuid=uuid,
        p_fail_7d=round(1 - math.exp(-7 * per_day), 4),
        p_fail_30d=round(1 - math.exp(-30 * per_day), 4),
        reasons=reasons,
    )
