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
if [ "$#" -gt 0 ]; then  # a chosen selection: one session (it starts the vLLM servers itself if it selects them)
  exec .venv/bin/python -m pytest -q -n "${KIT_TEST_WORKERS:-logical}" --maxprocesses 8 "$@"
fi
# The real-engine tier (tests/engine: vLLM on this CPU, set up by .ci/setup-engines.sh): its servers start now, in
# the background, and come up while the rest of the suite runs; the tier runs after it, alone, so its client is
# not starved by the suite's workers on a small machine. The servers are stopped however this script ends.
bash .ci/setup-engines.sh
state=$(mktemp -d)/engines.json
.venv/bin/python tests/engine_server.py "$state" >"${state%.json}.log" 2>&1 &
engines=$!
trap 'kill -TERM $engines 2>/dev/null; wait $engines 2>/dev/null' EXIT
for _ in $(seq 120); do [ -f "$state" ] && break; sleep 0.5; done
[ -f "$state" ] || { echo "the vLLM servers did not start (log ${state%.json}.log):"; tail -20 "${state%.json}.log"; exit 1; }
KIT_TEST_ENGINES="$(cat "$state")"
export KIT_TEST_ENGINES
rc=0
# the parallel session names the 'alone' tests it left out (tests/conftest.py, pytest_deselected): they run next by
# node id, without collecting the suite again
KIT_ALONE_LIST=$(mktemp)
export KIT_ALONE_LIST
.venv/bin/python -m pytest -q -n "${KIT_TEST_WORKERS:-logical}" --maxprocesses 8 --ignore=tests/engine -m "not alone" \
  || rc=$?
echo "tests that judge this machine's scheduling, alone:"
if [ -s "$KIT_ALONE_LIST" ]; then
  mapfile -t alone <"$KIT_ALONE_LIST"
  .venv/bin/python -m pytest -q -n 0 -m alone "${alone[@]}" || rc=$?
else
  .venv/bin/python -m pytest -q -n 0 -m alone --ignore=tests/engine || rc=$?
fi
echo "real-engine tier (vLLM on this CPU):"
.venv/bin/python -m pytest -q -n 0 -rs tests/engine || rc=$?
exit $rc
