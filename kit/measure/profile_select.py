"""Which points ``--profile`` names: the selection syntax of ``kit sweep`` / ``kit kv-stress`` / ``kit dashboard``
(``all``, or ``kv=32768,B=8;kv=4096``), its parser and checks, and the ``--profile`` option. What a profile of a
chosen point holds is :mod:`kit.measure.profile`'s concern.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.errors import UserError

#: the help of the ``profile`` field of the configs that take ``--profile`` (SweepConfig, StressConfig)
PROFILE_HELP = "profile these points in a pass of their own: 'all' or 'kv=32768,B=8;kv=4096'"
#: keys of a point selection and the point field each names
SELECT_KEYS = {"kv": "context_len", "context": "context_len", "b": "concurrency", "batch": "concurrency",
               "concurrency": "concurrency", "dtype": "dtype"}  # fmt: skip


@dataclass(frozen=True)
class ProfileSelection:
    """Which points to profile: every point, or those matching one of ``matches`` (dicts of point field -> value:
    ``context_len``, ``concurrency``, ``dtype``; a field a match leaves out matches any value)."""

    everything: bool = False
    matches: tuple = ()

    def selects(self, context_len: int, concurrency: int, dtype: str | None = None) -> bool:
        """Whether the point (KV length, batch, dtype) is profiled."""
        if self.everything:
            return True
        have = {"context_len": context_len, "concurrency": concurrency, "dtype": dtype}
        return any(all(have[k] == v for k, v in m.items()) for m in self.matches)

    def text(self) -> str:
        """The selection as ``--profile`` takes it."""
        if self.everything:
            return "all"
        short = {"context_len": "kv", "concurrency": "B", "dtype": "dtype"}
        return ";".join(",".join(f"{short[k]}={v}" for k, v in m.items()) for m in self.matches)


def parse_profile_points(text: str | None) -> ProfileSelection | None:
    """The points ``--profile`` names: ``"all"`` (or ``""``: the bare flag), or ``;``-separated matches of
    ``key=value`` pairs, ``kv=32768,B=8;kv=4096`` (keys: ``kv``/``context``, ``B``/``batch``/``concurrency``,
    ``dtype``; case-insensitive). None for None (no profiling).

    Raises:
        UserError: an unknown key, a value that is not an integer >= 1 (kv, B), an empty match.
    """
    if text is None:
        return None
    text = str(text).strip()
    if text in ("", "all"):
        return ProfileSelection(everything=True)
    matches = []
    for part in text.split(";"):
        m = {}
        for pair in filter(None, (x.strip() for x in part.split(","))):
            key, eq, value = pair.partition("=")
            field = SELECT_KEYS.get(key.strip().lower())
            if not eq or field is None:
                raise UserError(
                    f"profile point {pair!r} in {text!r}: write key=value with keys kv, B, dtype "
                    "(e.g. 'kv=32768,B=8;kv=4096'), or 'all'"
                )
            value = value.strip()
            if field != "dtype":
                if not value.isdigit() or int(value) < 1:
                    raise UserError(f"profile point {pair!r} in {text!r}: {key.strip()} must be an integer >= 1")
                m[field] = int(value)
            else:
                from kit.dtypes import name_of

                m[field] = name_of(value)
        if not m:
            raise UserError(f"profile points {text!r} have an empty match; e.g. 'kv=32768,B=8;kv=4096', or 'all'")
        matches.append(m)
    return ProfileSelection(matches=tuple(matches))


def require_selected(text: str | None, points, what: str = "--profile") -> None:
    """Check that the ``--profile`` text ``text`` selects at least one of ``points`` before any run.

    Args:
        points: ``(context_len, concurrency, dtype)`` of every grid point (dtype a name or None).

    Raises:
        UserError: a selection that matches no point (the message names the grid's KV lengths, batches, dtypes).
    """
    selection = parse_profile_points(text)
    points = list(points)
    if selection is None or any(selection.selects(*pt) for pt in points):
        return
    kvs = sorted({p[0] for p in points})
    bs = sorted({p[1] for p in points})
    dts = sorted({p[2] for p in points if p[2]})
    grid = f"kv {','.join(map(str, kvs))}; B {','.join(map(str, bs))}" + (f"; dtype {','.join(dts)}" if dts else "")
    raise UserError(f"{what} {selection.text()!r} matches no point of the grid ({grid}): name one of those, or 'all'")


def add_profile_arg(p) -> None:
    """``--profile [POINTS]``: the bare flag profiles every point (:func:`parse_profile_points`)."""
    p.add_argument(
        "--profile",
        nargs="?",
        const="all",
        default=None,
        metavar="POINTS",
        help="torch.profiler around the decode steps of these points ('all' when bare, or 'kv=32768,B=8;kv=4096'), "
        "in a separate pass after the plain one, so the row's timings stay unprofiled; per point a Chrome/Perfetto "
        "trace, ops.csv (top operators) and profile.json in OUT/profiles/<point_id>/, x_prof_* columns in the row",
    )


def point_selected(profile: str | None, context_len: int, concurrency: int, dtype=None) -> bool:
    """Whether the ``--profile`` text ``profile`` (:func:`parse_profile_points`) selects the point (``dtype``: any
    spelling :func:`kit.dtypes.name_of` knows, or None)."""
    from kit.dtypes import name_of

    selection = parse_profile_points(profile)
    return selection is not None and selection.selects(context_len, concurrency, name_of(dtype) if dtype else None)
