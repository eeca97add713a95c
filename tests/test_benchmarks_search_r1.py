"""benchmarks/bench_search_r1_steps.py: the Search-R1 3B PPO recipe's first steps, timed.

On a GPU it runs the recipe at Qwen2.5-3B's shape (benchmarks/gpu/search_r1_steps.sh); here the same script
runs at the smoke shape on the CPU, through the recipe file and the same trainer, and must write every figure.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

from support.benchmarks import load_benchmark

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_recipe_runs_and_is_timed_at_the_smoke_shape(tmp_path):
    bench = load_benchmark("bench_search_r1_steps")
    out = tmp_path / "steps.json"
    argv = ["--shape", "tiny", "--cpu", "--steps", "2", "--episodes", "2", "--work", str(tmp_path / "w")]
    assert bench.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [s["step"] for s in result["steps"]] == [1, 2]
    for s in result["steps"]:
        assert s["step_s"] > 0 and s["rollout_s"] > 0 and math.isfinite(s["objective/kl"])
    # The recipe's settings reached the trainer (only batch, lengths and the device were substituted).
    assert result["settings"]["max_turns"] == 5 and result["settings"]["topk"] == 3
    assert result["settings"]["value_mode"] == "separate"
    # A separate critic and a frozen reference of the policy's size were built.
    params = result["parameters"]
    assert params["reference"] == params["policy"] and params["policy_and_value"] > params["policy"]
    assert result["device"] == "cpu" and result["peak_gpu_memory_gb"] is None


def test_the_3b_shape_is_qwen2_5_3b():
    shape = load_benchmark("bench_search_r1_steps").SHAPES["qwen2.5-3b"]
    assert (shape.hidden_size, shape.num_hidden_layers, shape.intermediate_size) == (2048, 36, 11008)
    assert (shape.num_attention_heads, shape.num_key_value_heads, shape.tie_word_embeddings) == (16, 2, True)


def test_the_device_script_parses_and_runs_this_benchmark():
    script = BENCH / "gpu" / "search_r1_steps.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    text = script.read_text()
    assert "bench_search_r1_steps.py" in text and "source benchmarks/gpu/lib.sh" in text
