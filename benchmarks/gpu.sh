#!/usr/bin/env bash
# The writers' tables on a GPU machine, within about 8 minutes: `bash benchmarks/gpu.sh [OUTDIR [jax_small]]`.
#
# Runs from the repository root with the Python that has torch (CUDA), jax (CUDA), flax, optax,
# transformers and lightning (PYTHON, default python). Each part has its own time limit, so one
# that runs long (a torch.compile, an XLA compilation) leaves the others their time; every part
# writes its table (OUTDIR/NAME.txt) and its rows (OUTDIR/NAME.json) as soon as it ends, and
# OUTDIR/summary.txt says which parts finished. OUTDIR defaults to benchmark-results/ (or $OUT
# where the machine provides one).
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUTDIR=${1:-${OUT:-benchmark-results}}
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2
# JAX runs after torch in its own process; keep it from taking 75% of the GPU up front all the same.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  echo "started $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  git log -1 --format='commit %H %cd' 2>&1
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1
  "$PYTHON" -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1
} | tee "$OUTDIR/summary.txt"

part() {  # part NAME SECONDS ARGS...: one `python -m benchmarks` run under a time limit
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$PYTHON" -m benchmarks "$@" --json "$OUTDIR/$name.json" >"$OUTDIR/$name.txt" 2>"$OUTDIR/$name.err"
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - started)) s (limit $limit s): python -m benchmarks $*" | tee -a "$OUTDIR/summary.txt"
}

# One part per model, so a part that runs past its limit loses only its own rows; the most wanted
# first. Limits sum to 475 s plus start-ups: about 8 minutes. The small JAX models (`--only jax`:
# six models, four compilations each) do not fit in that; run them apart when time allows
# (`bash benchmarks/gpu.sh OUTDIR jax_small`).
if [ "${2:-}" = jax_small ]; then
  part jax_small 300 --only jax
else
  part torch_gpt2 130 --only torch_models --models gpt2 --size train --compile 0 --rounds 3
  part torch_resnet50 60 --only torch_models --models resnet50 --size train --compile 0 --rounds 3
  part jax_gpt2 90 --only jax_models --models gpt2 --size train --rounds 3
  part jax_resnet50 70 --only jax_models --models resnet50 --size train --rounds 3
  part torch_gpt2_compiled 80 --only torch_models --models gpt2 --size train --compile 1 --rounds 3
  part torch_small 45 --only torch
fi
echo "finished $(date -u +%FT%TZ)" | tee -a "$OUTDIR/summary.txt"
