#!/usr/bin/env bash
# The prepared GPU run of issue #51: bash benchmarks/gpu/run.sh OUTDIR [--cpu --tiny] [--only SECTION]
# Writes OUTDIR/gpu.json and OUTDIR/gpu.md; ends within 8 minutes (a hard stop at 470 s keeps what was written).
# Needs `make gpu-bundle` (gpu-bundle/ beside the code) on the GPU machine; embforge is imported from this checkout.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:?usage: bash benchmarks/gpu/run.sh OUTDIR [--cpu --tiny]}
shift
if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x "$root/.venv/bin/python" ]; then py=$root/.venv/bin/python
elif command -v python3 >/dev/null; then py=python3
else py=python
fi
mkdir -p "$out"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
timeout -k 10 "${GPU_RUN_TIMEOUT:-470}" "$py" "$here/gpu_run.py" "$out" "$@" 2>&1 | tee "$out/run.log"
