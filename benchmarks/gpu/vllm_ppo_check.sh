#!/usr/bin/env bash
# The vLLM backend's one GPU check: vLLM against HFGenerator (rollout tokens/s, greedy agreement, logprob
# gap), a few PPO steps with rollout_backend="vllm" (weight syncs, logprob gap against the trainer) and the
# same PPO steps on HFGenerator, then the GPU tests of tests/test_rollout_vllm.py. Figures go to $OUT as
# JSON (setup.json, rollout.json, ppo-vllm.json, ppo-hf.json), with env.json (versions, what is missing),
# steps.jsonl (each step's exit status and seconds) and log.txt.
#
# On a session's lent device machine (one H200; a fresh, offline machine with the image's python3:
# torch 2.11.0+cu130, transformers 5.17, no vLLM), from the repo root here:
#     bash benchmarks/gpu/prepare_wheels.sh      # here: the small wheels searchrl needs there -> .whl/
#     run(command="bash benchmarks/gpu/vllm_ppo_check.sh", carry=[".whl"], timeout_s=540)
# On any CUDA 13 machine with vLLM installed: PYTHON=/path/to/venv/bin/python OUT=out bash <this script>
# (requirements-vllm.txt pins the vLLM that matches torch 2.11.0).
#
# vLLM comes from, in order: $PYTHON's environment if it imports vllm; else every wheel in $WHEELS (.whl)
# installed into an overlay venv over the image's python3 (the venv sees the image's torch through a .pth
# file, so nothing of the image is replaced), vllm pinned by requirements-vllm.txt and resolved offline
# from the same folder. The device cannot reach a registry and a call carries at most 64 MiB, while the
# vllm 0.24.0 wheel alone is 279 MB: on today's device the install finds no vLLM, env.json says so, and
# the script still runs every part it can (HF rollouts, PPO on HFGenerator and on VLLMGenerator over the
# HFTokenEngine reference) so the lease checks the environment and gives the HF figures on the GPU.
#
# Every step runs under `timeout` inside one budget (BUDGET_S, default 480 s): a step that runs long is
# killed, later steps are skipped when the budget is spent, and what was written comes back.
set -u -o pipefail
cd "$(dirname "$0")/../.."
BUDGET_S=${BUDGET_S:-480}
OUT=${OUT:-$PWD/.bench/gpu-check}
WORK=${WORK:-/tmp/searchrl-vllm-check}
BENCH_ARGS=${BENCH_ARGS:-}  # extra bench_vllm.py options for every part (e.g. smaller --rows)
# shellcheck source=benchmarks/gpu/lib.sh
source benchmarks/gpu/lib.sh

# --- what this machine has (env.json): versions, GPU, whether vllm and searchrl import ---------------
step preflight 90 "$PY" - "$OUT/env.json" <<'PY'
import importlib, importlib.metadata as md, json, sys, traceback
import torch
env = {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
       "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
for name in ("transformers", "trl", "accelerate", "peft", "datasets", "bm25s", "vllm", "flashinfer-python"):
    try:
        env[name] = md.version(name)
    except md.PackageNotFoundError:
        env[name] = None
for mod in ("searchrl.ppo.trainer", "searchrl.rollout.vllm_generator", "searchrl.search.bm25", "vllm"):
    try:
        importlib.import_module(mod)
        env[f"import {mod}"] = "ok"
    except Exception as exc:  # noqa: BLE001 - report whatever stops the import
        env[f"import {mod}"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(limit=3)
json.dump(env, open(sys.argv[1], "w"), indent=2)
print(json.dumps(env, indent=2))
sys.exit(0 if env["import searchrl.ppo.trainer"] == "ok" else 3)
PY
PRE=$?
if [ "$PRE" -ne 0 ]; then
  echo "searchrl does not import here (env.json says why): nothing else can run"
  exit "$PRE"
fi
if grep -q '"import vllm": "ok"' "$OUT/env.json"; then
  ENGINE=vllm ROLLOUT_ARGS=""
else
  # No vLLM: the vLLM side runs on HFTokenEngine (one row at a time), so fewer rows and one repeat.
  ENGINE=hf ROLLOUT_ARGS="--rows 16 --check-rows 8 --repeats 1"
  echo "vLLM is not importable here: the vLLM side of each part runs on HFTokenEngine (no vLLM figures)"
fi

# --- the parts: each its own process, so a vLLM engine never outlives its part -------------------------
B=("$PY" benchmarks/bench_vllm.py --work "$WORK")
# shellcheck disable=SC2086  # BENCH_ARGS / ROLLOUT_ARGS are option lists
step setup 150 "${B[@]}" --part setup --json "$OUT/setup.json" $BENCH_ARGS &&
  step rollout 210 "${B[@]}" --part rollout --engine "$ENGINE" --json "$OUT/rollout.json" $ROLLOUT_ARGS $BENCH_ARGS
if [ -f "$OUT/setup.json" ]; then
  # shellcheck disable=SC2086
  step ppo-vllm 180 "${B[@]}" --part ppo --backend vllm --engine "$ENGINE" --json "$OUT/ppo-vllm.json" $BENCH_ARGS
  # shellcheck disable=SC2086
  step ppo-hf 90 "${B[@]}" --part ppo --backend hf --json "$OUT/ppo-hf.json" $BENCH_ARGS
fi
if [ "$ENGINE" = vllm ]; then
  step gpu-tests 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_rollout_vllm.py -k real_vllm
fi

# --- a short table last (the device call returns the end of the output) --------------------------------
"$PY" - "$OUT" <<'PY' || true
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.exists() else None
env, r = load("env.json") or {}, load("rollout.json")
print(f"\n{env.get('gpu')} | torch {env.get('torch')} | vllm {env.get('vllm')} | transformers {env.get('transformers')}")
if r:
    print(f"rollout ({r['engine']} engine, {r['rows']} rows): HF {r['hf']['tokens_per_s']:.0f} tok/s, "
          f"vLLM side {r['vllm']['tokens_per_s']:.0f} tok/s (x{r['vllm_vs_hf_tokens_per_s']:.2f}), "
          f"prefix-cache hit {r['vllm'].get('prefix_cache_hit_rate', 0):.2f}, greedy identical "
          f"{r['greedy_identical_rows']}/{r['greedy_rows']}, logprob gap max {r['logprob_gap_max']:.2e}")
for name in ("ppo-vllm.json", "ppo-hf.json"):
    p = load(name)
    if p:
        s = p["steps"]
        print(f"{name}: {len(s)} steps, s/step {[round(x['step_s'], 2) for x in s]}, rollout s "
              f"{[round(x['rollout/seconds'], 2) for x in s]}, logprob diff max "
              f"{max(x['rollout/logprob_max_abs_diff'] for x in s):.2e}, syncs {p.get('weight_syncs_total')}, "
              f"engine-vs-policy {p.get('engine_vs_policy_max_abs_diff')}")
print((out / "steps.jsonl").read_text() if (out / "steps.jsonl").exists() else "no steps.jsonl")
PY
echo "check done in $((SECONDS - START))s; files in $OUT"
