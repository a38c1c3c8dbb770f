"""The history of runs per commit: one DuckDB file (default ``history.duckdb``) holding every row of every run
added — in-process, served and planner — with the run's provenance and its raw samples.

Tables:

- ``runs``: one row per run (a run = one grid call, key ``run_key`` = hash of host + the run's ``run_id``):
  commit, branch, dirty flag and tag of the stack under test, where the rows came from, when it ran, device and
  driver (CUDA / HIP version), package versions (torch, transformers, and vLLM / SGLang / flashinfer / aiter when
  installed) and the price used for its cost columns.
- ``rows``: every results row (``row_json``: the whole row as JSON, nothing dropped) plus the typed columns a
  compare matches and plots on. ``point_key`` is the point's configuration (``x_point_key`` of a repeated sweep,
  else ``point_id``); ``replicate`` is the repeat of the whole grid it came from (``x_run_index``, else 0).
- ``samples``: raw samples per row: ``metric`` (``tpot_ms``, ``ttft_ms``, ``e2el_ms``, ``tok_s``), ``block``
  (the independent unit inside a row: a repeat of an in-process point, a request of a served one) and ``value``.

Adding the same run twice stores it once (rows are keyed by run, point and finish time; ``INSERT OR IGNORE``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import subprocess
from dataclasses import dataclass
from importlib import metadata as _md
from pathlib import Path

import pandas as pd

from kit._io import check_out_file
from kit.errors import InputNotFoundError, OutputPathError, UserError
from kit.results import ok_mask
from kit.store import load_results
from kit.track.rows import created_utc, row_price, row_samples, row_tuple

DEFAULT_DB = "history.duckdb"
#: packages whose versions are recorded when installed (the stack under test)
PACKAGES = ("torch", "transformers", "vllm", "sglang", "flashinfer-python", "flashinfer", "aiter", "kit")
#: the distribution a name of :data:`PACKAGES` is installed as, where the two differ (pyproject.toml's name)
DISTRIBUTIONS = {"kit": "llm-perf-kit"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_key VARCHAR PRIMARY KEY, run_id VARCHAR, commit VARCHAR, branch VARCHAR, dirty BOOLEAN, tag VARCHAR,
  source VARCHAR, host VARCHAR, created_utc VARCHAR, added_utc VARCHAR, device VARCHAR, device_name VARCHAR,
  driver VARCHAR, versions VARCHAR, usd_per_gpu_hr DOUBLE, price_basis VARCHAR);
CREATE TABLE IF NOT EXISTS rows (
  row_key VARCHAR PRIMARY KEY, run_key VARCHAR, point_key VARCHAR, replicate INTEGER, backend VARCHAR,
  status VARCHAR, ok BOOLEAN, label VARCHAR, model VARCHAR, dtype VARCHAR, concurrency BIGINT,
  context_len BIGINT, isl BIGINT, osl BIGINT, n_gpus BIGINT, tok_s DOUBLE, tpot_ms DOUBLE, ttft_ms DOUBLE,
  usd_per_gpu_hr DOUBLE, price_basis VARCHAR, usd_per_mtok DOUBLE, tok_s_per_usd DOUBLE, row_json VARCHAR);
CREATE TABLE IF NOT EXISTS samples (row_key VARCHAR, metric VARCHAR, block INTEGER, value DOUBLE);
"""


@dataclass(frozen=True)
class Provenance:
    """The stack under test: ``commit`` (SHA or any name), ``branch``, ``dirty`` (uncommitted changes), ``tag``."""

    commit: str
    branch: str | None = None
    dirty: bool | None = None
    tag: str | None = None


