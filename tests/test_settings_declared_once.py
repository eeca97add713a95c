"""Each setting is declared once: the episode's (`EpisodeSettings`), the generation mapping, the SFT and
reward-model schedule (`ScheduleSection`), and every field's help (`help_text`). Fast: no model, no torch run."""

from __future__ import annotations

import dataclasses

import pytest

from searchrl.common.config import ConfigError, config_help, help_text, load_config
from searchrl.common.trl_args import ScheduleSection
from searchrl.env.config import EnvConfig, EpisodeSettings
from searchrl.grpo.config import GRPORunConfig
from searchrl.ppo.config import PPOConfig
from searchrl.rewards.reward_model import RewardModelConfig
from searchrl.sections import EnvironmentSection, GenerationSection
from searchrl.sft.pipeline import SFTRunConfig
from searchrl.sft.warm_start import SFTWarmStartConfig

# A value for every episode setting, none of them the default.
EPISODE = {
    "protocol": "search_r1",
    "tool_schema_in_prompt": False,
    "citation_style": "number",
    "system_prompt": "Search, then answer.",
    "max_turns": 6,
    "max_tool_calls": 2,
    "topk": 5,
    "search_timeout_s": 2.5,
    "max_episode_tokens": 700,
    "max_observation_tokens": 48,
}


def test_the_episode_settings_cover_every_field_they_share_by_one_name():
    assert {f.name for f in dataclasses.fields(EpisodeSettings)} == set(EPISODE)
    shared = {f.name for f in dataclasses.fields(EnvironmentSection)} & {
        f.name for f in dataclasses.fields(EnvConfig)
    }
    assert shared == set(EPISODE)  # no other field in both, so no second name for any
    section_help = {name: text for name, text, _ in config_help(EnvironmentSection)}
    env_help = {name: text for name, text, _ in config_help(EnvConfig)}
    assert all(section_help[name] == env_help[name] for name in EPISODE)


@pytest.mark.parametrize("config_class", [EnvironmentSection, PPOConfig, GRPORunConfig])
def test_env_config_copies_every_episode_setting(config_class):
    env = config_class(**EPISODE, max_new_tokens_per_turn=32).env_config()
    assert {name: getattr(env, name) for name in EPISODE} == EPISODE
    assert (env.max_topk, env.max_retries, env.allowed_tools) == (10, 1, ["search"])  # EnvConfig's own


@pytest.mark.parametrize(
    "bad",
    [
        {"max_turns": 0},
        {"max_tool_calls": -1},
        {"topk": 0},
        {"topk": 11},
        {"search_timeout_s": 0.0},
        {"max_observation_tokens": 8},
        {"citation_style": "footnote"},
    ],
)
def test_a_trainer_config_and_the_environment_refuse_a_value_with_the_same_words(bad):
    with pytest.raises(ConfigError) as from_env:
        EnvConfig(**bad)
    with pytest.raises(ConfigError) as from_section:
        EnvironmentSection(**bad)
    with pytest.raises(ConfigError) as from_ppo:
        PPOConfig(output_dir="unused", **bad)
    assert str(from_env.value) == str(from_section.value) == str(from_ppo.value)
    assert str(from_env.value).startswith(next(iter(bad)))  # named as the user wrote it


def test_a_yaml_error_names_the_file_and_the_field_the_user_wrote(tmp_path):
    flat, nested = tmp_path / "ppo.yaml", tmp_path / "sft.yaml"
    flat.write_text("search_timeout_s: 0\n")
    nested.write_text("environment:\n  max_episode_tokens: 0\n")
    with pytest.raises(ConfigError, match=rf"^{flat}: search_timeout_s: must be > 0"):
        load_config(PPOConfig, flat)
    with pytest.raises(ConfigError, match=rf"^{nested}.environment: max_episode_tokens: must be >= 1"):
        load_config(SFTRunConfig, nested)


def test_generation_config_maps_a_trainer_config_onto_the_engine():
    cfg = PPOConfig(
        output_dir="unused",
        temperature=0.5,
        eval_temperature=0.0,
        top_p=0.9,
        top_k=5,
        max_new_tokens_per_turn=32,
        max_episode_tokens=300,
        seed=7,
    )
    gen = cfg.generation_config()
    assert (gen.temperature, gen.top_p, gen.top_k) == (0.5, 0.9, 5)
    assert (gen.max_new_tokens_per_turn, gen.max_episode_tokens, gen.seed) == (32, 300, 7)
    assert cfg.generation_config(temperature=cfg.eval_temperature) == dataclasses.replace(
        gen, temperature=0.0
    )
    with pytest.raises(TypeError, match="trainer config"):
        GenerationSection().generation_config()  # a demo's generation part alone has no token limits


def test_sft_and_the_reward_model_share_one_schedule_and_keep_their_defaults():
    schedule = {f.name for f in dataclasses.fields(ScheduleSection)}
    assert schedule <= {f.name for f in dataclasses.fields(SFTWarmStartConfig)}
    assert schedule <= {f.name for f in dataclasses.fields(RewardModelConfig)}
    sft, rm = SFTWarmStartConfig(), RewardModelConfig()
    assert (sft.lr_scheduler_type, rm.lr_scheduler_type) == ("cosine", "linear")
    for name in schedule - {"lr_scheduler_type"}:
        assert getattr(sft, name) == getattr(rm, name) == getattr(ScheduleSection(), name), name
    args = SFTWarmStartConfig(warmup_ratio=0.1, seed=3).training_arguments()
    assert (args["warmup_steps"], args["seed"], args["data_seed"], args["lr_scheduler_type"]) == (
        0.1,
        3,
        3,
        "cosine",
    )


@pytest.mark.parametrize("config_class", [SFTWarmStartConfig, RewardModelConfig])
@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
        ({"max_steps": -1, "num_train_epochs": 0}, "num_train_epochs"),
        ({"warmup_ratio": 1.5}, "warmup_ratio"),
    ],
)
def test_both_schedules_refuse_the_same_values(config_class, bad, needle):
    with pytest.raises(ConfigError, match=needle):
        config_class(**bad)


@pytest.mark.parametrize(
    "config_class",
    [EpisodeSettings, EnvConfig, EnvironmentSection, ScheduleSection, SFTWarmStartConfig, RewardModelConfig],
)
def test_every_field_has_help(config_class):
    missing = [name for name, text, _ in config_help(config_class) if not text.strip()]
    assert not missing
    assert help_text("x") == {"help": "x"}
