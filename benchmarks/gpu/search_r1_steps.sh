#!/usr/bin/env bash
# The Search-R1 3B PPO recipe's first steps on one GPU, timed (issue 19): configs/search_r1/qwen2.5-3b_ppo.yaml
# run by benchmarks/bench_search_r1_steps.py at Qwen2.5-3B's shape with random weights (no model can be
# downloaded on the device), a BM25 retriever over the toy task and HF rollouts, a few steps of 8 episodes,
# every other setting the recipe's. Figures go to $OUT: steps-3b.json (seconds per step, rollout seconds
# and tokens/s, peak GPU memory, parameter counts), env.json, steps.jsonl, log.txt.
#
# On a lent device machine, from the repo root here:
#     bash benchmarks/gpu/prepare_wheels.sh      # here: the small wheels searchrl needs there -> .whl/
#     run(command="bash benchmarks/gpu/search_r1_steps.sh", carry=[".whl"], timeout_s=560)
# Anywhere with a CUDA GPU and searchrl installed: PYTHON=/path/to/venv/bin/python OUT=out bash <this script>
#
# Memory: the recipe keeps a separate critic, a frozen reference and AdamW states for policy and critic in
# fp32 (about 36 bytes per parameter, ~110 GB for 3.1B), which an 80 GB H100 cannot hold and a 141 GB H200
# only just can. The first try is the recipe as written; if it fails (out of memory), the second runs with
# value_mode=shared_backbone (one backbone for policy and critic, ~60 GB), so a lease always brings back
# figures, and steps.jsonl says which ran. STEPS and EPISODES set the run's size (default 3 steps of 8).
set -u -o pipefail
cd "$(dirname "$0")/../.."
BUDGET_S=${BUDGET_S:-520}
OUT=${OUT:-$PWD/.bench/gpu-search-r1}
WORK=${WORK:-/tmp/searchrl-sr1-steps}
STEPS=${STEPS:-3}
EPISODES=${EPISODES:-8}
# shellcheck source=benchmarks/gpu/lib.sh
source benchmarks/gpu/lib.sh

step preflight 90 "$PY" - "$OUT/env.json" <<'PY'
import importlib.metadata as md, json, sys
import torch
env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
       "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
       "gpu_memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
       if torch.cuda.is_available() else None}
for name in ("transformers", "trl", "accelerate", "peft", "bm25s"):
    try:
        env[name] = md.version(name)
    except md.PackageNotFoundError:
        env[name] = None
import searchrl.ppo.trainer  # noqa: F401 - fails here, not in the middle of the run
json.dump(env, open(sys.argv[1], "w"), indent=2)
print(json.dumps(env, indent=2))
sys.exit(0 if env["gpu"] else 3)
PY
PRE=$?
if [ "$PRE" -ne 0 ]; then
  echo "no GPU or searchrl does not import (env.json and the log say which): nothing else can run"
  exit "$PRE"
fi
B=("$PY" benchmarks/bench_search_r1_steps.py --work "$WORK" --steps "$STEPS" --episodes "$EPISODES")
step recipe-3b 330 "${B[@]}" --json "$OUT/steps-3b.json" ||
  step recipe-3b-shared-backbone 300 "${B[@]}" --set value_mode=shared_backbone --json "$OUT/steps-3b-shared.json"

# --- a short table last (the device call returns the end of the output) --------------------------------
"$PY" - "$OUT" <<'PY' || true
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("steps-3b.json", "steps-3b-shared.json"):
    p = out / name
    if p.exists():
        r = json.loads(p.read_text())
        print(f"{name}: {r['device']} | {r['parameters']} | {r['settings']['value_mode']} | "
              f"s/step {[s['step_s'] for s in r['steps']]} | rollout s {[s['rollout_s'] for s in r['steps']]} | "
              f"peak {r['peak_gpu_memory_gb']} GB")
print((out / "steps.jsonl").read_text() if (out / "steps.jsonl").exists() else "no steps.jsonl")
PY
echo "check done in $((SECONDS - START))s; files in $OUT"
