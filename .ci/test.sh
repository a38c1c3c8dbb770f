#!/usr/bin/env bash
# The test command: set up, then run the whole suite (unit tests, notebooks under papermill, servers, CLI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
# Headless browser for the dashboard's end-to-end test: Debian's chromium (Playwright drives it through
# executable_path; `playwright install` is never run). Idempotent: only when /usr/bin/chromium is missing.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
      >/tmp/kit-apt-chromium.log 2>&1 || echo "set-up: apt-get install chromium failed (see /tmp/kit-apt-chromium.log)"
  else
    echo "set-up: /usr/bin/chromium is missing; the dashboard browser test is skipped (sudo apt-get install chromium)"
  fi
fi
# lint and format check first (seconds): a style slip fails fast, before minutes of tests
.venv/bin/ruff check -q . || { echo "ruff check failed (fix: .venv/bin/ruff check --fix .)"; exit 1; }
.venv/bin/ruff format --check -q . || { echo "ruff format --check failed (fix: .venv/bin/ruff format .)"; exit 1; }
# pytest-xdist: one worker per logical CPU, at most 8 (tests/conftest.py makes each test file one work unit and
# the notebook tests one); KIT_TEST_WORKERS=N to choose, 0 for a single process. Arguments after it win (-n 0).
exec .venv/bin/python -m pytest -q -n "${KIT_TEST_WORKERS:-logical}" --maxprocesses 8 "$@"
