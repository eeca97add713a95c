"""Which engine a run's rollouts use (`searchrl.rollout.backends`): the run config's settings, the factory
that starts the named engine (or refuses, saying how to fix it), and the weight push after a step.

vLLM needs a GPU and the vllm package; here its generator and availability check are stand-ins that record
what the factory passed, so every branch is checked on CPU (tests/test_rollout_vllm.py runs the real one).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from searchrl.common.config import ConfigError
from searchrl.rollout import backends, vllm_generator
from searchrl.rollout.backends import RolloutBackend, check_backend, make_generator, sync_engine_weights
from searchrl.rollout.generator import GenerationConfig, HFGenerator


def _run_config(**kw: Any) -> SimpleNamespace:
    values = dict(
        rollout_backend="vllm",
        vllm_gpu_memory_utilization=0.45,
        vllm_enable_prefix_caching=False,
        seed=11,
        use_cpu=False,
    )
    return SimpleNamespace(**{**values, **kw})


class RecordingVLLM:
    """Stands in for `VLLMGenerator`: keeps what it was built with."""

    def __init__(self, policy: Any, tokenizer: Any, config: Any, **engine: Any) -> None:
        self.policy, self.tokenizer, self.config, self.engine = policy, tokenizer, config, engine


@pytest.fixture
def vllm_here(monkeypatch):
    """vLLM "available" and its generator replaced by `RecordingVLLM`."""
    monkeypatch.setattr(vllm_generator, "check_vllm_available", lambda: None)
    monkeypatch.setattr(backends, "VLLMGenerator", RecordingVLLM)


def test_the_run_configs_engine_settings():
    backend = RolloutBackend.of(_run_config(mixed_precision="bf16"), uses_deepspeed=True)
    assert backend == RolloutBackend(
        name="vllm",
        gpu_memory_utilization=0.45,
        enable_prefix_caching=False,
        seed=11,
        dtype="bfloat16",
        use_cpu=False,
        uses_deepspeed=True,
    )
    # A config that does not train in bf16 (or has no mixed_precision, like GRPO's) lets vLLM pick the dtype.
    assert RolloutBackend.of(_run_config(mixed_precision="no")).dtype == "auto"
    assert RolloutBackend.of(_run_config()).dtype == "auto"


def test_hf_is_the_default_engine_and_decodes_with_the_policy(world):
    generation = GenerationConfig(max_new_tokens_per_turn=8, max_episode_tokens=32)
    generator = make_generator(world["policy"], world["tok"], generation)
    assert type(generator) is HFGenerator
    assert generator.model is world["policy"] and generator.config is generation
    same = make_generator(world["policy"], world["tok"], generation, RolloutBackend(name="hf", use_cpu=True))
    assert type(same) is HFGenerator
    # It decodes with the policy itself: there are no weights to push after a step.
    assert sync_engine_weights(generator, world["policy"]) is False


def test_vllm_is_started_with_the_runs_settings(vllm_here):
    policy, tokenizer, generation = object(), object(), GenerationConfig()
    backend = RolloutBackend.of(_run_config(mixed_precision="bf16"))
    generator = make_generator(policy, tokenizer, generation, backend)
    assert isinstance(generator, RecordingVLLM)
    assert (generator.policy, generator.tokenizer, generator.config) == (policy, tokenizer, generation)
    assert generator.engine == {
        "gpu_memory_utilization": 0.45,
        "enable_prefix_caching": False,
        "seed": 11,
        "dtype": "bfloat16",
    }


def test_an_engine_with_its_own_weights_gets_them_pushed():
    pushed: list[Any] = []
    engine = SimpleNamespace(sync_weights=pushed.append)
    policy = object()
    assert sync_engine_weights(engine, policy) is True and pushed == [policy]


def test_an_unknown_engine_is_refused_with_the_choices():
    for name in ("tgi", "VLLM", ""):
        with pytest.raises(ConfigError, match=r"rollout_backend=.* is not one of \['hf', 'vllm'\]"):
            make_generator(object(), object(), GenerationConfig(), RolloutBackend(name=name))


def test_vllm_on_cpu_or_under_deepspeed_is_refused_with_the_fix(vllm_here):
    with pytest.raises(ConfigError, match="needs the GPU, but use_cpu is true; set use_cpu: false"):
        check_backend(RolloutBackend(name="vllm", use_cpu=True))
    with pytest.raises(ConfigError, match='not supported under DeepSpeed.*rollout_backend: "hf"'):
        make_generator(
            object(), object(), GenerationConfig(), RolloutBackend(name="vllm", uses_deepspeed=True)
        )
    check_backend(RolloutBackend(name="hf", use_cpu=True, uses_deepspeed=True))  # hf runs anywhere


def test_vllm_where_it_cannot_run_says_to_use_hf():
    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM can run here")
    with pytest.raises(ConfigError, match='rollout_backend="vllm" needs .*rollout_backend: "hf"'):
        make_generator(object(), object(), GenerationConfig(), RolloutBackend(name="vllm"))
