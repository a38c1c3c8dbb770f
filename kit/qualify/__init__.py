"""``kit qualify``: is this node and its software stack ready, how fast is it, does it hold up — one command.

The qualification runs the kit's own checks and measurements in order, each under its share of a time budget,
and gives every item a verdict (pass | fail | warn | skip, with the threshold that decided it):

- :mod:`kit.qualify.config`: the settings (:class:`~kit.qualify.config.QualifyConfig`), the thresholds with their
  sources (:class:`~kit.qualify.config.Thresholds`), the budget and the per-device choices (:func:`plan`).
- :mod:`kit.qualify.items`: one function per item, each calling the kit's existing front door (doctor, op checks,
  sweep, served benchmark, KV stress, collectives, power, calibration, planner).
- :mod:`kit.qualify.verdicts`: pure functions from an item's measured figures to its verdict.
- :mod:`kit.qualify.run`: the items as a grid (:func:`kit.grid.run_grid`: each item recorded as it finishes, a
  re-run resumes), the history database, the comparison with the previous qualification.
- :mod:`kit.qualify.report`: the HTML page and ``qualify.json``.
- :mod:`kit.qualify.cluster`: N nodes through submitit (Slurm, or its local executor), the comparison page.
- :mod:`kit.qualify.cli`: ``kit qualify``.
"""
