#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the kit and its test extras.
# On this machine and in CI the CPU build of torch is pinned (it lies on local disk); on a CUDA or ROCm node,
# install your own torch wheel first (see README) and set KIT_KEEP_TORCH=1 so this script leaves it alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.kit-setup-stamp
# the settings below count too: changing KIT_KEEP_TORCH or KIT_TORCH_VERSION re-runs the install
want=$( { cat pyproject.toml .ci/setup.sh; echo "${KIT_KEEP_TORCH:-0} ${KIT_TORCH_VERSION:-}"; } | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_q() {  # quiet pip that still fails loudly: its log is shown when it fails
  if ! "$VPY" -m pip install -q "$@" >.venv/pip.log 2>&1; then
    grep -v "^WARNING: Location" .venv/pip.log >&2
    echo "set-up: pip install $* failed" >&2
    exit 1
  fi
}
if [ "${KIT_KEEP_TORCH:-0}" != "1" ]; then
  pip_q "torch==${KIT_TORCH_VERSION:-2.13.0}"
fi
# the distribution was called "kit" before it became llm-perf-kit: an old entry would own the `kit` command
"$VPY" -m pip uninstall -y -q kit >/dev/null 2>&1 || true
pip_q -e ".[test]"
"$VPY" -c "import kit, torch, transformers; print(f'kit set-up ok: torch {torch.__version__}, transformers {transformers.__version__}')"
echo "$want" > "$stamp"
