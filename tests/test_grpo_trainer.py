"""GRPO through TRL 1.16's GRPOTrainer, both modes, on the tiny model with a real BM25 index.

The policy is warm-started in the `grpo_world` fixture (conftest.py, `worlds.build_grpo_world`: a hundred
supervised steps on expert episodes that went through the real engine and environment), so that sampled
rollouts really search: without it an untrained model never calls the tool and the observation-mask checks
would check nothing.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from worlds import TINY_ONE_LAYER, GrpoWorld, grpo_config

from searchrl.common.config import ConfigError, load_config
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_tool_call
from searchrl.grpo.config import GRPORunConfig
from searchrl.grpo.trainer import build_grpo_trainer
from searchrl.grpo.trl_loop import spans_from_mask, tool_env_factory, unexecuted_call_records
from searchrl.models.forward_patches import shares_storage
from searchrl.models.io import load_policy
from searchrl.models.tiny import build_policy
from searchrl.rollout.chat import prompt_ids

REPO = Path(__file__).resolve().parents[1]


def train_mode(world: GrpoWorld, mode: str, **overrides: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    cfg = grpo_config(world.root, mode, **overrides)
    policy = load_policy(world.policy_dir).train()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = build_grpo_trainer(
        cfg, policy, world.tokenizer, world.backend, world.train_rows, world.dev_rows
    )
    trainer.train()
    return trainer, before


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def read_trajectories(run: Path) -> list[dict]:
    out = []
    for path in sorted((run / "trajectories").glob("step-*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            out.extend(json.loads(line) for line in f)
    return out


def assert_parameters_changed(trainer: Any, before: dict[str, torch.Tensor]) -> None:
    after = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    changed = [n for n, p in after.items() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before), f"unchanged: {sorted(set(before) - set(changed))[:5]}"


def assert_run_directory(run: Path, mode: str, steps: int) -> list[dict]:
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["trainer"] == "grpo" and manifest["mode"] == mode
    assert manifest["versions"]["trl"].startswith("1.16")
    assert load_config(GRPORunConfig, run / "config.yaml").mode == mode
    metrics = [m for m in read_metrics(run) if "loss" in m]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert [m["episode"] for m in metrics] == [8 * s for s in range(1, steps + 1)]
    assert all(m["time/train_s"] > 0 for m in metrics)
    # The environment's tool statistics are logged every step, from our records.
    for key in (
        "tools/calls",
        "tools/calls_per_episode",
        "tools/failures",
        "tools/failure_rate",
        "reward/f1",
    ):
        assert all(key in m for m in metrics), key
    assert sum(m["tools/calls"] for m in metrics) > 0, "the warm-started policy never searched"
    evaluation = json.loads((run / "eval" / f"step-{steps}.json").read_text())
    assert evaluation["step"] == steps and 0.0 <= evaluation["eval/exact_match"] <= 1.0
    assert evaluation["episode"] == 8 * steps and "eval/f1" in evaluation
    assert (run / "checkpoints" / f"step-{steps}" / "policy" / "config.json").is_file()
    return metrics


def test_our_rollout_mode_trains_with_env_mask_zero_on_observations(grpo_world: GrpoWorld) -> None:
    trainer, before = train_mode(grpo_world, "our_rollout")
    assert_parameters_changed(trainer, before)
    run = Path(trainer.run.root)
    metrics = assert_run_directory(run, "our_rollout", steps=2)
    # What TRL received as env_mask (its tool_mask) is the trajectory's action mask after the prompt.
    gen = trainer.record.generation
    assert gen is not None and gen.training
    assert gen.tool_mask is not None and len(gen.tool_mask) == len(trainer.record.rows) == 8
    last_step = [t for t in read_trajectories(run) if t["metadata"]["step"] == 2]
    observed = 0
    for mask, ids, traj in zip(gen.tool_mask, gen.completion_ids, last_step, strict=True):
        start = traj["prompt_length"]
        assert list(mask) == traj["action_mask"][start:]
        assert list(ids) == traj["input_ids"][start:]
        for span in traj["spans"]:
            if span["kind"] == "observation":
                observed += span["end"] - span["start"]
                assert set(mask[span["start"] - start : span["end"] - start]) == {0}
            if span["kind"] == "action":
                assert set(mask[span["start"] - start : span["end"] - start]) == {1}
    all_trajs = read_trajectories(run)
    observed += sum(
        s["end"] - s["start"] for t in all_trajs for s in t["spans"] if s["kind"] == "observation"
    )
    assert observed > 0, "no observation tokens at all: the masks were never tested"
    # Every observation token of every step is masked, and the trajectories' tool records match the log.
    for step in (1, 2):
        trajs = [t for t in all_trajs if t["metadata"]["step"] == step]
        calls = sum(len(t["tool_calls"]) for t in trajs)
        assert metrics[step - 1]["tools/calls"] == calls
        for t in trajs:
            for span in t["spans"]:
                if span["kind"] == "observation":
                    assert not any(t["action_mask"][span["start"] : span["end"]])


def test_trl_loop_mode_trains_through_trls_tool_loop(grpo_world: GrpoWorld) -> None:
    trainer, before = train_mode(grpo_world, "trl_loop")
    assert_parameters_changed(trainer, before)
    run = Path(trainer.run.root)
    metrics = assert_run_directory(run, "trl_loop", steps=2)
    # TRL's own counter and ours agree, except that we also count the <tool_call> blocks TRL's parser
    # rejected (our environment records them as malformed): its loop really called our environment.
    for m in metrics:
        trl_calls, our_calls = m["tools/call_frequency"] * 8, m["tools/calls_per_episode"] * 8
        assert our_calls >= trl_calls - 1e-6
        assert our_calls - trl_calls <= m["tools/failures/malformed"] + 1e-6
    tok = grpo_world.tokenizer
    # TRL rendered the compact prompt exactly as our engine does (no tool section in either).
    ours = SearchEnvironment(
        grpo_world.backend, grpo_config(grpo_world.root, "trl_loop").env_config(), tokenizer=tok
    )
    assert ours.tools == []
    for row, ids in zip(trainer.record.rows, trainer.record.generation.prompt_ids, strict=True):
        assert list(ids) == prompt_ids(tok, ours.reset(row), ours.tools)
    searched = 0
    for traj in read_trajectories(run):
        mask = traj["action_mask"]
        start = traj["prompt_length"]
        observation_text = tok.decode(
            [i for i, m in zip(traj["input_ids"][start:], mask[start:], strict=True) if m == 0]
        )
        action_text = tok.decode(
            [i for i, m in zip(traj["input_ids"][start:], mask[start:], strict=True) if m == 1]
        )
        assert "<tool_response>" not in action_text
        for record in traj["tool_calls"]:
            searched += record["status"] == "ok"
            # The search results TRL inserted are masked out: each retrieved id appears in masked tokens.
            assert all(f"(id: {doc})" in observation_text for doc in record["doc_ids"])
        if any(r["status"] != "malformed" for r in traj["tool_calls"]):  # a call that got a tool message
            assert "<tool_response>" in observation_text
    assert searched > 0, "no search reached the index through TRL's loop"


class CountingBackend:
    """The world's index, counting the searches that reach it."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.fingerprint, self.searches = backend, backend.fingerprint, 0

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        self.searches += len(queries)
        return self.backend.search(queries, k)


