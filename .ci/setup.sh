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
stamp=.venv/.kit-setup-stamp
want=$(cat pyproject.toml .ci/setup.sh | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "${KIT_KEEP_TORCH:-0}" != "1" ]; then
  "$VPY" -m pip install -q "torch==${KIT_TORCH_VERSION:-2.13.0}" 2>&1 | grep -v "^WARNING: Location" || true
fi
"$VPY" -m pip install -q -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
"$VPY" -c "import kit, torch, transformers; print(f'kit set-up ok: torch {torch.__version__}, transformers {transformers.__version__}')"
echo "$want" > "$stamp"
