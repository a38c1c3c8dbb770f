"""Run the kit's notebooks with papermill: declared-parameter checks, an explicit kernel, a per-cell timeout.

papermill only *warns* when a parameter name is not declared in the notebook's ``parameters`` cell and exits 0,
so a typo in a test silently runs the defaults; :func:`run_notebook` raises instead. The kernel is always passed
explicitly (``kernel_name="python3"``): a notebook whose metadata names a kernel that is not installed otherwise
fails with ``NoSuchKernel`` (papermill #638, #251).
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import UserError

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
KERNEL = "python3"


def list_notebooks() -> list[str]:
    """Every notebook under ``notebooks/`` as a posix path relative to it, sorted (checkpoints skipped)."""
    return sorted(
        p.relative_to(NOTEBOOK_DIR).as_posix()
        for p in NOTEBOOK_DIR.rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts
    )


def declared_parameters(path: str | Path) -> dict:
    """Names (and inferred types/defaults/help) declared in the notebook's ``parameters`` cell.

    Raises:
        ValueError: the notebook has no cell tagged ``parameters``.
    """
    import papermill as pm

    params = pm.inspect_notebook(str(path))
    if not params:
        raise UserError(f"{path} has no cell tagged 'parameters'")
    return params


def run_notebook(
    path: str | Path,
    output_path: str | Path,
    parameters: dict | None = None,
    cell_timeout_s: int = 300,
    cwd: str | Path | None = None,
    kernel_name: str = KERNEL,
):
    """Execute ``path`` with papermill, writing the executed copy to ``output_path``.

    Args:
        parameters: values for names declared in the ``parameters`` cell.
        cell_timeout_s: seconds any one cell may run before the run fails.
        cwd: working directory of the kernel (default: the notebook's folder).

    Returns: the executed notebook (nbformat node).

    Raises:
        ValueError: a parameter name not declared in the notebook (lists the declared ones).
            papermill.PapermillExecutionError: a cell raised. papermill's dead-kernel / timeout errors likewise.
    """
    import papermill as pm

    parameters = dict(parameters or {})
    declared = declared_parameters(path)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise UserError(f"parameter(s) {unknown} are not declared in {Path(path).name}; declared: {sorted(declared)}")
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    return pm.execute_notebook(
        str(path),
        str(output_path),
        parameters=parameters,
        kernel_name=kernel_name,
        execution_timeout=cell_timeout_s,
        cwd=str(cwd or Path(path).parent),
        progress_bar=False,
        log_output=False,
    )


def strip_outputs(path: str | Path) -> bool:
    """Remove outputs and execution counts from a notebook in place; True if it changed."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count")):
            cell.outputs, cell.execution_count = [], None
            changed = True
    if changed:
        nbformat.write(nb, str(path))
    return changed


def new_notebook(cells: list[tuple[str, str]], parameters: str | None = None):
    """Build a notebook from ``[(kind, source), ...]`` (kind "md" or "code"); ``parameters`` is the tagged
    cell's source, inserted after the first markdown cell. ``kernelspec.name`` is ``python3``."""
    from nbformat.v4 import new_code_cell, new_markdown_cell
    from nbformat.v4 import new_notebook as _nb

    out = []
    for i, (kind, src) in enumerate(cells):
        out.append(new_markdown_cell(src) if kind == "md" else new_code_cell(src))
        if i == 0 and parameters is not None:
            c = new_code_cell(parameters)
            c.metadata["tags"] = ["parameters"]
            out.append(c)
    nb = _nb(cells=out)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb
