"""The smoke demo end to end: every stage runs and `summary.json` carries every key issue 6 names."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED = ("exact_match", "f1", "citation_support", "searches_per_question", "tool_failure_rate")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "run"
    cmd = [
        sys.executable,
        "-m",
        "searchrl.cli",
        "demo",
        "--smoke",
        "--quiet",
        "--compare-grpo",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    headline = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    assert set(headline) == {
        "sft.test.exact_match",
        "ppo.test.exact_match",
        "grpo_trl_loop.test.exact_match",
        "grpo_our_rollout.test.exact_match",
        "wall_seconds",
        "peak_rss_mb",
    }
    return out


def test_smoke_demo_writes_every_summary_key(smoke_run: Path) -> None:
    summary = json.loads((smoke_run / "summary.json").read_text())
    for stage in ("sft", "ppo", "grpo_trl_loop", "grpo_our_rollout"):
        test = summary[stage]["test"]
        for key in REQUIRED:
            assert 0.0 <= test[key] <= (1.0 if key != "searches_per_question" else 10.0), (stage, key)
            assert key in test["ci95"] and test["ci95"][key][0] <= test[key] <= test["ci95"][key][1]
        assert set(test["by_hops"]) <= {"1", "2"} and test["by_hops"]
    assert summary["ppo"]["steps"] >= 1 and summary["ppo"]["episodes"] >= 1
    assert summary["warm_start"] == {"reused": False}
    learning = summary["ppo"]["learning"]  # issue 25: is PPO learning, does the critic explain the returns
    assert set(learning) == {"dev_exact_match_first", "dev_exact_match_last", "answers_changed", "not_learning",
                             "explained_variance_2nd_half"}  # fmt: skip
    assert 0.0 <= learning["answers_changed"] <= 1.0 and isinstance(learning["not_learning"], bool)
    paired = summary["ppo_minus_sft"]["test"]["exact_match"]
    assert (
        paired["n"] == summary["test_questions"] and paired["ci95"][0] <= paired["mean"] <= paired["ci95"][1]
    )
    assert summary["wall_seconds"] > 0 and summary["peak_rss_mb"] > 100
    stages = summary["stages_seconds"]
    assert list(stages) == [
        "data",
        "index",
        "models",
        "expert",
        "sft",
        "eval sft",
        "closed book",
        "ppo",
        "eval ppo",
        "grpo trl_loop",
        "eval grpo trl_loop",
        "grpo our_rollout",
        "eval grpo our_rollout",
        "report",
    ]
    assert summary["num_demonstrations"] > 0 and summary["test_questions"] > 0
    # demonstrations of the world's train questions plus the practice world's
    demos = summary["num_demonstrations"]
    assert summary["practice_worlds"] == 1 and demos > 48
    closed = summary["sft"]["closed_book_test"]
    assert closed["searches_per_question"] >= 0 and 0.0 <= closed["exact_match"] <= 1.0
    assert summary["manifest"]["versions"]["trl"] and summary["manifest"]["index_fingerprint"]
    assert summary["improvement_exact_match"] == pytest.approx(
        summary["ppo"]["test"]["exact_match"] - summary["sft"]["test"]["exact_match"]
    )


def test_smoke_demo_writes_the_run_artifacts(smoke_run: Path) -> None:
    for rel in ("report.html", "eval/sft-test.json", "eval/ppo-test.json", "sft/expert.jsonl.gz",
                "sft/policy/config.json", "ppo/metrics.jsonl", "ppo/manifest.json", "ppo/config.yaml",
                "data/test.jsonl", "index/meta.json", "eval/sft-test-closed-book.json",
                "practice/world-0/corpus.jsonl", "practice/world-0/index/meta.json"):  # fmt: skip
        assert (smoke_run / rel).exists(), rel
    html = (smoke_run / "report.html").read_text()
    assert "<img" in html and "http://" not in html.replace("http://127.0.0.1", "")
    # --compare-grpo: the three trainers from one warm start, side by side, each with a test evaluation
    assert "<h2>Trainers side by side</h2>" in html
    for label in ("PPO", "GRPO (TRL loop)", "GRPO (our rollout)"):
        assert label in html
    for mode in ("trl_loop", "our_rollout"):
        final = json.loads((smoke_run / f"grpo_{mode}" / "eval" / "test-final.json").read_text())
        assert final["n"] == json.loads((smoke_run / "summary.json").read_text())["test_questions"]
        assert (smoke_run / f"grpo_{mode}" / "eval" / "step-0.json").exists()  # the shared warm start
    metrics = [json.loads(line) for line in (smoke_run / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics][:3] == [0, 1, 2]  # step 0: eval_on_start, the warm start


def test_reuse_warm_start_reruns_what_follows_sft_on_the_same_warm_start(
    smoke_run: Path, tmp_path: Path
) -> None:
    """`reuse_warm_start`: the expert and SFT stages are read back (not rerun), the warm start's files stay
    as they were, its test figures come out the same, and PPO trains afresh from it to the same weights."""
    import shutil

    from support.reuse import assert_one_ppo_run_to_the_same_weights, ppo_weights

    from searchrl.common.config import load_config
    from searchrl.demo.configs import DemoConfig
    from searchrl.demo.pipeline import run_demo

    out = tmp_path / "run"
    shutil.copytree(smoke_run, out)
    before = json.loads((out / "summary.json").read_text())
    sft_bytes = (out / "sft" / "policy" / "model.safetensors").read_bytes()
    first_ppo = ppo_weights(out)
    cfg = load_config(DemoConfig, out / "demo_config.yaml")
    cfg = dataclasses.replace(cfg, out_dir=str(out), compare_grpo=False, reuse_warm_start=True)
    summary = run_demo(cfg)

    assert summary["warm_start"]["reused"] is True
    assert "sft" not in summary["stages_seconds"] and "expert" not in summary["stages_seconds"]
    assert summary["warm_start"]["stages_seconds_when_trained"]["sft"] == before["stages_seconds"]["sft"]
    assert summary["num_demonstrations"] == before["num_demonstrations"]
    assert (out / "sft" / "policy" / "model.safetensors").read_bytes() == sft_bytes
    assert summary["sft"]["test"]["exact_match"] == before["sft"]["test"]["exact_match"]
    assert summary["sft"]["final_loss"] == before["sft"]["final_loss"]
    assert summary["sft"]["answer_copy_rate"] == before["sft"]["answer_copy_rate"]
    assert not (out / "grpo_trl_loop").exists()  # what followed SFT in the first run is gone
    assert_one_ppo_run_to_the_same_weights(out, first_ppo)


def test_reuse_warm_start_refuses_a_warm_start_trained_with_other_settings(smoke_run: Path) -> None:
    from searchrl.common.config import load_config
    from searchrl.demo.configs import DemoConfig
    from searchrl.demo.reuse import find_warm_start

    cfg = load_config(DemoConfig, smoke_run / "demo_config.yaml")
    same, why = find_warm_start(dataclasses.replace(cfg, num_threads=1, test_questions=3), smoke_run)
    assert same is not None and why == ""
    recorded = json.loads((smoke_run / "summary.json").read_text())["sft"]["answer_copy_rate"]
    assert same.answer_copy_rate == recorded is not None  # read back, not measured again on 16k demos
    other_sft = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, learning_rate=1e-4))
    assert find_warm_start(other_sft, smoke_run) == (None, f"{smoke_run / 'demo_config.yaml'} trained its "
                                                    "warm start with other settings: sft")  # fmt: skip
    found, why = find_warm_start(cfg, smoke_run / "nowhere")
    assert found is None and "no finished warm start" in why and "sft/policy" in why


def test_demo_refuses_mismatched_expert_and_search_depth_before_writing_anything(tmp_path: Path) -> None:
    from searchrl.common.config import ConfigError
    from searchrl.demo.configs import smoke_config
    from searchrl.demo.pipeline import run_demo

    out = tmp_path / "run"
    cfg = smoke_config(out_dir=str(out))
    cfg.expert = dataclasses.replace(cfg.expert, k=cfg.environment.topk + 2)
    with pytest.raises(ConfigError, match="set them equal"):
        run_demo(cfg)
    assert not out.exists()


def test_a_partial_section_in_a_demo_yaml_keeps_the_demo_s_other_settings(tmp_path: Path) -> None:
    """`sft: {trl_loss: false}` changes that one field; the rest stays the demo's, not the class defaults."""
    from searchrl.common.config import ConfigError, load_config
    from searchrl.demo.configs import DemoConfig

    path = tmp_path / "demo.yaml"
    path.write_text("sft:\n  trl_loss: false\nppo:\n  kl_coef: 0.1\nexpert:\n  noise: 0.3\n")
    cfg = load_config(DemoConfig, path)
    demo = DemoConfig()
    assert cfg.sft.trl_loss is False and cfg.ppo.kl_coef == 0.1 and cfg.expert.noise == 0.3
    assert cfg.sft == dataclasses.replace(demo.sft, trl_loss=False)
    assert cfg.ppo == dataclasses.replace(demo.ppo, kl_coef=0.1)
    assert cfg.expert == dataclasses.replace(demo.expert, noise=0.3)
    assert cfg.model == demo.model
    # Dotted overrides complete the section the same way; a typo inside it is still named.
    assert load_config(DemoConfig, None, {"sft.max_steps": 7}).sft == dataclasses.replace(
        demo.sft, max_steps=7
    )
    with pytest.raises(ConfigError, match="did you mean 'trl_loss'"):
        load_config(DemoConfig, None, {"sft.trl_los": False})