def _git(path: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_provenance(path: str | Path) -> Provenance:
    """Commit, branch, dirty flag and exact tag (if any) of the git checkout at ``path``.

    Raises:
        InputNotFoundError: ``path`` is not a directory inside a git checkout.
    """
    p = Path(path)
    sha = _git(p, "rev-parse", "HEAD") if p.is_dir() else None
    if not sha:
        raise InputNotFoundError(f"{path} is not a git checkout (git rev-parse HEAD failed); pass --commit SHA")
    branch = _git(p, "rev-parse", "--abbrev-ref", "HEAD")
    status = _git(p, "status", "--porcelain", "--untracked-files=no")
    tag = _git(p, "describe", "--tags", "--exact-match") or None
    return Provenance(sha, None if branch == "HEAD" else branch, bool(status) if status is not None else None, tag)


def package_versions(meta: dict) -> dict:
    """Versions of :data:`PACKAGES`: the run's metadata first (``torch_version``...), else what is installed here."""
    out = {}
    for name in PACKAGES:
        v = meta.get(f"{name.replace('-', '_')}_version")
        if v is None:
            try:
                v = _md.version(DISTRIBUTIONS.get(name, name))
            except _md.PackageNotFoundError:
                continue
        out[name] = str(v)
    return out


def _header(p: Path) -> bytes:
    """The first 12 bytes of the file at ``p`` (DuckDB's magic is bytes 8-12). Raises: UserError: unreadable."""
    try:
        with open(p, "rb") as f:
            return f.read(12)
    except OSError as e:
        raise UserError(f"cannot read history database {p}: {e.strerror or e}") from None


def _damaged(e) -> bool:
    """Whether a DuckDB error means the file itself cannot be read (a damaged checksum, a truncated file, an I/O
    failure) rather than a query the kit got wrong (catalog, binder, parser errors stay bugs, with traceback)."""
    import duckdb

    kinds = (duckdb.IOException, duckdb.SerializationException, duckdb.InternalException, duckdb.InvalidInputException)
    return type(e) is duckdb.Error or isinstance(e, kinds)


def _damaged_error(p: Path, e) -> UserError:
    return UserError(
        f"history database {p} cannot be read ({str(e).splitlines()[0][:200]}): the file is damaged or truncated; "
        "restore it from a copy, or give --db a new path"
    )


def connect(path: str | Path = DEFAULT_DB, read_only: bool = False):
    """Open (creating it and its tables when new) the history database at ``path``; a DuckDB connection (prefer
    :func:`opened`, which also turns a damage found while reading into a one-line error).

    Raises:
        InputNotFoundError: ``read_only`` and no database at ``path``.
        OutputPathError: not ``read_only`` and ``path`` cannot be created (an ancestor is a file, e.g.
            ``/etc/passwd/x``, or the directory is not writable).
        UserError: ``path`` is not a DuckDB file, is damaged or truncated, or is locked by another process.
    """
    import duckdb

    p = Path(path)
    if p.is_dir():
        raise UserError(f"--db {p} is a directory; give a file path (e.g. {p / 'history.duckdb'})")
    if read_only and not p.is_file():
        anc = next((a for a in p.parents if a.exists()), None)
        if anc is not None and not anc.is_dir():
            raise InputNotFoundError(f"no history database at {p}: {anc} is a file, not a directory")
        raise InputNotFoundError(f"no history database at {p} (create one with `kit history add RUN_DIR --db {p}`)")
    if not read_only:
        check_out_file(p, "--db", "history.duckdb")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputPathError(f"--db {p}: cannot create {p.parent}: {e.strerror or e}") from None
    if p.is_file() and p.stat().st_size and _header(p)[8:12] != b"DUCK":  # DuckDB's file header magic
        raise UserError(f"{p} is not a DuckDB history database (give --db a new path or a kit history file)")
    # never fetch or load extensions: a foreign file must not make DuckDB reach the network
    no_ext = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    try:
        con = duckdb.connect(str(p), read_only=read_only, config=no_ext)
    except (duckdb.IOException, duckdb.InvalidInputException) as e:
        raise UserError(f"cannot open history database {p}: {str(e).splitlines()[0]}") from None
    except duckdb.Error as e:
        if not _damaged(e):
            raise
        raise _damaged_error(p, e) from None
    try:
        if not read_only:
            con.execute(_SCHEMA)
        elif not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'").fetchone()[0]:
            raise UserError(f"{p} is a DuckDB file but not a kit history (no runs table); add a run to it first")
    except BaseException as e:
        con.close()
        if isinstance(e, duckdb.Error) and _damaged(e):
            raise _damaged_error(p, e) from None
        raise
    return con


@contextlib.contextmanager
def opened(path: str | Path = DEFAULT_DB, read_only: bool = False):
    """:func:`connect` for the length of a ``with`` block (closed after it); a damaged or truncated file found
    while the block reads or writes is a UserError naming it, never a DuckDB traceback.

    Raises: what :func:`connect` raises; UserError for a damaged file.
    """
    import duckdb

    con = connect(path, read_only)
    try:
        yield con
    except duckdb.Error as e:
        if not _damaged(e):
            raise
        raise _damaged_error(Path(path), e) from None
    finally:
        con.close()


def add_run(
    db: str | Path,
    run_dir: str | Path,
    provenance: Provenance,
    *,
    usd_per_gpu_hr: float | None = None,
    basis: str | None = "tco",
) -> dict:
    """Add every row of the run directory ``run_dir`` (any backend) to the history ``db``.

    Args:
        provenance: the commit (and branch, dirty flag, tag) the rows measure (:func:`git_provenance`).
        usd_per_gpu_hr: price for the $ columns ($/GPU-hour, basis ``user``); default: the row's own price, else
            the catalog's price of the row's accelerator on ``basis`` (none for a CPU: $ columns stay empty).

    Returns:
        ``{"runs": [run_key, ...], "rows_added": n, "rows_known": m, "samples_added": k}``.

    Raises:
        InputNotFoundError: no results in ``run_dir``.
        OutputPathError: ``db`` cannot be created there (:func:`connect`).
        UserError: no commit given, the database is locked or damaged, or a run of ``run_dir`` is stored under
            another commit.
    """
    if not provenance.commit:
        raise UserError("no commit: pass --commit SHA or --git PATH (a checkout of the stack under test)")
    run_dir = Path(run_dir)
    df = _run_frame(run_dir)
    metas = {m.get("run_id") or m.get("created_utc"): m for m in df.attrs.get("runs", [])}
    ok = ok_mask(df)
    records = json.loads(df.to_json(orient="records", date_format="iso"))
    added = known = n_samples = 0
    keys: list[str] = []
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    with opened(db) as con:
        con.execute("BEGIN TRANSACTION")
        for rec, is_ok in zip(records, ok):
            meta = metas.get(rec.get("run_id")) or df.attrs.get("metadata", {})
            run_key = hashlib.sha1(f"{meta.get('host')}|{rec.get('run_id')}".encode()).hexdigest()[:12]
            price = row_price(rec, usd_per_gpu_hr, basis)
            if run_key not in keys:
                keys.append(run_key)
                had = con.execute("SELECT commit FROM runs WHERE run_key = ?", [run_key]).fetchone()
                if had and had[0] != provenance.commit:
                    raise UserError(
                        f"run {rec.get('run_id')} of {run_dir} is already in {db} under commit {had[0]}, not "
                        f"{provenance.commit}: a run measures one commit (nothing was added)"
                    )
                values = _run_values(run_key, rec, meta, provenance, run_dir, price, now)
                con.execute(f"INSERT OR IGNORE INTO runs VALUES ({','.join('?' * len(values))})", values)
            n = _insert_row(con, row_tuple(rec, run_key, is_ok, price, run_dir), rec, run_dir)
            if n is None:
                known += 1
            else:
                added, n_samples = added + 1, n_samples + n
        con.execute("COMMIT")
    return {"runs": keys, "rows_added": added, "rows_known": known, "samples_added": n_samples}


def _run_frame(run_dir: Path) -> pd.DataFrame:
    """The rows of ``run_dir`` (a missing ``status`` means ok).

    Raises:
        InputNotFoundError: no rows, or not a kit results file.
    """
    df = load_results(run_dir)
    if df.empty:
        raise InputNotFoundError(f"{run_dir} holds no rows")
    if not {"point_id", "status", "backend"} & set(df.columns):
        raise InputNotFoundError(f"{run_dir} is not a kit results file (no point_id, status or backend column)")
    return df if "status" in df.columns else df.assign(status="ok")


def _run_values(
    run_key: str, rec: dict, meta: dict, provenance: Provenance, run_dir: Path, price: tuple, now: str
) -> list:
    """The ``runs`` table's values of one run: identity, provenance, where and when, device, driver, versions,
    price (``(usd_per_gpu_hr, basis)``)."""
    dev = meta.get("device") if isinstance(meta.get("device"), dict) else {}
    driver = " ".join(f"{k} {meta[f'torch_{k.lower()}']}" for k in ("CUDA", "HIP") if meta.get(f"torch_{k.lower()}"))
    return [
        run_key,
        rec.get("run_id"),
        provenance.commit,
        provenance.branch,
        provenance.dirty,
        provenance.tag,
        str(run_dir.resolve()),
        meta.get("host"),
        created_utc(meta, rec),
        now,
        rec.get("device") or dev.get("platform"),
        rec.get("device_name") or dev.get("name"),
        driver or None,
        json.dumps(package_versions(meta)),
        price[0],
        price[1],
    ]


def _insert_row(con, tup: tuple, rec: dict, run_dir: Path) -> int | None:
    """Insert one row (``tup``: :func:`kit.track.rows.row_tuple`) and its raw samples; the number of samples, or
    None when the row was stored already."""
    if con.execute("SELECT 1 FROM rows WHERE row_key = ?", [tup[0]]).fetchone():
        return None
    con.execute(f"INSERT INTO rows VALUES ({','.join('?' * len(tup))})", list(tup))
    smp = row_samples(rec, run_dir)
    if smp:
        con.executemany("INSERT INTO samples VALUES (?,?,?,?)", [(tup[0], *s) for s in smp])
    return len(smp)


def list_runs(db: str | Path) -> pd.DataFrame:
    """One row per run, oldest first: run_key, commit, branch, dirty, tag, created_utc, device_name, rows,
    ok_rows, backends (engine, openai, planner — a planner run is a prediction, not a measurement), replicates,
    versions (JSON), price.

    Raises:
        InputNotFoundError: no database at ``db``.
    """
    with opened(db, read_only=True) as con:
        return con.execute(
            "SELECT r.run_key, r.run_id, r.commit, r.branch, r.dirty, r.tag, r.created_utc, r.device, r.device_name, "
            "r.driver, count(w.row_key) AS rows, CAST(sum(CASE WHEN w.ok THEN 1 ELSE 0 END) AS INTEGER) AS ok_rows, "
            "string_agg(DISTINCT w.backend, ',' ORDER BY w.backend) AS backends, "
            "count(DISTINCT w.replicate) AS replicates, r.usd_per_gpu_hr, r.price_basis, r.versions, r.source "
            "FROM runs r LEFT JOIN rows w USING (run_key) GROUP BY ALL ORDER BY r.created_utc, r.run_key"
        ).df()


def commit_order(runs: pd.DataFrame) -> list[str]:
    """Commits in the order their first run was made (the x axis of the history plots)."""
    return list(runs.sort_values("created_utc", kind="stable").drop_duplicates("commit")["commit"])


def resolve(runs: pd.DataFrame, ref: str) -> list[str]:
    """The run keys a reference names: a run key (or its prefix), a run id, a tag, or a commit (or a prefix of at
    least 4 characters); a commit names every run made of it.

    Raises:
        UnknownNameError: nothing matches, or a prefix matches several commits (the message lists them).
    """
    from kit.errors import UnknownNameError

    ref = str(ref).strip()
    for col in ("run_key", "run_id", "tag", "commit"):
        hit = runs[runs[col].astype(str) == ref]
        if len(hit):
            return list(hit["run_key"])
    if len(ref) >= 4:
        for col in ("run_key", "commit"):
            hit = runs[runs[col].astype(str).str.startswith(ref)]
            if hit[col].nunique() == 1:
                return list(hit["run_key"])
            if hit[col].nunique() > 1:
                raise UnknownNameError(f"{ref!r} matches several {col}s: {sorted(hit[col].unique())}")
    known = ", ".join(commit_order(runs)[-8:])
    raise UnknownNameError(f"{ref!r} is no commit, tag or run id in the history (latest commits: {known})")


def load_rows(db: str | Path, run_keys: list[str] | None = None) -> pd.DataFrame:
    """The typed row table (joined with the run's commit and created_utc), optionally for some runs only."""
    with opened(db, read_only=True) as con:
        q = "SELECT w.*, r.commit, r.created_utc FROM rows w JOIN runs r USING (run_key)"
        if run_keys is None:
            return con.execute(q).df()
        return con.execute(q + " WHERE list_contains(?, w.run_key)", [list(run_keys)]).df()


def load_samples(db: str | Path, row_keys: list[str]) -> pd.DataFrame:
    """Raw samples (row_key, metric, block, value) of some rows."""
    with opened(db, read_only=True) as con:
        return con.execute("SELECT * FROM samples WHERE list_contains(?, row_key)", [list(row_keys)]).df()