@pytest.mark.parametrize("mode", ["trl_loop", "our_rollout"])
def test_max_tool_calls_zero_is_no_search_in_both_modes(grpo_world: GrpoWorld, mode: str) -> None:
    """PPO's `max_tool_calls: 0` (closed book in the same protocol) trains in GRPO too: the calls the policy
    makes get an error observation (over budget, or what was malformed), and no search reaches the index."""
    backend = CountingBackend(grpo_world.backend)
    run = grpo_world.root / f"nosearch-{mode}"
    cfg = grpo_config(grpo_world.root, mode, max_tool_calls=0, max_steps=1, output_dir=str(run))
    policy = load_policy(grpo_world.policy_dir).train()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = build_grpo_trainer(cfg, policy, grpo_world.tokenizer, backend, grpo_world.train_rows)
    trainer.train()
    assert_parameters_changed(trainer, before)
    calls = [r for t in read_trajectories(run) for r in t["tool_calls"]]
    assert calls, "the warm-started policy never tried to search"
    assert all(r["status"] != "ok" and not r["doc_ids"] for r in calls)
    assert backend.searches == 0
    # The tool TRL's loop calls, and our engine's environment, answer a well-formed search with "over budget".
    tool = tool_env_factory(backend, cfg.env_config(), grpo_world.tokenizer)()
    tool.reset(**grpo_world.train_rows[0])
    assert "budget" in tool.search(query=grpo_world.train_rows[0]["question"])
    assert tool.environment.records[-1].status == "over_budget"
    env = SearchEnvironment(backend, cfg.env_config(), tokenizer=grpo_world.tokenizer)
    env.reset(dict(grpo_world.train_rows[0]))
    step = env.step(format_tool_call("search", {"query": grpo_world.train_rows[0]["question"]}))
    assert [r.status for r in step.records] == ["over_budget"] and backend.searches == 0