# The demo's stage settings as they were before the demo config was made of sections (PPOConfig's flat
# `ppo:` with the environment and sampling inside): one value each, pinned so the shipped demo stays the same.
DEMO_PPO_STAGE = {
    "output_dir": "runs/demo/ppo",
    "seed": 0,
    "protocol": "chat",
    "topk": 1,
    "max_turns": 4,
    "max_tool_calls": 3,
    "max_observation_tokens": 96,
    "citation_style": "number",
    "system_prompt": "Answer the question; search with tool calls.",
    "tool_schema_in_prompt": False,
    "search_timeout_s": 5.0,
    "max_new_tokens_per_turn": 40,
    "max_episode_tokens": 400,
    "temperature": 1.0,
    "eval_temperature": 0.01,
    "top_p": 1.0,
    "top_k": 0,
    "kl_coef": 0.02,
    "kl_estimator": "k1",
    "learning_rate": 3e-5,
    "value_learning_rate": 1e-3,
    "value_lam": 1.0,
    "cliprange_value": None,
    "value_replay_steps": 2,
    "value_mode": "separate",
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 2,
    "num_mini_batches": 2,
    "num_ppo_epochs": 2,
    "total_episodes": 640,
    "save_steps": 10,
    "eval_steps": 5,
    "eval_on_start": True,
    "num_eval_questions": 32,
    "collapse_guard": True,
    "progress_bar": True,
    "report_to": ["none"],
    "cliprange": 0.2,
    "vf_coef": 0.1,
    "lam": 0.95,
    "lr_scheduler_type": "linear",
    "max_grad_norm": 1.0,
}
SMOKE_CHANGES = {
    "output_dir": "runs/demo-smoke/ppo",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_mini_batches": 1,
    "num_ppo_epochs": 1,
    "total_episodes": 16,
    "max_new_tokens_per_turn": 32,
    "max_episode_tokens": 300,
    "save_steps": 1,
    "eval_steps": 1,
    "num_eval_questions": 8,
    "collapse_guard": False,
}


