"""``kit tour``: a walk through inference performance in the browser, lesson by lesson, with a live prompt
playground; ``kit tour --check`` runs every lesson headless as the kit's smoke test.

- :mod:`kit.tour.lessons`: the lessons (text, control, what you should see) and the function behind each, every
  number from the kit's own functions (engine, planner, cost, op checks).
- :mod:`kit.tour.generate`: the playground's generation, token by token, in-process or from an OpenAI-compatible
  endpoint, with live TTFT, ITL and tok/s and a summary in :mod:`kit.metrics` terms.
- :mod:`kit.tour.server`: the page's server on 127.0.0.1 (token, local Host and Origin only) and ``kit tour``.
- :mod:`kit.tour.check`: ``kit tour --check``.
"""
