"""Simulated runs on disk for the history tests: a run directory of :func:`kit.track.simulate.simulated_records`,
and a history of simulated commits with a known slowdown."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np

from kit.results import to_frame
from kit.store import save_results
from kit.track.simulate import Noise, simulated_records


def write_simulated_run(out_dir: str | Path, records: list[dict]) -> Path:
    """Write simulated rows as a run directory (``results.parquet`` + ``results.json``); returns ``out_dir``."""
    run_id = records[0]["run_id"]
    meta = {"run_id": run_id, "created_utc": run_id, "host": "simulated", "model": "simulated", "torch_version": "sim"}
    save_results(to_frame(records), Path(out_dir), metadata=meta, runs=[meta])
    return Path(out_dir)


def simulated_history(
    out_root: str | Path,
    commits: int = 12,
    slow_at: int = 7,
    slowdown: float = 0.10,
    affected=((128, 4), (512, 4)),
    noise: Noise = Noise(),
    seed: int = 0,
    **kw,
) -> list[tuple[str, Path]]:
    """``commits`` simulated runs ``out_root/c01 ...``: from commit ``slow_at`` on (1-based), the ``affected``
    points are ``slowdown`` slower. Returns ``[(commit name, run dir), ...]`` (names ``c01``, ``c02``, ...)."""
    rng = np.random.default_rng(seed)
    t0 = _dt.datetime(2025, 1, 1, tzinfo=_dt.UTC)
    out = []
    for i in range(1, commits + 1):
        factors = {p: 1.0 + slowdown for p in affected} if i >= slow_at else {}
        run_id = (t0 + _dt.timedelta(hours=i)).isoformat(timespec="seconds")
        recs = simulated_records(rng, factors=factors, noise=noise, run_id=run_id, **kw)
        out.append((f"c{i:02d}", write_simulated_run(Path(out_root) / f"c{i:02d}", recs)))
    return out