@pytest.mark.parametrize("which", ["demo", "smoke"])
def test_the_demo_stages_keep_their_settings(which: str) -> None:
    """The PPO stage, the environment of every stage, the expert and SFT: the values the demo always had."""
    from searchrl.demo.configs import DemoConfig, smoke_config
    from searchrl.env.config import EnvConfig

    cfg = DemoConfig() if which == "demo" else smoke_config()
    expected = DEMO_PPO_STAGE if which == "demo" else {**DEMO_PPO_STAGE, **SMOKE_CHANGES}
    stage = cfg.ppo_config()
    assert {name: getattr(stage, name) for name in expected} == expected
    assert (
        cfg.environment.env_config()
        == stage.env_config()
        == EnvConfig(
            protocol="chat",
            max_turns=4,
            max_tool_calls=3,
            max_episode_tokens=expected["max_episode_tokens"],
            max_observation_tokens=96,
            topk=1,
            search_timeout_s=5.0,
            system_prompt="Answer the question; search with tool calls.",
            tool_schema_in_prompt=False,
            citation_style="number",
        )
    )
    assert (cfg.expert.noise, cfg.expert.k, cfg.expert.noise_kinds) == (0.65, 1, ["one_hop"])
    if which == "demo":
        assert (cfg.sft.learning_rate, cfg.sft.max_steps, cfg.sft.per_device_train_batch_size) == (
            3e-3,
            1000,
            32,
        )
        assert (cfg.sft.first_turn_steps, cfg.sft.trl_loss, cfg.sft.bf16) == (300, False, True)


def test_a_shared_setting_under_ppo_is_refused_with_its_section(tmp_path: Path) -> None:
    """Each setting lives in one part of the demo YAML: `ppo: {max_turns: 3}` says where max_turns belongs."""
    from searchrl.common.config import ConfigError, load_config
    from searchrl.demo.configs import DemoConfig

    path = tmp_path / "demo.yaml"
    path.write_text("ppo:\n  kl_coef: 0.1\n  max_turns: 3\n")
    with pytest.raises(ConfigError, match=r"ppo: 'max_turns' is not a ppo setting; .*environment\.max_turns"):
        load_config(DemoConfig, path)
    with pytest.raises(ConfigError, match=r"'temperature' is not a ppo setting; it belongs in generation:"):
        load_config(DemoConfig, None, {"ppo.temperature": 0.5})
    cfg = load_config(DemoConfig, None, {"environment.max_turns": 3, "generation.temperature": 0.5})
    stage = cfg.ppo_config()
    assert (stage.max_turns, stage.env_config().max_turns, stage.temperature) == (3, 3, 0.5)
    assert cfg.environment == dataclasses.replace(DemoConfig().environment, max_turns=3)
