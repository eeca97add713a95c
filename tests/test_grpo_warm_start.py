"""GRPO from a warm-start directory with a PPO stage's settings (the demo's side-by-side runs).

GRPO copies the sections it shares with the `PPOConfig` (`searchrl.sections.with_sections_of`), so the checks
compare what GRPO builds with what PPO builds (environment, rollout limits, batch, budget) for the demo's real
PPO stages, then train two real steps from the warm-started tiny policy of conftest.py's `grpo_world`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from worlds import GrpoWorld

from searchrl.common.config import ConfigError, load_config
from searchrl.demo.pipeline import DemoConfig, smoke_config
from searchrl.evaluation.loop import generation_config_from_ppo
from searchrl.grpo.config import GRPORunConfig
from searchrl.grpo.trainer import generation_config_for
from searchrl.grpo.warm_start import train_grpo_from_warm_start
from searchrl.ppo.config import PPOConfig
from searchrl.rewards.combine import default_rubric
from searchrl.sections import with_sections_of


def small_ppo(**overrides: object) -> PPOConfig:
    values: dict = dict(
        seed=3,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        total_episodes=16,
        max_turns=2,
        max_tool_calls=2,
        max_new_tokens_per_turn=48,
        max_episode_tokens=200,
        max_observation_tokens=48,
        topk=1,
        tool_schema_in_prompt=False,
        temperature=1.0,
        learning_rate=1e-3,
        eval_steps=1,
        num_eval_questions=2,
        save_steps=10,
    )
    values.update(overrides)
    return PPOConfig(**values)


@pytest.mark.parametrize(
    "ppo", [DemoConfig().ppo_config(), smoke_config().ppo_config()], ids=["demo", "smoke"]
)
def test_grpo_copies_environment_limits_and_budget_from_the_ppo_stage(ppo: PPOConfig) -> None:
    cfg = with_sections_of(GRPORunConfig, ppo, mode="trl_loop")
    assert cfg.env_config() == ppo.env_config()
    assert generation_config_for(cfg) == generation_config_from_ppo(ppo)
    assert generation_config_for(cfg, temperature=cfg.eval_temperature).temperature == ppo.eval_temperature
    assert cfg.episodes_per_step == ppo.per_device_train_batch_size * ppo.gradient_accumulation_steps
    assert cfg.num_steps * cfg.episodes_per_step == ppo.total_episodes
    assert (cfg.learning_rate, cfg.eval_steps, cfg.num_eval_questions) == (
        ppo.learning_rate,
        ppo.eval_steps,
        ppo.num_eval_questions,
    )
    # The run's identity is its own: a GRPO run never writes into the PPO run's directory.
    assert cfg.output_dir == "runs/grpo" != ppo.output_dir
    # A change on the PPO side reaches GRPO's environment: one declaration, not two copies of it.
    changed = dataclasses.replace(
        ppo, topk=ppo.topk + 1, max_observation_tokens=77, system_prompt="Search first."
    )
    assert with_sections_of(GRPORunConfig, changed).env_config() == changed.env_config()


def test_bad_derivations_say_what_is_wrong() -> None:
    with pytest.raises(ConfigError, match=r"\['num_generation'\] are not GRPORunConfig fields"):
        with_sections_of(GRPORunConfig, small_ppo(), num_generation=4)
    with pytest.raises(ConfigError, match="num_generations=3 must divide"):
        with_sections_of(GRPORunConfig, small_ppo(), num_generations=3)
    with pytest.raises(ConfigError, match="needs mode: our_rollout"):
        with_sections_of(GRPORunConfig, small_ppo(protocol="search_r1"), mode="trl_loop")
    # Two sources of one section cannot silently disagree.
    with pytest.raises(ConfigError, match="is given by both PPOConfig and EnvironmentSection"):
        with_sections_of(PPOConfig, small_ppo(), DemoConfig().environment)


@pytest.mark.parametrize("mode", ["trl_loop", "our_rollout"])
def test_no_search_in_ppo_is_no_search_in_grpo(mode: str) -> None:
    """PPO's `max_tool_calls: 0` (a closed-book episode in the same protocol) is a GRPO run too, in both modes."""
    ppo = small_ppo(max_tool_calls=0)
    cfg = with_sections_of(GRPORunConfig, ppo, mode=mode)
    assert cfg.max_tool_calls == 0 and cfg.env_config() == ppo.env_config()
    assert cfg.env_config().max_tool_calls == 0


def test_train_from_warm_start_with_the_ppo_settings(grpo_world: GrpoWorld, tmp_path: Path) -> None:
    ppo = small_ppo()
    run = train_grpo_from_warm_start(
        grpo_world.policy_dir,
        grpo_world.tokenizer,
        grpo_world.train_rows,
        grpo_world.dev_rows,
        grpo_world.backend,
        default_rubric(),
        mode="our_rollout",
        total_episodes=16,
        out_dir=tmp_path / "grpo",
        ppo_config=ppo,
    )
    assert run == tmp_path / "grpo"
    cfg = load_config(GRPORunConfig, run / "config.yaml")
    assert cfg.env_config() == ppo.env_config() and cfg.policy_model_path == str(grpo_world.policy_dir)
    assert (cfg.mode, cfg.num_steps, cfg.eval_on_start) == ("our_rollout", 2, True)
    evals = [json.loads((run / "eval" / f"step-{s}.json").read_text()) for s in range(3)]
    assert [e["episode"] for e in evals] == [0, 8, 16]
    assert evals[0]["time/train_s"] == pytest.approx(0.0, abs=1.0)
    assert evals[2]["time/train_s"] > evals[1]["time/train_s"] > 0
    assert all(0.0 <= e["eval/exact_match"] <= 1.0 for e in evals)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["generation_config"] == dataclasses.asdict(generation_config_from_ppo(ppo))


def test_a_folder_without_a_warm_start_is_refused(grpo_world: GrpoWorld, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no warm-start policy"):
        train_grpo_from_warm_start(
            tmp_path,
            grpo_world.tokenizer,
            grpo_world.train_rows,
            None,
            grpo_world.backend,
            default_rubric(),
            mode="trl_loop",
            total_episodes=8,
            out_dir=tmp_path / "y",
            ppo_config=small_ppo(),
        )


def test_shipped_grpo_config_matches_the_demo_ppo_stage() -> None:
    """configs/grpo_tiny.yaml (what `searchrl grpo` runs by hand) says it copies the demo's PPO stage."""
    shipped = load_config(GRPORunConfig, Path(__file__).resolve().parents[1] / "configs" / "grpo_tiny.yaml")
    ppo = dataclasses.replace(DemoConfig().ppo_config(), seed=shipped.seed)
    derived = with_sections_of(GRPORunConfig, ppo, mode=shipped.mode)
    assert shipped.env_config() == ppo.env_config()
    assert generation_config_for(shipped) == generation_config_from_ppo(ppo)
    for name in ("eval_temperature", "learning_rate", "eval_steps", "num_eval_questions", "num_steps"):
        assert getattr(shipped, name) == getattr(derived, name), name
    assert shipped.episodes_per_step == derived.episodes_per_step
