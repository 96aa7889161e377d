#!/usr/bin/env bash
# Train demo-model recipe variants in parallel (one process each), `lad eval` each one, and
# pack weights + eval outputs (no predictions.jsonl) into one tarball per variant; the
# controls (names starting with "ctl_") go into one tarball without weights.
#
#   scripts/demo_sweep.sh OUT_DIR DEVICE STEPS ITEMS [VARIANT...]
#
# Used once on a lent GPU for the v2 recipe (app/demo/model/README.md); with DEVICE=cpu and
# tiny STEPS/ITEMS it is the smoke test of the same script. Every variant fine-tunes the
# v1 weights (BASE, default app/demo/model) with all label schemes.
set -u
out=$1 device=$2 steps=$3 items=$4
shift 4
base=${BASE:-app/demo/model}
py=${PYTHON:-python3}
work=${WORK:-/tmp/demo_sweep}
max_s=${MAX_SECONDS:-100000}
mkdir -p "$out" "$work"

common=(--steps "$steps" --caption-fraction 0 --init-from "$base" --device "$device"
        --schemes digits upper lower roman words --caption-share 0.05 --curriculum-start 0.5
        --lr 1e-3 --log-every 100 --threads 1 --corruption-shape neighbours
        --max-seconds "$max_s")
declare -A recipe=(
  [c06w02]="--corruption 0.6 --prior-mix 0.6 --aux-layers 2 3 --aux-weight 0.2"
  [c08w02x30]="--corruption 0.8 --target-shape product --prior-mix 0.3 --aux-layers 2 3 --aux-weight 0.2"
  [c06w02x30]="--corruption 0.6 --target-shape product --prior-mix 0.3 --aux-layers 2 3 --aux-weight 0.2"
  [c06w02x15]="--corruption 0.6 --target-shape product --prior-mix 0.15 --aux-layers 2 3 --aux-weight 0.2"
  [c06w05x30]="--corruption 0.6 --target-shape product --prior-mix 0.3 --aux-layers 2 3 --aux-weight 0.5"
  [c04w02x30]="--corruption 0.4 --target-shape product --prior-mix 0.3 --aux-layers 2 3 --aux-weight 0.2"
  [ctl_w02x30_nocorr]="--corruption 0 --target-shape product --prior-mix 0.3 --aux-layers 2 3 --aux-weight 0.2"
  [ctl_c06_noaux]="--corruption 0.6 --target-shape product --prior-mix 0.3 --aux-layers 2 3 --aux-weight 0"
  [ctl_c08_noaux]="--corruption 0.8 --target-shape product --prior-mix 0.3 --aux-layers 2 3 --aux-weight 0"
)
lad_eval() { $py -c "import sys; from app.eval.cli import main; sys.exit(main(sys.argv[1:]))" "$@"; }

one() {
  local v=$1 dir=$work/$1
  # shellcheck disable=SC2086
  $py -m app.demo.train_cli --out "$dir/model" "${common[@]}" ${recipe[$v]} >"$dir.train.log" 2>&1
  echo "$v trained rc=$? $(date -u +%T)"
  lad_eval --model "$dir/model" --dataset synthetic --setting random adversarial -n 4 \
    --items "$items" --orderings 4 --calibration 5 --threads 1 --quiet \
    --methods vanilla attn_raw attn_pure agd perm_avg --out "$dir/eval4" >"$dir.eval4.log" 2>&1
  echo "$v eval4 rc=$? $(date -u +%T)"
  if [[ $v != ctl_* ]]; then
    lad_eval --model "$dir/model" --dataset synthetic --setting random -n 8 \
      --items "$items" --orderings 4 --calibration 5 --threads 1 --quiet \
      --methods vanilla attn_raw attn_pure agd --out "$dir/eval8" >"$dir.eval8.log" 2>&1
    echo "$v eval8 rc=$? $(date -u +%T)"
  else
    rm -rf "$dir/model"
  fi
  rm -f "$dir"/eval*/predictions.jsonl "$dir"/eval*/*.png
  cp "$work/$v".*.log "$dir/"
}

start=$(date +%s)
pids=()
for v in "$@"; do
  mkdir -p "$work/$v"
  one "$v" &
  pids+=($!)
done
# wait for all, but pack whatever exists once DEADLINE seconds have passed
while (( $(date +%s) - start < ${DEADLINE:-100000} )); do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  (( alive )) || break
  sleep 2
done
for v in "$@"; do cp "$work/$v".*.log "$work/$v/" 2>/dev/null; done
for v in "$@"; do
  [[ $v == ctl_* ]] || tar -czf "$out/$v.tgz" -C "$work" "$v"
done
ctl=$(cd "$work" && ls -d ctl_* 2>/dev/null)
[[ -n $ctl ]] && tar -czf "$out/controls.tgz" -C "$work" $ctl
ls -la "$out"
pkill -P $$ 2>/dev/null  # children still running past DEADLINE (this script's own)
exit 0
