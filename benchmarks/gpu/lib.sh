#!/usr/bin/env bash
# What every device check in benchmarks/gpu/ starts with: the budgeted `step` runner, the run's output
# folder and log, the offline environment, and the interpreter (an overlay venv over the image's python3
# unless $PYTHON is given) with the carried wheels installed. Source it from the repo root after setting
# BUDGET_S, OUT and WORK; it defines START, PY, PIP and step().
START=$SECONDS
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

# step NAME LIMIT_S CMD...: run CMD under timeout (capped by what is left of the budget), log its status.
step() {
  local name=$1 limit=$2 left rc t0
  shift 2
  left=$((BUDGET_S - (SECONDS - START)))
  if ((left < 20)); then
    echo "== $name: skipped, budget spent"
    printf '{"step": "%s", "skipped": "budget spent"}\n' "$name" >>"$OUT/steps.jsonl"
    return 99
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit}s, $((SECONDS - START))s into the check)"
  t0=$SECONDS
  timeout -k 10 "$limit" "$@"
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  printf '{"step": "%s", "rc": %d, "seconds": %d, "limit_s": %d}\n' "$name" "$rc" $((SECONDS - t0)) "$limit" \
    >>"$OUT/steps.jsonl"
  return $rc
}

# --- the interpreter: $PYTHON as given, else an overlay venv over the image's python3 -----------------
BASE=${PYTHON:-${IMAGE_PYTHON:-python3}}
PY=$BASE
if [ -z "${PYTHON:-}" ]; then
  VENV=/tmp/searchrl-gpu-venv
  if "$BASE" -m venv --without-pip "$VENV"; then
    "$BASE" -c 'import sysconfig; print("\n".join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))))' \
      >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image-site.pth"
    PY=$VENV/bin/python
  else
    echo "no overlay venv (python3 -m venv failed): installing into $BASE's environment"
  fi
fi
PIP=("$BASE" -m pip --python "$PY" install --no-index --no-cache-dir --disable-pip-version-check)
nvidia-smi -L || true
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  # Everything carried, without dependency resolution (the image has the rest) ...
  step install-wheels 120 "${PIP[@]}" -q --no-deps "$WHEELS"/*.whl
  # ... and vLLM pinned, resolved offline from the same folder, when a vllm wheel is among them.
  if compgen -G "$WHEELS/vllm-*.whl" >/dev/null; then
    step install-vllm 120 "${PIP[@]}" -q --find-links "$WHEELS" -r benchmarks/gpu/requirements-vllm.txt
  fi
fi
