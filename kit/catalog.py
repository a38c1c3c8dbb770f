"""Accelerator catalog and $/GPU-hour price tables, loaded from data files shipped in ``kit/data/``.

Numbers and their sources live in ``kit/data/accelerators.csv`` (one row per accelerator, a ``source`` column and a
``flags`` column for uncertain figures) and ``kit/data/prices.csv`` (one row per accelerator and price *basis*).
TFLOPS are dense (vendor "sparse" figures halved); ``scaleup_gb_s`` is per GPU, one direction.

Price bases shipped:
- ``tco``: owning cost, hyperscaler, from SemiAnalysis' Aug-2025 TCO model as tabulated by InferenceX.
- ``assumed-rental``: the rental prices assumed in Wafer's Kimi-K3 post (2026-08-02).
- ``on-demand``: on-demand neocloud index prices (2026).

A user can add accelerators or override prices with their own CSV (same columns; rows with an existing ``name``
replace it), or give one price per call (:func:`kit.plan.cost.add_cost_columns`' ``usd_per_gpu_hr``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kit import dtypes
from kit._io import data_path
from kit.errors import InputNotFoundError, UnknownNameError, UserError

ACCEL_REQUIRED = {
    "name": str,
    "vendor": str,
    "hbm_gb": float,
    "hbm_tb_s": float,
    "fp32_tflops": float,
    "bf16_tflops": float,
    "fp16_tflops": float,
    "gpus_per_node": int,
    "fp8_format": str,
}
ACCEL_OPTIONAL_NUM = (
    "hbm_gb_nominal",
    "fp8_tflops",
    "fp4_tflops",
    "tdp_w",
    "scaleup_gb_s",
    "scaleup_domain_gpus",
    "scaleup_alpha_us",
    "scaleup_busbw_gb_s",
    "scaleout_alpha_us",
    "scaleout_busbw_gb_s",
)
FP8_FORMATS = ("e4m3fn", "e4m3fnuz")
#: peak-TFLOPS figure (:func:`kit.dtypes.peak_key`) → its column in accelerators.csv
PEAK_COLUMNS = {
    "float32": "fp32_tflops",
    "bfloat16": "bf16_tflops",
    "float16": "fp16_tflops",
    "fp8": "fp8_tflops",
    "fp4": "fp4_tflops",
}
PRICE_REQUIRED = ("accelerator", "usd_per_gpu_hr", "basis")
DEFAULT_BASIS = "tco"


class CatalogError(UserError):
    """A catalog or price file failed validation (the message names the file, row and column)."""


def _validate_accels(df: pd.DataFrame, origin: str) -> pd.DataFrame:
    missing = [c for c in ACCEL_REQUIRED if c not in df.columns]
    if missing:
        raise CatalogError(f"{origin}: missing column(s) {missing}; required: {list(ACCEL_REQUIRED)}")
    df = df.copy()
    for i, row in df.iterrows():
        where = f"{origin} row {i + 2} (name={row.get('name')!r})"
        if not isinstance(row["name"], str) or not row["name"].strip():
            raise CatalogError(f"{where}: empty name; give each accelerator a name (e.g. H200)")
        for col, typ in ACCEL_REQUIRED.items():
            if typ in (float, int):
                try:
                    v = float(row[col])
                except (TypeError, ValueError):
                    raise CatalogError(f"{where}: {col}={row[col]!r} is not a number") from None
                if not (v > 0 and math.isfinite(v)):
                    raise CatalogError(f"{where}: {col}={row[col]!r} must be a finite number > 0")
                if typ is int and v != int(v):
                    raise CatalogError(f"{where}: {col}={row[col]!r} must be a whole number")
        if row["fp8_format"] not in FP8_FORMATS:
            raise CatalogError(f"{where}: fp8_format={row['fp8_format']!r}; allowed: {FP8_FORMATS}")
        for col in ACCEL_OPTIONAL_NUM:
            if col in df.columns and pd.notna(row[col]) and str(row[col]).strip() != "":
                try:
                    v = float(row[col])
                except ValueError:
                    raise CatalogError(f"{where}: {col}={row[col]!r} is not a number") from None
                if not (v >= 0 and math.isfinite(v)):
                    raise CatalogError(f"{where}: {col}={row[col]!r} must be a finite number >= 0")
    dup = df["name"][df["name"].str.strip().str.lower().duplicated()].tolist()
    if dup:
        raise CatalogError(f"{origin}: duplicate accelerator name(s) {dup} (names are case-insensitive)")
    for col in list(ACCEL_REQUIRED) + list(ACCEL_OPTIONAL_NUM):
        if col in df.columns and ACCEL_REQUIRED.get(col, float) is not str:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    df["gpus_per_node"] = df["gpus_per_node"].astype(int)
    return df


def _validate_prices(df: pd.DataFrame, origin: str, known: dict[str, str]) -> pd.DataFrame:
    """Check a price table; ``known`` maps lower-case accelerator names to catalog names (names are matched
    case-insensitively and written in the catalog's spelling)."""
    missing = [c for c in PRICE_REQUIRED if c not in df.columns]
    if missing:
        raise CatalogError(f"{origin}: missing column(s) {missing}; required: {list(PRICE_REQUIRED)}")
    df = df.copy()
    for i, row in df.iterrows():
        where = f"{origin} row {i + 2}"
        if str(row["accelerator"]).strip().lower() not in known:
            raise CatalogError(
                f"{where}: accelerator={row['accelerator']!r} is not in the catalog {sorted(known.values())}"
            )
        df.loc[i, "accelerator"] = known[str(row["accelerator"]).strip().lower()]
        try:
            v = float(row["usd_per_gpu_hr"])
        except (TypeError, ValueError):
            raise CatalogError(f"{where}: usd_per_gpu_hr={row['usd_per_gpu_hr']!r} is not a number") from None
        if not (v > 0 and math.isfinite(v)):
            raise CatalogError(f"{where}: usd_per_gpu_hr={row['usd_per_gpu_hr']!r} must be a finite number > 0")
        if not isinstance(row["basis"], str) or not row["basis"].strip():
            raise CatalogError(f"{where}: basis={row['basis']!r} is empty; give a basis name (e.g. tco, on-demand)")
    df["usd_per_gpu_hr"] = df["usd_per_gpu_hr"].astype(float)
    dup = df[df.duplicated(["accelerator", "basis"], keep=False)]
    if len(dup):
        raise CatalogError(
            f"{origin}: more than one price for (accelerator, basis) {sorted(set(zip(dup.accelerator, dup.basis)))}"
        )
    return df


@dataclass(frozen=True)
class Price:
    """A $/GPU-hour figure with the basis it was quoted on (e.g. "tco", "assumed-rental", "user")."""

    accelerator: str
    usd_per_gpu_hr: float
    basis: str
    source: str = ""


class Catalog:
    """Accelerators (``.accelerators`` DataFrame indexed by name) and prices (``.prices`` DataFrame).

    Use :func:`load_catalog` to build one.
    """

    def __init__(self, accelerators: pd.DataFrame, prices: pd.DataFrame):
        self.accelerators = accelerators.set_index("name", drop=False)
        self.prices = prices.reset_index(drop=True)

    @property
    def names(self) -> list[str]:
        return list(self.accelerators.index)

    @property
    def bases(self) -> list[str]:
        return sorted(self.prices["basis"].unique())

    def bases_for(self, name: str) -> list[str]:
        """Price bases with a price for accelerator ``name`` (canonical name, as in ``prices.accelerator``)."""
        return sorted(set(self.prices.loc[self.prices.accelerator == name, "basis"]))

    def resolve(self, name: str) -> str:
        """Case-insensitive lookup, also accepting the long name ("MI355X", "mi355x", "H200 SXM").

        Raises:
            KeyError: unknown accelerator (the message lists the known ones).
        """
        low = str(name).strip().lower()
        for n, row in self.accelerators.iterrows():
            if low in (n.lower(), str(row.get("full_name", "")).lower()):
                return n
        raise UnknownNameError(f"unknown accelerator {name!r}; known: {self.names}")

    def get(self, name: str) -> pd.Series:
        """The catalog row of one accelerator (see :meth:`resolve` for accepted names)."""
        return self.accelerators.loc[self.resolve(name)]

    def peak_tflops(self, name: str, dtype: str) -> float:
        """Dense peak TFLOPS of ``name`` for ``dtype`` (any :mod:`kit.dtypes` name or alias, or ``"fp4"``).

        Raises:
            KeyError: unknown accelerator. ValueError: unknown dtype or no figure for it.
        """
        key = "fp4" if str(dtype).lower() == "fp4" else dtypes.peak_key(dtype)
        col = PEAK_COLUMNS[key]
        v = self.get(name).get(col)
        if v is None or pd.isna(v):
            row = self.get(name)
            have = [k for k, c in PEAK_COLUMNS.items() if c in row.index and pd.notna(row.get(c))]
            raise UserError(f"no {dtype} TFLOPS figure for {name}; it has figures for {have}")
        return float(v)

    def price(self, name: str, basis: str = DEFAULT_BASIS) -> Price:
        """$/GPU-hour of ``name`` on ``basis``.

        Raises:
            KeyError: unknown accelerator, or no price on that basis (names the bases that exist for it).
        """
        n = self.resolve(name)
        rows = self.prices[(self.prices.accelerator == n) & (self.prices.basis == basis)]
        if rows.empty:
            have = self.bases_for(n)
            raise UnknownNameError(f"no price for {n} on basis {basis!r}; bases with a price for {n}: {have}")
        r = rows.iloc[0]
        return Price(n, float(r.usd_per_gpu_hr), basis, str(r.get("source", "")))

    def table(self) -> pd.DataFrame:
        """The accelerators with their ``tco`` price, for display."""
        cols = [
            "vendor",
            "arch",
            "gfx_arch",
            "hbm_gb",
            "hbm_tb_s",
            "fp32_tflops",
            "bf16_tflops",
            "fp8_tflops",
            "fp4_tflops",
            "tdp_w",
            "scaleup_gb_s",
            "gpus_per_node",
            "fp8_format",
        ]
        t = self.accelerators[[c for c in cols if c in self.accelerators.columns]].copy()
        tco = self.prices[self.prices.basis == DEFAULT_BASIS].set_index("accelerator")["usd_per_gpu_hr"]
        t["usd_per_gpu_hr_tco"] = t.index.map(tco)
        return t


def _read_user_csv(path: str | Path) -> pd.DataFrame:
    """Read a user's CSV: the path must be an existing file; parse failures become :class:`CatalogError` naming it."""
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{path}: no such file")
    if not p.is_file():
        raise CatalogError(f"{path}: is a directory (or not a regular file); give a CSV file")
    try:
        return pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: cannot parse as CSV: {e}") from None
    except PermissionError as e:
        raise CatalogError(f"{path}: cannot read: {e.strerror or e}") from None


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The shipped accelerators and prices, read and validated once per process (the planner asks per point)."""
    acc = _validate_accels(
        pd.read_csv(data_path("accelerators.csv"), dtype={"gfx_arch": str}), "kit/data/accelerators.csv"
    )
    return acc, _validate_prices(pd.read_csv(data_path("prices.csv")), "kit/data/prices.csv", _by_lower(acc))


def _by_lower(acc: pd.DataFrame) -> dict[str, str]:
    return {str(n).strip().lower(): n for n in acc.name}


def load_catalog(extra_accelerators: str | Path | None = None, extra_prices: str | Path | None = None) -> Catalog:
    """Load the shipped catalog, optionally merged with a user's files.

    Args:
        extra_accelerators: CSV with the columns of ``kit/data/accelerators.csv``; a row whose ``name`` exists
            (case-insensitively) replaces the shipped row, others are added.
        extra_prices: CSV with ``accelerator, usd_per_gpu_hr, basis`` (+ optional ``source``); replaces shipped
            prices with the same (accelerator, basis).

    Raises:
        CatalogError: a file fails validation (names the file, row and column), is a directory or cannot be parsed
            as CSV (names the file). FileNotFoundError: a path is missing.
    """
    shipped_acc, shipped_prices = _shipped()
    acc = shipped_acc.copy()
    if extra_accelerators is not None:
        user = _validate_accels(_read_user_csv(extra_accelerators), str(extra_accelerators))
        shipped = _by_lower(acc)
        # a user row replaces the shipped row of the same name, matched case-insensitively ("mi355x" replaces
        # MI355X) and keeping the catalog's spelling so the shipped prices still find it
        user["name"] = [shipped.get(str(n).strip().lower(), str(n).strip()) for n in user.name]
        acc = pd.concat([acc[~acc.name.isin(user.name)], user], ignore_index=True)
    known = _by_lower(acc)
    prices = shipped_prices.copy()
    if extra_prices is not None:
        user_p = _validate_prices(_read_user_csv(extra_prices), str(extra_prices), known)
        key = set(zip(user_p.accelerator, user_p.basis))
        keep = prices[[(a, b) not in key for a, b in zip(prices.accelerator, prices.basis)]]
        prices = pd.concat([keep, user_p], ignore_index=True)
    return Catalog(acc, prices)
