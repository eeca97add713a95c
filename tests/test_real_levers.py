"""benchmarks/real_levers.py without training: every built-in lever loads into a valid RealDemoConfig, the plan
shares one warm start among the levers that change only PPO, a lever that changes the warm start gets its own,
and the table reads the paired dev differences. (The sweep itself trains for hours: not run in tests.)"""

from __future__ import annotations

import argparse
from pathlib import Path

from support.benchmarks import load_benchmark

from searchrl.common.config import load_config
from searchrl.demo.configs import RealDemoConfig

ROOT = Path(__file__).resolve().parents[1]


def test_every_lever_is_a_valid_config_and_the_plan_shares_warm_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the levers name configs/real/*.yaml relative to the repository
    levers = load_benchmark("real_levers")
    base = RealDemoConfig()
    for name, lever in levers.LEVERS.items():
        cfg = load_config(
            RealDemoConfig,
            ROOT / "configs" / "demo_real.yaml",
            {**lever.get("warm", {}), **lever.get("ppo", {})},
        )
        if name != "recipe":
            assert cfg != base, name  # a lever changes something
    assert load_config(
        RealDemoConfig, ROOT / "configs" / "demo_real.yaml", levers.LEVERS["reward_staged"]["ppo"]
    ).reward_config_path.endswith("rewards_staged.yaml")
    args = argparse.Namespace(
        work_dir=str(tmp_path), threads=2, jobs=1, dev_questions=200, seed=0, warm=None,
        config="configs/demo_real.yaml", levers=["recipe", "reward_staged", "lr_1e-4", "demos_600"],
        eval_steps=2, curve_questions=64,
    )  # fmt: skip
    warm, ppo = levers.plan(args, levers.LEVERS)
    assert len(warm) == 2 and [s["name"] for s in ppo] == args.levers
    shared = {s["warm_dir"] for s in ppo if s["name"] != "demos_600"}
    assert len(shared) == 1 and next(s for s in ppo if s["name"] == "demos_600")["warm_dir"] not in shared
    # The test split is never an input: every spec evaluates on dev.
    assert all("test" not in key for spec in [*warm, *ppo] for key in spec)
    diff = {"mean": 0.05, "ci95": [0.01, 0.09], "n": 200}
    row = levers.table(
        [],
        [
            {
                "name": "recipe", "note": "", "ppo_dev": {"f1": 0.3, "exact_match": 0.2},
                "ppo_minus_sft_dev": {"f1": diff, "exact_match": diff}, "objective/kl": [0.0, 0.1], "train_s": 9.0,
            }
        ],
    )  # fmt: skip
    assert row[0]["ppo_minus_sft_f1_ci95"] == [0.01, 0.09] and row[0]["kl_last"] == 0.1
