#!/usr/bin/env bash
# The GPU numbers in one run (issues 14 and 23): what a lent CUDA machine should measure.
#
#   scripts/gpu_bench.sh                         on a machine with CUDA: writes its JSON under
#                                                bench/results/gpu/<device>/ (e.g. nvidia_h200),
#                                                or under $OUT when set
#   GPU_BENCH_DEVICE=cpu OUT=/tmp/g scripts/gpu_bench.sh   the same steps, tiny, on the CPU
#                                                          (a rehearsal of the script itself)
#
# Steps, each under its own time limit so a slow one cannot starve the rest (at most 9.5 min
# in all, the limits below sum to 580 s: service 90 s, each shape step 80 s, curves 60 s;
# each step but curves rewrites its JSON after every cell, so
# one cut short keeps what it measured). Every record names the device. The first H200
# run (bench/results/gpu/h200_run1.json) used limits a third of these and every step ran
# out of time:
#   1. the environment: GPU name, driver, torch/transformers versions (env.json);
#   2. captured attention == eager attention on CUDA, float32 and bfloat16, demo model and
#      tiny Qwen2.5-VL, with the tolerance stated (attention_check.json);
#   3. `lad bench engine`, tiny Qwen2.5-VL at ~1.5k / 6k / 16k tokens (N = 12) in bf16;
#   4. `lad bench service` on the demo model with LAD_DEVICE=cuda;
#   5. issue 23: the released Qwen2.5-VL-3B and -7B architectures at full width with random
#      weights (`shape:`, lad_lab/testing/shapes/), bf16, sdpa vs agd vs eager at N = 2, 4, 8, 12
#      and ~1.5k / 6k tokens, peak GPU memory per variant; the 3B's captured == eager in
#      step 2;
#   6. issue 23: throughput of the runner at batch 1, 4 and 16 (agd requests in one forward)
#      and the perm_avg request's latency against agd, on the 3B shape in bf16 at ~1.5k
#      tokens, N = 4, with the peak GPU memory of each (`lad bench engine --batch`);
#   7. issue 31: the encoder cache off vs on on the 3B shape in bf16 at ~1.7k tokens (N = 4)
#      and N = 12: perm_avg's N orderings against the limit (V + N·L) / (N·(V + L)), a
#      64-document rerank, a Zipf stream's throughput, memory at the bound (`lad bench cache`);
#   8. issue 31: the cost curves, the same command as docs/benchmarks.md's CPU record
#      (`lad bench curves`: vanilla / agd / perm_avg against N = 2..64, tokens per image and
#      batch size, tiny Qwen2.5-VL; peak memory the CUDA allocator's), record and PNG;
#   9. issue 42: `lad bench peer`, our service beside vLLM's OpenAI server on the 3B shape at
#      width 512 in bf16 (concurrency 1, 4, 16), only where vLLM's GPU build is importable
#      ($GPU_BENCH_PEER_PYTHON, else $PY); 150 s more (730 s in all: run it in a call of
#      its own with GPU_BENCH_ONLY=peer when the call's limit is 600 s).
# Python packages the machine lacks can travel as wheels in $GPU_BENCH_WHEELS (installed
# with --no-deps into /tmp/site; nothing is downloaded). Without CUDA (and without
# GPU_BENCH_DEVICE=cpu) it says so, writes env.json with "cuda": false and exits 3.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${GPU_BENCH_WHEELS:-}" ] && ls "$GPU_BENCH_WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$GPU_BENCH_WHEELS"/*.whl || { echo "wheel install failed"; exit 4; }
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi

