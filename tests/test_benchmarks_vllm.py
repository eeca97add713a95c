"""benchmarks/bench_vllm.py end to end on CPU: all three parts over `HFTokenEngine` (`--engine hf`), toy size.

On a GPU the same script compares vLLM with HFGenerator (benchmarks/gpu/vllm_ppo_check.sh runs it). Here
the "vLLM" side is `VLLMGenerator` over `HFTokenEngine`: the same model answering token-id requests, so
the figures have known values: greedy rollouts agree on every row, the recorded logprobs equal an HF
forward pass to float error, and the PPO run syncs the engine's copy of the weights after every update
until it equals the policy. This checks the script's machinery and the JSON it writes, not a speed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support.benchmarks import load_benchmark

torch.set_num_threads(1)  # a shared 2-core machine

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
TOY = [
    "--engine", "hf", "--threads", "1", "--rows", "6", "--check-rows", "4", "--repeats", "1",
    "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
    "--vocab", "512", "--warm-steps", "30", "--dtype", "float32",
    "--max-new-tokens-per-turn", "32", "--max-episode-tokens", "256", "--ppo-steps", "2", "--ppo-batch", "4",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    script = load_benchmark("bench_vllm")
    work = tmp_path_factory.mktemp("bench_vllm")
    out = {}
    for part in ("setup", "rollout", "ppo"):
        path = work / f"{part}.json"
        payload = script.main(["--part", part, "--work", str(work / "w"), "--json", str(path), *TOY])
        assert json.loads(path.read_text()) == json.loads(json.dumps(payload, default=str))
        out[part] = payload
    return out


def test_setup_builds_a_world_and_a_warm_policy(runs):
    s = runs["setup"]
    assert s["part"] == "setup" and s["device"] == "cpu" and s["vllm_version"] is None
    assert s["parameters"] > 10_000 and s["vocab_size"] >= 256
    for key in ("warm_first_turn_search_rate", "warm_searches_per_episode", "warm_termination_answered"):
        assert 0.0 <= s[key] <= 3.0, key


def test_rollout_figures_present_and_sane_on_the_hf_engine(runs):
    r = runs["rollout"]
    assert r["engine"] == "hf" and r["rows"] == 6
    for side in ("hf", "vllm"):
        fig = r[side]
        assert fig["sampled_tokens"] > 0 and fig["wall_s"] > 0
        assert fig["tokens_per_s"] == pytest.approx(fig["sampled_tokens"] / fig["wall_s"])
        assert fig["trajectory_tokens"] > fig["sampled_tokens"]  # prompts and observations are in there
        assert 0.0 <= fig["search_share"] < 1.0 and 0.0 <= fig["answered"] <= 1.0
    # (At temperature 1 the engines draw from different random streams: the samples differ, the rows not.)
    assert 0.0 <= r["vllm"]["prefix_cache_hit_rate"] < 1.0
    assert r["vllm"]["prefill_ratio"] <= 1.05  # the prefix cache: history is not prefilled again
    assert math.isfinite(r["vllm_vs_hf_tokens_per_s"]) and r["vllm_vs_hf_tokens_per_s"] > 0
    # HFTokenEngine is the HF model: greedy rows agree exactly, logprobs to float error.
    assert r["greedy_rows"] == 4 and r["greedy_identical_rows"] == 4
    assert r["greedy_first_difference_after_prompt_min"] is None
    assert r["logprob_gap_max"] < 1e-4 and r["logprob_gap_mean"] <= r["logprob_gap_max"]


def test_ppo_steps_sync_the_engines_weights_after_every_update(runs):
    p = runs["ppo"]
    assert p["backend"] == "vllm" and p["engine"] == "hf" and p["generator"] == "VLLMGenerator"
    steps = p["steps"]
    assert len(steps) == 2
    # A rollout counts the syncs before it: none before step 1, one (after update 1) before step 2.
    assert [s["rollout/weight_syncs"] for s in steps] == [0.0, 1.0]
    assert p["weight_syncs_total"] == 2
    for s in steps:
        assert s["step_s"] > s["rollout/seconds"] > 0
        assert s["rollout/engine_calls"] >= 1
        # The engine sampled with the policy's current weights: its logprobs equal the recompute.
        assert s["rollout/logprob_max_abs_diff"] < 1e-4
        assert math.isfinite(s["objective/kl"]) and math.isfinite(s["objective/scores"])
    # The engine's own copy equals the policy after the last update and its sync, every parameter.
    assert p["engine_vs_policy_params_compared"] > 10
    assert p["engine_vs_policy_max_abs_diff"] == 0.0


def test_the_gpu_check_script_parses_and_its_pins_agree_with_the_lock_file():
    import re
    import subprocess

    gpu = BENCH / "gpu"
    for name in ("vllm_ppo_check.sh", "lib.sh", "search_r1_steps.sh"):
        assert subprocess.run(["bash", "-n", str(gpu / name)], check=False).returncode == 0, name
    script = (gpu / "vllm_ppo_check.sh").read_text() + (gpu / "lib.sh").read_text()
    assert "source benchmarks/gpu/lib.sh" in script
    for name in ("requirements-vllm.txt", "bench_vllm.py", "test_rollout_vllm.py"):
        assert name in script
    # The wheels carried to the device are the versions constraints.txt locks here.
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
    lock = {}
    for line in (BENCH.parent / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            lock[norm(name)] = version.strip()
    pins = [ln.split("==") for ln in (gpu / "device-wheels.txt").read_text().splitlines() if "==" in ln]
    assert pins and all(lock[norm(n)] == v.strip() for n, v in pins), pins
    # vLLM is pinned apart from the lock file (it needs torch 2.11.0; the lock has 2.13.0).
    assert "vllm==0.24.0" in (gpu / "requirements-vllm.txt").read_text().splitlines()
    assert "vllm" not in lock
