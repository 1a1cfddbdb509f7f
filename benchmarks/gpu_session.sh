#!/usr/bin/env bash
# The prepared device calls for a lent GPU (15 minutes of device time, all calls together; a call ends
# within 600 s). Two modes, each one call:
#   bash benchmarks/gpu_session.sh check   # gpu_check.py (every emitted Triton path vs the float64 torch recurrence)
#                                          # then gpu_suite.py (speed against flash-linear-attention and SDPA): ~390 s
#   bash benchmarks/gpu_session.sh atlas   # Atlas' MQAR row (gpu_mqar.py) alone on the GPU: ~430 s
# Run `check` first, then `atlas` at once (the machine stays warm 30 s after a call). On 2026-12-04 one call ran
# all three at once and Atlas, sharing the GPU with gpu_check's 14 processes, ran at 1.1-1.9 s/step instead of its
# 0.37 s/step alone and was cut at step 950 of 1000 (benchmarks/RESULTS.md "GPU"): hence the two calls.
#
# Here, first (the GPU image has torch and triton but not lark or pydantic, and no package registry):
#   python benchmarks/gpu_check.py --emit benchmarks/emitted          # every spec, standalone files (git-ignored)
#   echo /.whl/ >> .git/info/exclude; pip download --no-deps ... -d .whl fla-core==0.6.0 titans-pytorch ...
#                                                                      # (the list: RESULTS.md "GPU")
# Then: run(command="bash benchmarks/gpu_session.sh check", carry=["benchmarks/emitted", ".whl"], timeout_s=600)
# Everything lands in $OUT (at most 8 files come back): session.log, gpu_check.{md,log}, gpu_suite.{md,log} or
# atlas.log, gpu_mqar.{md,json}.
set -u
export PYTHONUNBUFFERED=1
MODE=${1:-check}
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
END=${GPU_SESSION_END_S:-570}       # stop everything by then (the call's limit is 600 s)
CHECK_S=${GPU_CHECK_S:-200}         # gpu_check: hard limit; no new spec after CHECK_S - 60 s, all killed at CHECK_S - 10 s
SUITE_S=${GPU_SUITE_S:-170}         # gpu_suite: all groups together; a group starts no new case in its last 15 s
exec > >(tee -a "$OUT/session.log") 2>&1
log() { echo "[$SECONDS s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,temperature.gpu \
    --format=csv 2>&1
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', \
torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO GPU')"

if [ "$MODE" = atlas ]; then
    log "Atlas MQAR alone until ${END} s"
    timeout $((END - SECONDS)) python3 benchmarks/gpu_mqar.py --spec atlas --emitted benchmarks/emitted --lr 1e-2 \
        --seeds 0 1 --tf32 --time-budget-s $((END - SECONDS - 20)) --out "$OUT/gpu_mqar.md" --json "$OUT/gpu_mqar.json" \
        > "$OUT/atlas.log" 2>&1
    log "gpu_mqar exit $?"
    [ -f "$OUT/gpu_mqar.md.partial" ] && mv "$OUT/gpu_mqar.md.partial" "$OUT/gpu_mqar.md"
    grep -E "step|Error|error" "$OUT/atlas.log" | tail -12
    cat "$OUT/gpu_mqar.md" 2> /dev/null
    log "done"
    exit 0
fi

python3 -c "import fla, titans_pytorch; print('fla', fla.__version__, 'titans_pytorch ok')" 2>&1 | tail -1
log "the state scan's TF32 / bf16 / fp32 builds alone (benchmarks/tf32_wgmma_repro.py; a fault is a row, not a stop)"
timeout 60 python3 benchmarks/tf32_wgmma_repro.py --run 2>&1 | grep -v Warning | tail -4
log "gpu_check"
timeout "$CHECK_S" python3 benchmarks/gpu_check.py --emitted benchmarks/emitted --jobs 14 --spec-timeout-s 150 \
    --budget-s $((CHECK_S - 60)) --deadline-s $((CHECK_S - 10)) --out "$OUT/gpu_check.md" > "$OUT/gpu_check.log" 2>&1
log "gpu_check exit $?"
grep -E "^cases|^not started| FAIL | WRONG " "$OUT/gpu_check.md" "$OUT/gpu_check.log" | cut -c1-300 | head -40

log "gpu_suite, a process per group (a sticky CUDA error costs one group)"
SUITE_END=$((SECONDS + SUITE_S))
for group in "transformer: sliding_window: forgetting_transformer: stickbreaking:" "gated_deltanet: deltanet: mamba2:" "gla: kda:" \
             "rwkv7: comba: momentum_deltanet:" "ttt_linear: titans moneta memora yaad"; do
    left=$((SUITE_END - SECONDS))
    [ "$left" -lt 20 ] && { log "no time for: $group"; continue; }
    timeout "$left" python3 benchmarks/gpu_suite.py --emit-dir benchmarks/emitted --budget-s $((left - 15)) \
        --only $group --out "$OUT/gpu_suite.md" >> "$OUT/gpu_suite.log" 2>&1
    log "gpu_suite [$group] exit $?"
    [ -f "$OUT/gpu_suite.md.partial" ] && cat "$OUT/gpu_suite.md.partial" >> "$OUT/gpu_suite.md" \
        && rm "$OUT/gpu_suite.md.partial"
done
grep "^|" "$OUT/gpu_suite.md" | cut -d'|' -f2-8
nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu --format=csv 2>&1
log "done"