if [ -z "${OUT:-}" ]; then  # bench/results/gpu/<the device's name>, e.g. nvidia_h200
  OUT="bench/results/gpu/$("$PY" -c 'import re, torch; print(re.sub(r"[^a-z0-9]+", "_",
    (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no_cuda").lower()).strip("_"))' \
    2>/dev/null || echo unknown)"
fi
mkdir -p "$OUT"
echo "results go to $OUT"

"$PY" - "$OUT/env.json" <<'EOF'
import json, platform, subprocess, sys
info = {"python": sys.version.split()[0], "machine": platform.machine()}
try:
    import torch, transformers
    info.update(torch=torch.__version__, transformers=transformers.__version__,
                cuda=torch.cuda.is_available())
    if info["cuda"]:
        info.update(device=torch.cuda.get_device_name(0), cuda_version=torch.version.cuda,
                    memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
except Exception as exc:  # what is missing is the finding
    info["error"] = repr(exc)
    info.setdefault("cuda", False)
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False)
    info["nvidia_smi"] = smi.stdout.strip()
except OSError:
    info["nvidia_smi"] = None
import app.main  # noqa: F401  (the service imports: fails here if a package is missing)
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(json.dumps(info))
EOF
[ $? -eq 0 ] || { echo "environment check failed (see above)"; exit 4; }

if [ "${GPU_BENCH_DEVICE:-cuda}" = cpu ]; then
  DEV=cpu; TOKENS=300,600; REPS=2; SVC_REQ=8; LARGE=1; DTYPES=float32
  # 224: a whole, even head size over the 3B's 16 heads and the 7B's 28
  SHAPE_ARGS="--width 224 --tokens 300 --n 2 --reps 1"; ATTN_MODELS=demo,tiny-qwen2_5_vl
  BATCH_ARGS="--width 128 --tokens 300 --n 2 --reps 1 --batch 1,4"
  CACHE_ARGS="--width 128 --side 112 --n 4 --reps 1 --rerank-docs 16 --stream 8 --bound-entries 8"
  CURVE_ARGS="--n 2,16 --sides 56 --batch 1,2 --reps 1"
else
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device here: the GPU benchmarks are skipped (env.json says \"cuda\": false)"
    exit 3
  fi
  DEV=cuda; TOKENS=1500,6000,16000; REPS=5; SVC_REQ=64; LARGE=4
  DTYPES=float32,bfloat16; SHAPE_ARGS="--tokens 1500,6000 --n 2,4,8,12 --reps 3"
  BATCH_ARGS="--tokens 1500 --n 4 --reps 3 --batch 1,4,16"
  CACHE_ARGS="--side 532 --n 4,12 --reps 3 --stream 48 --bound-entries 64 --threads 4"
  ATTN_MODELS=demo,tiny-qwen2_5_vl,shape:qwen2_5_vl-3b
  CURVE_ARGS="--reps 2 --threads 1"  # the CPU record's command (bench/results/curves_*.json)
fi

step() {  # step <seconds> <name> <command...>: run with a limit, log its status
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@"; local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)"
}

BF16="$([ $DEV = cuda ] && echo bfloat16 || echo float32)"
if [ "${GPU_BENCH_ONLY:-}" = peer ]; then SKIP=1; else SKIP=0; fi
if [ $SKIP = 0 ]; then
step 75 attention "$PY" -m app.cli bench attention --models "$ATTN_MODELS" --device "$DEV" \
  --dtypes "$DTYPES" --out "$OUT/attention_check.json"
step 45 "engine bf16" "$PY" -m app.cli bench engine --model tiny-qwen2_5_vl --device "$DEV" \
  --dtype "$([ $DEV = cuda ] && echo bfloat16 || echo float32)" --tokens "$TOKENS" --n 12 \
  --reps "$REPS" --out "$OUT/engine_tiny_bf16.json"
LAD_DEVICE=$DEV step 90 service "$PY" -m app.cli bench service --requests "$SVC_REQ" \
  --concurrency 1,16 --threads 4 --detail-requests 16 --large-requests "$LARGE" \
  --out "$OUT/service_demo.json"
for size in 3b 7b; do  # word splitting of SHAPE_ARGS is meant
  # shellcheck disable=SC2086
  step 80 "shape $size" "$PY" -m app.cli bench engine --model "shape:qwen2_5_vl-$size" \
    --device "$DEV" --dtype "$BF16" $SHAPE_ARGS --out "$OUT/engine_shape_qwen2_5_vl-$size.json"
done
# shellcheck disable=SC2086
step 60 throughput "$PY" -m app.cli bench engine --model shape:qwen2_5_vl-3b --device "$DEV" \
  --dtype "$BF16" $BATCH_ARGS --out "$OUT/throughput_shape_qwen2_5_vl-3b.json"
# shellcheck disable=SC2086
step 90 cache "$PY" -m app.cli bench cache --model shape:qwen2_5_vl-3b --device "$DEV" \
  --dtype "$BF16" $CACHE_ARGS --out "$OUT/cache_shape_qwen2_5_vl-3b.json"
# shellcheck disable=SC2086
step 60 curves "$PY" -m app.cli bench curves --device "$DEV" $CURVE_ARGS \
  --out "$OUT/curves_tiny_qwen2_5_vl.json" --plot "$OUT/cost_tiny_qwen2_5_vl.png"
fi

PEER_PY="${GPU_BENCH_PEER_PYTHON:-$PY}"
if "$PEER_PY" -c "import vllm" >/dev/null 2>&1; then
  PEER_ARGS="--concurrency 1,4,16 --rounds 4 --requests 32"
  [ $DEV = cpu ] && PEER_ARGS="--concurrency 1,4 --rounds 1 --requests 4"
  # shellcheck disable=SC2086
  LAD_DEVICE=$DEV step 150 peer "$PY" -m app.cli bench peer --model shape:qwen2_5_vl-3b \
    --width 512 --dtype "$BF16" --peer-python "$PEER_PY" ${GPU_BENCH_PEER_SHIM:+--peer-shim "$GPU_BENCH_PEER_SHIM"} \
    $PEER_ARGS --out "$OUT/peer_shape_qwen2_5_vl-3b_w512.json"
else
  echo "== peer: skipped (vLLM is not importable by $PEER_PY)"
fi
ls -la "$OUT"
