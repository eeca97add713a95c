#!/usr/bin/env bash
# Run HERE (a machine that reaches the package registry), in the repo root, before a device run:
# downloads the pinned wheels of benchmarks/gpu/device-wheels.txt (what searchrl imports that the device
# image lacks; about 5 MB) for the device's Python 3.12 on x86-64 into .whl/, and keeps .whl/ out of git.
# The device run then names .whl in `carry`; vllm_ppo_check.sh installs every wheel it finds there.
#
# vLLM itself is not downloaded: its wheel alone (vllm 0.24.0) is 279 MB, over the 64 MiB a device call
# may carry. Put a wheelhouse with vllm and its dependencies in .whl/ yourself where a bigger carry is
# possible, or run the check where vLLM is installed (see vllm_ppo_check.sh's header).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
mkdir -p .whl
grep -v '^#' benchmarks/gpu/device-wheels.txt | grep -v '^$' | xargs "$PY" -m pip download -q --no-deps \
  --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl
ls -l .whl
du -sh .whl
