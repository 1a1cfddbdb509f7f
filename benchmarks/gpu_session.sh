#!/usr/bin/env bash
# One call on a lent GPU (a session gets 15 minutes of device time, all calls together): the fit and correctness of
# every emitted Triton path (gpu_check.py), the speed suite against flash-linear-attention (gpu_suite.py), and
# Atlas' MQAR row (gpu_mqar.py, issue 12), in one command that ends inside the 600 s limit of a call.
#
# Here, first (the GPU image has torch and triton but not lark or pydantic, and no package registry):
#   python benchmarks/gpu_check.py --emit benchmarks/emitted          # every spec, standalone files (git-ignored)
#   echo /.whl/ >> .git/info/exclude; pip download --no-deps ... -d .whl fla-core==0.6.0 titans-pytorch ...
#                                                                      # (see RESULTS.md "## GPU" for the list)
# Then: run(command="bash benchmarks/gpu_session.sh", carry=["benchmarks/emitted", ".whl"], timeout_s=600)
#
# Atlas trains in the background from the start; it is paused (SIGSTOP) while the speed suite runs, so the
# timings have the GPU to themselves, and it runs alone after that until END seconds. Everything lands in $OUT
# (at most 8 files come back): session.log, gpu_check.{md,log}, gpu_suite.{md,log}, atlas.log, gpu_mqar.{md,json}.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
END=${GPU_SESSION_END_S:-570}       # stop everything by then (the call's limit is 600 s)
CHECK_S=${GPU_CHECK_S:-150}         # gpu_check: hard limit; no new spec after CHECK_S - 60 s, all killed at CHECK_S - 10 s
SUITE_S=${GPU_SUITE_S:-160}         # gpu_suite: hard limit; it starts no new case after SUITE_S - 50 s
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
python3 -c "import fla, titans_pytorch; print('fla', fla.__version__, 'titans_pytorch ok')" 2>&1 | tail -1

log "1. Atlas MQAR (background)"
python3 benchmarks/gpu_mqar.py --spec atlas --emitted benchmarks/emitted --lr 1e-2 --seeds 0 1 --tf32 \
    --time-budget-s $((END - 60)) --out "$OUT/gpu_mqar.md" --json "$OUT/gpu_mqar.json" > "$OUT/atlas.log" 2>&1 &
ATLAS=$!

log "2. gpu_check"
timeout "$CHECK_S" python3 benchmarks/gpu_check.py --emitted benchmarks/emitted --jobs 14 --spec-timeout-s 120 \
    --budget-s $((CHECK_S - 60)) --deadline-s $((CHECK_S - 10)) --out "$OUT/gpu_check.md" > "$OUT/gpu_check.log" 2>&1
log "gpu_check exit $?"
grep -E "^cases|^not started| FAIL | WRONG " "$OUT/gpu_check.md" "$OUT/gpu_check.log" | cut -c1-400 | head -60

log "3. gpu_suite (Atlas paused)"
kill -STOP "$ATLAS" 2> /dev/null
timeout "$SUITE_S" python3 benchmarks/gpu_suite.py --emit-dir benchmarks/emitted --budget-s $((SUITE_S - 50)) \
    --out "$OUT/gpu_suite.md" > "$OUT/gpu_suite.log" 2>&1
log "gpu_suite exit $?"
kill -CONT "$ATLAS" 2> /dev/null
[ -f "$OUT/gpu_suite.md.partial" ] && mv "$OUT/gpu_suite.md.partial" "$OUT/gpu_suite.md"
grep "^|" "$OUT/gpu_suite.md" | cut -d'|' -f2-8

log "4. Atlas alone until ${END} s"
while kill -0 "$ATLAS" 2> /dev/null && [ "$SECONDS" -lt "$END" ]; do sleep 2; done
kill "$ATLAS" 2> /dev/null
[ -f "$OUT/gpu_mqar.md.partial" ] && mv "$OUT/gpu_mqar.md.partial" "$OUT/gpu_mqar.md"
grep -E "step|Error|error" "$OUT/atlas.log" | tail -12
cat "$OUT/gpu_mqar.md" 2> /dev/null
nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu --format=csv 2>&1
log "done"
