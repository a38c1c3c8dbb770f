"""Build the docs: assemble the source tree, then ``sphinx-build -nW`` (warnings are errors).

    .venv/bin/python docs/build.py                      # execute every notebook with papermill, then build
    .venv/bin/python docs/build.py --executed DIR       # reuse notebooks already executed (mirror of notebooks/)
    .venv/bin/python docs/build.py --no-execute         # render the committed notebooks without outputs

The source tree is ``OUT/src``: ``docs/conf.py`` with the theme's templates (``docs/_templates``), ``docs/*.md``
(``index.md``, ``metrics.md``, ``architecture.md``), an API page generated from every public module of the ``kit``
package and its subpackages (:func:`api_modules`), and every notebook under ``notebooks/`` (the executed copy when
there is one; its links to ``docs/`` pages mapped by :func:`docs_links_for_site`). HTML goes to ``OUT/html``
(default ``OUT`` = ``docs/_build``). MyST-NB never executes anything (``nb_execution_mode = "off"``): a notebook is
executed once, by papermill, and a notebook whose execution fails fails the build.

Exit code: 0 on success; non-zero when a notebook fails to execute or Sphinx reports a warning or an error.
"""

from __future__ import annotations

import argparse
import pkgutil
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
NOTEBOOKS = ROOT / "notebooks"


def notebooks() -> list[str]:
    """Every notebook under notebooks/, relative (posix), sorted (:func:`kit.view.notebooks.list_notebooks`)."""
    sys.path.insert(0, str(ROOT))
    from kit.view.notebooks import list_notebooks

    return list_notebooks()


def api_modules() -> list[str]:
    """Every public module of the ``kit`` package, subpackages included (``kit.measure.sweep``, ...), sorted; a
    module or package whose name starts with ``_`` (``kit._io``, ``kit.__main__``) is private and left out."""
    sys.path.insert(0, str(ROOT))
    import kit

    return sorted(
        m.name
        for m in pkgutil.walk_packages(kit.__path__, "kit.")
        if not m.ispkg and not any(part.startswith("_") for part in m.name.split("."))
    )


def api_page() -> str:
    """The API reference page: one ``automodule`` per module of :func:`api_modules`, top-level modules first, then
    one section per subpackage (its docstring, then its modules)."""
    mods = api_modules()
    parts = ["# API reference\n", "Generated from the docstrings of the `kit` package, one section per module.\n"]
    groups: dict[str, list[str]] = {}
    for m in mods:
        groups.setdefault(m.rsplit(".", 1)[0], []).append(m)
    for pkg in sorted(groups, key=lambda g: (g != "kit", g)):
        level = "##"
        if pkg != "kit":
            parts.append(f"## `{pkg}`\n\n```{{eval-rst}}\n.. automodule:: {pkg}\n   :no-members:\n```\n")
            level = "###"
        for m in groups[pkg]:
            parts.append(f"{level} `{m}`\n\n```{{eval-rst}}\n.. automodule:: {m}\n```\n")
    return "\n".join(parts)


def execute_all(dest: Path, run_dir: Path) -> list[str]:
    """papermill-execute every notebook with its own defaults (out_dir under ``run_dir``); returns failures."""
    sys.path.insert(0, str(ROOT))
    from kit.view.notebooks import run_notebook

    failed = []
    for rel in notebooks():
        t0 = time.perf_counter()
        try:
            run_notebook(NOTEBOOKS / rel, dest / rel, parameters={"out_dir": str(run_dir / rel[:-6])})
            print(f"executed {rel} in {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:  # reported, and the build fails below
            print(f"FAILED {rel}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
            failed.append(rel)
    return failed


def assemble(src: Path, executed: Path | None) -> list[str]:
    """Write the Sphinx source tree into ``src``; returns the notebooks rendered without outputs."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    shutil.copy2(DOCS / "conf.py", src / "conf.py")
    shutil.copytree(DOCS / "_templates", src / "_templates")
    for md in DOCS.glob("*.md"):
        shutil.copy2(md, src / md.name)
    (src / "api.md").write_text(api_page())
    bare = []
    for rel in notebooks():
        done = executed / rel if executed is not None else None
        target = src / "notebooks" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if done is not None and done.exists():
            source = done
        else:
            source = NOTEBOOKS / rel
            bare.append(rel)
        target.write_text(docs_links_for_site(source.read_text(encoding="utf-8")), encoding="utf-8")
    return bare


def docs_links_for_site(text: str) -> str:
    """A notebook's links to the docs pages as the site needs them. A notebook links a page by its path in the
    repository (``[metrics](../../docs/metrics.md)`` from ``notebooks/reference/``: right on GitHub and in
    Jupyter); in the source tree the pages sit at the root beside ``notebooks/``, so ``<up to the root>docs/X.md``
    becomes ``<up to the root>X.md``."""
    return re.sub(r"\]\(((?:\.\./)+)docs/", r"](\1", text)


def build(
    out: Path = DOCS / "_build", executed: Path | None = None, execute: bool = True, extra_args: list[str] | None = None
) -> int:
    """Assemble and build; returns the exit code (see the module docstring)."""
    out = Path(out)
    t0 = time.perf_counter()
    if executed is None and execute:
        executed = out / "executed"
        if executed.exists():
            shutil.rmtree(executed)
        failed = execute_all(executed, out / "notebook-output")
        if failed:
            print(f"docs: {len(failed)} notebook(s) failed to execute: {failed}", file=sys.stderr)
            return 1
    bare = assemble(out / "src", executed)
    if bare:
        print(f"docs: rendered without outputs (no executed copy): {bare}", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-b",
        "html",
        "-n",
        "-W",
        "--keep-going",
        "-q",
        "-j",
        "1",
        str(out / "src"),
        str(out / "html"),
        *(extra_args or []),
    ]
    rc = subprocess.call(cmd, cwd=str(ROOT), env={**__import__("os").environ, "KIT_REPO_ROOT": str(ROOT)})
    print(
        f"docs: sphinx-build exit {rc} in {time.perf_counter() - t0:.1f} s -> {out / 'html' / 'index.html'}", flush=True
    )
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DOCS / "_build", help="build directory (src/, html/)")
    ap.add_argument(
        "--executed",
        type=Path,
        default=None,
        help="directory mirroring notebooks/ with papermill-executed copies to render",
    )
    ap.add_argument("--no-execute", action="store_true", help="render notebooks without executing them")
    a = ap.parse_args(argv)
    return build(a.out, a.executed, execute=not a.no_execute)


if __name__ == "__main__":
    sys.exit(main())
