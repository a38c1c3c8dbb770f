"""Sphinx configuration for the kit's docs (Sphinx + MyST-NB; builds offline).

Build with ``python docs/build.py`` (see README "Docs"): it assembles the source tree (these files, the notebooks
and a generated API page) under ``docs/_build/src`` and runs ``sphinx-build -nW``. Notebooks are rendered with
MyST-NB's execution switched off: they arrive already executed by papermill (the doc tests' run, or the build
script's own run), so no notebook is executed twice.
"""

import os
import sys
from pathlib import Path

# the kit itself, for autodoc (the staging tree lives under docs/_build/src; the repo root is found from here)
ROOT = Path(os.environ.get("KIT_REPO_ROOT", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(ROOT))

project = "kit"
author = "the kit's authors"
copyright = "the kit's authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_templates", "**/.ipynb_checkpoints", "build.py"]
root_doc = "index"

# notebooks come executed by papermill; never execute here
nb_execution_mode = "off"
nb_merge_streams = True
# widget views (ipywidgets) have no saved state in a papermill run: MyST-NB shows their text/plain fallback
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
myst_heading_anchors = 3
# $...$ and $$...$$ are math, as in Jupyter (the notebooks write formulas that way); pandoc's rule keeps prices
# plain text: an opening $ is not followed by a space, a closing $ neither follows a space nor precedes a digit
# ("$6.00 / $2.50" stays text). MathJax renders the math when the page is read online (Sphinx's default CDN copy);
# offline the TeX source shows.
myst_enable_extensions = ["dollarmath"]
myst_dmath_allow_space = False
myst_dmath_allow_digits = False

# autodoc: document what each module exports, in source order; Google-style sections via napoleon
autodoc_default_options = {"members": True, "member-order": "bysource", "undoc-members": False}
autodoc_typehints = "description"
autodoc_mock_imports = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" sections as fields, not duplicate attribute entries

# -n (nitpicky): types from third-party packages are not cross-referenced offline (no intersphinx)
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(pd|pandas|np|numpy|torch|transformers|matplotlib|plt|ipywidgets|httpx|aiohttp|subprocess|tornado|secrets|t|"
        r"pathlib|typing|collections|datetime|_?asyncio|concurrent|threading|os|io|nbformat|papermill|"
        r"argparse|resource|platform|socket|json|re|math|dataclasses|enum|contextlib|filelock|scipy|ssl|uvloop)(\..*)?",
    ),
    (
        r"py:.*",
        r"(Path|Callable|Iterable|Sequence|Mapping|Any|Literal|Figure|Axes|DataFrame|Series|Popen|"
        r"PathLike|Module|dtype|device|Tensor|optional|callable|Future)",
    ),
    (r"py:.*", r".*\._[A-Za-z].*"),  # private helpers named in signatures
    (r"py:.*", r".*\s.*"),  # napoleon reads "text: more text" in an attribute comment as a type; not a reference
    (r"py:(attr|data|meth|func|obj)", r"[A-Za-z_][A-Za-z0-9_]*"),  # unqualified short names in prose
]

# pydata-sphinx-theme (https://pydata-sphinx-theme.readthedocs.io). Every page is a top-level entry of the index
# (one toctree per Diátaxis caption), so the theme's header links (one per top-level page: ~40) and its per-section
# sidebar (empty) do not fit; instead the left sidebar shows the whole site under the index's captions
# (_templates/sidebar-nav-global.html) and the header holds the title, search and the light/dark switch, aligned
# left (aligned with the content, the title is clipped to the sidebar's width and search overlaps it).
html_theme = "pydata_sphinx_theme"
html_title = "kit: LLM inference performance exploration"
templates_path = ["_templates"]
html_static_path = []
html_sidebars = {"**": ["sidebar-collapse", "sidebar-nav-global"]}
html_show_sourcelink = False
html_theme_options = {
    "navbar_center": [],
    "navbar_align": "left",
    # the page's own contents on the right only on the API page (long); the other pages get the width for their
    # code, tables and the architecture's layout tree. The last matching pattern wins: "**" first.
    "secondary_sidebar_items": {"**": [], "api": ["page-toc"]},
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}


# ------------------------------------------------------------------------------------------------ docstring fixes
import re  # noqa: E402

_BARE_UNDERSCORE = re.compile(r"(?<![`\w\\])([A-Za-z][A-Za-z0-9]*)_(?=[\s,.;:)]|$)")


def _plain_text_docstrings(app, what, name, obj, options, lines):
    """Docstrings are written to be read as plain text first. Two plain-text habits are not valid RST:
    a word ending in ``_`` (``x_`` columns) is an RST reference, and a list right after a ``Heading:`` line needs a
    blank line before it. Both are adjusted here (outside literal blocks), so the API pages render them as text."""
    out, in_literal = [], False
    for line in lines:
        stripped = line.strip()
        if stripped.endswith("::"):
            in_literal = True
        elif in_literal and stripped and not line.startswith((" ", "\t")):
            in_literal = False
        if not in_literal and "``" not in line:
            line = _BARE_UNDERSCORE.sub(r"\1\\_", line)
        if (
            stripped.startswith(("- ", "* "))
            and out
            and out[-1].strip()
            and out[-1].rstrip().endswith(":")
            and not out[-1].strip().startswith(("- ", "* "))
        ):
            out.append("")
        out.append(line)
    lines[:] = out


def _before_napoleon(app, what, name, obj, options, lines):
    """Runs before napoleon: join a line whose ````literal```` continues on the next line (napoleon re-indents
    section bodies and would split it), and keep napoleon from reading "catalog (peak) figures: ..." in a
    constant's comment as "type: description"."""
    i = 0
    while i < len(lines) - 1:
        if lines[i].count("``") % 2 == 1:
            lines[i] = lines[i].rstrip() + " " + lines.pop(i + 1).strip()
            continue
        i += 1
    if what in ("data", "attribute") and lines and ":" in lines[0]:
        lines[0] = ": " + lines[0]  # napoleon reads "text: more" as "type: description"; an empty type instead


def _unique_short_name(app, env, node, contnode):
    """Resolve an unqualified Python reference that names exactly one documented object anywhere in the kit (a type
    hint ``Case`` in :mod:`kit.check.harness` is :class:`kit.check.cases.Case`). A short name documented in two
    places, or nowhere, stays unresolved, and ``-n`` reports it."""
    if node.get("refdomain") != "py" or "." in node.get("reftarget", ""):
        return None
    from sphinx.util.nodes import make_refnode

    objects = env.get_domain("py").objects
    index = getattr(env, "_kit_short_names", None)
    if index is None or index[0] != len(objects):  # built once per set of documented objects, not per reference
        by_short: dict[str, list[str]] = {}
        for full in objects:
            by_short.setdefault(full.rsplit(".", 1)[-1], []).append(full)
        index = env._kit_short_names = (len(objects), by_short)
    hits = index[1].get(node["reftarget"], [])
    if len(hits) != 1:
        return None
    name = hits[0]
    obj = objects[name]
    return make_refnode(app.builder, node["refdoc"], obj.docname, obj.node_id, contnode, name)


def setup(app):
    app.connect("autodoc-process-docstring", _before_napoleon, priority=100)
    app.connect("autodoc-process-docstring", _plain_text_docstrings, priority=900)
    app.connect("missing-reference", _unique_short_name)
