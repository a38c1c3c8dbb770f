#!/usr/bin/env bash
# The test command: set up, then run the whole suite (unit tests, notebooks under papermill, servers, CLI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
exec .venv/bin/python -m pytest -q "$@"