def test_both_modes_show_the_policy_the_same_prompt_tokens(grpo_world: GrpoWorld) -> None:
    """TRL's loop renders `search` from a method's docstring; ours from the environment: same tokens."""
    cfg = grpo_config(grpo_world.root, "trl_loop", tool_schema_in_prompt=True)
    env_config = cfg.env_config()
    env = tool_env_factory(grpo_world.backend, env_config, grpo_world.tokenizer)()
    from transformers.utils import get_json_schema

    ours = SearchEnvironment(grpo_world.backend, env_config, tokenizer=grpo_world.tokenizer)
    assert [get_json_schema(env.search)] == ours.tools
    messages = ours.reset(dict(grpo_world.train_rows[0]))
    theirs = grpo_world.tokenizer.apply_chat_template(
        messages, tools=[env.search], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert list(theirs) == prompt_ids(grpo_world.tokenizer, messages, ours.tools)
    env.reset(prompt=messages, **grpo_world.train_rows[0])
    assert env.search(query=grpo_world.train_rows[0]["question"], k=1).startswith("[1] (id: ")
    assert env.environment.records[-1].status == "ok" and len(env.environment.records[-1].doc_ids) == 1


def test_reference_model_must_be_reloadable_when_beta_is_positive(grpo_world: GrpoWorld) -> None:
    cfg = grpo_config(grpo_world.root, "our_rollout", beta=0.04)
    in_memory = build_policy(grpo_world.tokenizer, TINY_ONE_LAYER)
    with pytest.raises(ConfigError, match="config._name_or_path"):
        build_grpo_trainer(cfg, in_memory, grpo_world.tokenizer, grpo_world.backend, grpo_world.train_rows)


def test_reference_model_must_hold_the_policys_weights_when_beta_is_positive(grpo_world: GrpoWorld) -> None:
    """A policy changed in memory after it was loaded (an in-process SFT) would be regularised towards the
    stale weights TRL reloads from its directory: refused. The unchanged policy gets an equal, separate copy."""
    cfg = grpo_config(grpo_world.root, "our_rollout", beta=0.04)
    policy = load_policy(grpo_world.policy_dir).train()
    trainer = build_grpo_trainer(cfg, policy, grpo_world.tokenizer, grpo_world.backend, grpo_world.train_rows)
    ref = trainer.accelerator.unwrap_model(trainer.ref_model)
    assert not shares_storage(ref, policy)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), policy.parameters(), strict=True))
    moved = load_policy(grpo_world.policy_dir).train()
    with torch.no_grad():
        next(moved.parameters()).add_(0.01)
    with pytest.raises(ConfigError, match="has other weights"):
        build_grpo_trainer(cfg, moved, grpo_world.tokenizer, grpo_world.backend, grpo_world.train_rows)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_generations": 1}, "at least 2"),
        ({"num_generations": 3}, "must divide"),
        ({"mode": "verl"}, "mode"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"temperature": 0.0}, "temperature"),
        ({"index_dir": "a", "search_url": "http://127.0.0.1:1"}, "not both"),
    ],
)
def test_bad_configs_say_what_is_wrong(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(GRPORunConfig, REPO / "configs" / "grpo_tiny.yaml", overrides)


def test_config_maps_onto_trls_grpo_config_for_cpu() -> None:
    cfg = load_config(GRPORunConfig, REPO / "configs" / "grpo_tiny.yaml", {"total_episodes": 100})
    assert cfg.num_steps == 4  # ceil(100 / 32 completions per step)
    args = cfg.to_trl_args(cuda_available=False)
    assert args.bf16 is False and args.use_cpu is True and args.gradient_checkpointing is False
    assert args.max_steps == 4 and args.num_generations == 4 and args.beta == 0.0
    assert args.max_completion_length == cfg.max_episode_tokens
    assert args.max_tool_calling_iterations == cfg.max_turns - 1
    assert args.report_to in ([], "none", ["none"])


@given(st.integers(0, 20), st.lists(st.integers(0, 1), max_size=60))
def test_spans_from_mask_cover_the_completion_in_alternating_runs(
    prompt_length: int, mask: list[int]
) -> None:
    spans = spans_from_mask(prompt_length, mask)
    assert spans[0].kind == "prompt" and (spans[0].start, spans[0].end) == (0, prompt_length)
    rest = spans[1:]
    assert sum(s.end - s.start for s in rest) == len(mask)
    position = prompt_length
    for previous, span in zip([None, *rest], rest, strict=False):
        assert span.start == position and span.end > span.start
        values = set(mask[span.start - prompt_length : span.end - prompt_length])
        assert values == ({1} if span.kind == "action" else {0})
        if previous is not None:
            assert previous.kind != span.kind
        position = span.end


def test_calls_trl_never_ran_are_scored_as_our_environment_would_record_them() -> None:
    completion = [
        {"role": "assistant", "content": '<tool_call>\n{"name": "search", "arguments": [1]}\n</tool_call>'},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "search", "arguments": {}}}],
        },
        {
            "role": "tool",
            "name": "search",
            "content": "{'error': \"search() got an unexpected keyword 'q'\"}",
        },
        {"role": "tool", "name": "search", "content": "[1] (id: d1) Paris"},
        {"role": "assistant", "content": "<answer>Paris [d1]</answer>"},
    ]
    records = unexecuted_call_records(completion)
    assert [(r.status, r.turn_index) for r in records] == [("malformed", 0), ("invalid_arguments", 1)]
    assert "unexpected keyword" in (records[1].error or "")
    assert unexecuted_call_records([{"role": "assistant", "content": "<answer>x</answer>"}]) == []
