#!/usr/bin/env bash
# The main job: set up, then sweep KV-cache length x concurrency on this machine's CPU with the built-in
# tiny Llama model; writes results (Parquet + JSON) and PNG plots under results/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
exec .venv/bin/kit sweep --out "${1:-results/quickstart}"
