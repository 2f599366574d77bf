"""Old and recent rows in all three retained tables, and reading the Parquet archive back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings

TABLES = ("gpu_metrics", "gpu_events", "gpu_metrics_1min")
TIME_COLUMN = {"gpu_metrics": "time", "gpu_events": "time", "gpu_metrics_1min": "bucket"}
KEYS = {
    "gpu_metrics": ("gpu_uuid", "time"),
    "gpu_events": ("gpu_uuid", "time", "kind"),
    "gpu_metrics_1min": ("gpu_uuid", "bucket"),
}


def fill(db: DatabaseSettings, *, gpus: int = 4, step: str = "5 minutes", days: int = 3) -> None:
    """Rows past retention (30/180/365 days) in many chunks, plus recent rows that must stay.

    Values vary like readings (noise, NULLs, hostile text in labels, JSON details).
    """
    with connect(db) as conn:
        conn.execute(
            "INSERT INTO gpu_metrics (time, gpu_uuid, hostname, cluster, rack, pod, source, collector_id,"
            " mig, gpu_temp_c, power_usage_w, gpu_util_pct, total_energy_mj, ecc_sbe_volatile_total,"
            " xid_last, prof_sm_active_ratio)"
            " SELECT t, format('GPU-%%s-0000-4000-8000-000000000000', lpad(g::text, 8, '0')),"
            "        'node-' || (g / 8), 'c1', E'r\"1,\\n', CASE WHEN g %% 2 = 0 THEN 'pod-' || g END,"
            "        'mock', 'itest',"
            '        CASE WHEN g = 1 THEN \'[{"profile": "1g.10gb", "instance_id": 1}]\'::jsonb END,'
            "        40 + (random() * 30)::int, round((100 + random() * 500)::numeric, 2),"
            "        CASE WHEN random() < 0.1 THEN NULL ELSE (random() * 100)::int END,"
            "        (extract(epoch FROM t)::bigint - 1700000000) * 300, g * 3, NULL, random()"
            " FROM generate_series(now() - make_interval(days => 31 + %s), now() - interval '31 days',"
            "                      %s::interval) AS t, generate_series(1, %s) AS g",
            (days, step, gpus),
        )
        conn.execute(
            "INSERT INTO gpu_metrics (time, gpu_uuid, hostname, source, collector_id, gpu_temp_c)"
            " SELECT now() - make_interval(mins => m), 'GPU-recent-0000-4000', 'n', 'mock', 'c', 50"
            " FROM generate_series(1, 30) AS m"
        )
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " SELECT t, 'GPU-ev-' || g, CASE WHEN g %% 2 = 0 THEN 'xid' ELSE 'ecc_dbe' END, 'node-0', 'mock',"
            "        'itest', jsonb_build_object('code', g, 'note', E'quote \" and \\\\ and ü')"
            " FROM generate_series(now() - interval '200 days', now() - interval '181 days',"
            "                      interval '7 hours')"
            "      AS t, generate_series(1, %s) AS g",
            (gpus,),
        )
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id)"
            " VALUES (now() - interval '1 day', 'GPU-ev-recent', 'xid', 'n', 'mock', 'c')"
        )
        conn.execute(
            "INSERT INTO gpu_metrics_1min (bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n,"
            " gpu_temp_c_max, clocks_event_reasons_any)"
            " SELECT date_trunc('minute', t), 'GPU-roll-' || g, 6, 300.5, 6, 55, 4"
            " FROM generate_series(now() - interval '380 days', now() - interval '366 days',"
            "                      interval '3 hours')"
            "      AS t, generate_series(1, %s) AS g",
            (gpus,),
        )
        conn.execute(
            "INSERT INTO gpu_metrics_1min (bucket, gpu_uuid, samples)"
            " VALUES (date_trunc('minute', now()), 'GPU-roll-recent', 1)"
        )
        conn.commit()


def snapshot(db: DatabaseSettings, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every row of `table`, keyed by its unique key, values as text (how jsonb is archived)."""
    with connect(db) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [c.name for c in cur.description or ()]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    for row in rows:
        for name, value in row.items():
            if isinstance(value, dict | list):
                row[name] = json.loads(json.dumps(value))
    return {tuple(row[k] for k in KEYS[table]): row for row in rows}


def archived_rows(root: Path, table: str) -> list[dict[str, Any]]:
    """Every row the archive holds for `table` (jsonb columns parsed back from their text)."""
    files = sorted((root / f"table={table}").rglob("*.parquet"))
    if not files:
        return []
    rows: list[dict[str, Any]] = ds.dataset(files, format="parquet").to_table().to_pylist()
    for row in rows:
        for name in ("mig", "details"):
            if isinstance(row.get(name), str):
                row[name] = json.loads(row[name])
    return rows


def check_manifests(root: Path) -> int:
    """Every Parquet file has a manifest that matches it (rows, bytes, checksum); returns files seen."""
    import pyarrow.parquet as pq

    files = sorted(root.rglob("*.parquet"))
    for path in files:
        manifest = json.loads(
            path.with_name(path.name.removesuffix(".parquet") + ".manifest.json").read_text()
        )
        assert manifest["file"] == path.name
        assert manifest["rows"] == pq.ParquetFile(path).metadata.num_rows
        assert manifest["bytes"] == path.stat().st_size
        assert manifest["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert manifest["min_time"] <= manifest["max_time"]
        assert path.parent.name == f"day={manifest['min_time'][:10]}" == f"day={manifest['max_time'][:10]}"
    assert not list(root.rglob("*.tmp")), "temporary files left behind"
    return len(files)
