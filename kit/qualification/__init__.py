"""``kit qualify``: is this node and its software stack ready, how fast is it, does it hold up — one command.
(The package is ``kit.qualification`` so that ``kit.qualify`` stays the front door's function.)

The qualification runs the kit's own checks and measurements in order, each under its share of a time budget,
and gives every item a verdict (pass | fail | warn | skip, with the threshold that decided it):

- :mod:`kit.qualification.config`: the settings (:class:`~kit.qualification.config.QualifyConfig`), the thresholds
  with their sources (:class:`~kit.qualification.config.Thresholds`), the budget and the per-device choices
  (:func:`~kit.qualification.config.plan`).
- :mod:`kit.qualification.items_check`, :mod:`~kit.qualification.items_load`, :mod:`~kit.qualification.items_device`:
  one function per item, each calling the kit's existing front door (doctor, op checks, sweep, served benchmark, KV
  stress, collectives, power, calibration, planner), with :mod:`kit.qualification.context` (what an item gets and
  gives back).
- :mod:`kit.qualification.verdicts`: pure functions from an item's measured figures to its verdict.
- :mod:`kit.qualification.run`: the items as a grid (:func:`kit.grid.run_grid`: each item recorded as it finishes, a
  re-run resumes); :mod:`kit.qualification.history`: the history database and the comparison with the previous
  qualification; :mod:`kit.qualification.node`: :func:`~kit.qualification.node.qualify`, all of it for one node.
- :mod:`kit.qualification.report`: the HTML page and ``qualify.json``.
- :mod:`kit.qualification.cluster`: N nodes through submitit (Slurm, or its local executor), the comparison page.
- :mod:`kit.qualification.cli`: ``kit qualify``.
"""
