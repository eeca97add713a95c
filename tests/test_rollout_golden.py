"""Rollouts pinned token for token: every engine of the turn loop against a recorded fixture.

`tests/fixtures/rollout_golden.json` holds what the rollout produced for a fixed world (conftest.py's
`rollout_world`: the tiny tokenizer and model, the Varnholt BM25 index) and fixed seeds: token ids, action
masks, logprobs, spans, messages, tool calls, terminations and the model-token counters, for the HF KV-cache
engine (scripted, free sampling with filters, greedy, search_r1, heavy cache compaction), model-free replay,
and `VLLMGenerator` over `HFTokenEngine`; plus a sweep of episode token budgets that walks every budget edge
of a two-search episode in both protocols (where an observation stops fitting, where a turn ends the
episode). A change to the loop, an engine, the budget accounting or the template glue that moves a
single token fails here.

The fixture is CPU output of this exact world; refresh it only for a deliberate change of behaviour:

    PYTHONPATH=. python tests/test_rollout_golden.py   # rewrites tests/fixtures/rollout_golden.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # worlds.py, also when run as a script

from worlds import SCRIPTS, VARNHOLT_QA, answer, build_rollout_world, call  # noqa: E402

from searchrl.env.config import EnvConfig  # noqa: E402
from searchrl.env.environment import SearchEnvironment  # noqa: E402
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy  # noqa: E402
from searchrl.rollout.vllm_generator import HFTokenEngine, VLLMGenerator  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "rollout_golden.json"
LOGPROB_TOL = 1e-5
# Counters that measure the rollout's work, not the clock (wall and search seconds change run to run).
PINNED_STATS = (
    "rollout/model_tokens",
    "rollout/model_real_tokens",
    "rollout/tokens",
    "rollout/action_tokens",
    "rollout/engine_calls",
    "rollout/prefix_cache_hit_rate",
    "rollout/dropped_engine_tokens",
)


# A scripted first search, then the model's own tokens: free decoding over observations in the cache.
OPENINGS = [[call("Varnholt province")], [call("Orlenn")], [], [call("Amsel Drov")], [call("Tiberk")], []]
R1_SCRIPTS = [
    ["<search>Varnholt province</search>", answer("Quessa", "d1")],
    ["<search>capital of Quessa</search>", "<search>Orlenn founded</search>", answer("Amsel Drov", "d3")],
    ["<search>Tiberk</search>"],
]
TWO_SEARCHES = [call("capital of Quessa"), call("Orlenn founded"), answer("Amsel Drov", "d3")]
R1_TWO_SEARCHES = [
    "<search>capital of Quessa</search>",
    "<search>Orlenn founded</search>",
    answer("Amsel Drov", "d3"),
]


def envs_for(world: dict[str, Any], n: int, **cfg: Any) -> list[SearchEnvironment]:
    cfg.setdefault("system_prompt", "Answer with search.")
    return [SearchEnvironment(world["backend"], EnvConfig(**cfg), tokenizer=world["tok"]) for _ in range(n)]


def rows_for(n: int) -> list[dict]:
    return [VARNHOLT_QA[i % len(VARNHOLT_QA)] for i in range(n)]


def describe(batch: Any, full: bool = True) -> dict[str, Any]:
    trajs = []
    for t in batch.trajectories:
        item = {
            "termination": t.termination,
            "num_turns": t.num_turns,
            "length": len(t.input_ids),
            "tool_calls": [[c.name, c.arguments, c.status, c.doc_ids] for c in t.tool_calls],
            "retrieved": sorted(t.retrieved),
            # Documents the environment counts as retrieved although no inserted observation showed them.
            "unseen": sorted(d for d in t.retrieved if f"(id: {d}" not in "".join(t.observations)),
            "answer": t.answer,
            "citations": t.citations,
        }
        if full:
            item |= {
                "input_ids": t.input_ids,
                "action_mask": t.action_mask,
                "logprobs": t.logprobs,
                "spans": [[s.kind, s.start, s.end, s.text] for s in t.spans],
                "messages": t.messages,
                "observations": t.observations,
                "metadata": {k: v for k, v in t.metadata.items() if k != "tools"},
            }
        trajs.append(item)
    stats = {k: batch.stats[k] for k in PINNED_STATS if k in batch.stats}
    return {"trajectories": trajs, "stats": stats} if full else {"trajectories": trajs}


def hf(world, scripts, protocol="chat", model=True, env_cfg=None, **gen) -> Any:
    gen.setdefault("max_new_tokens_per_turn", 40)
    gen.setdefault("max_episode_tokens", 1500)
    forcing = ScriptedPolicy(world["tok"], scripts, append_eos=(protocol == "chat")) if any(scripts) else None
    generator = HFGenerator(world["model"] if model else None, world["tok"], GenerationConfig(**gen), forcing)
    n = len(scripts)
    return generator.rollout(envs_for(world, n, protocol=protocol, **(env_cfg or {})), rows_for(n))


def vllm(world, scripts, **gen) -> Any:
    gen.setdefault("max_new_tokens_per_turn", 40)
    gen.setdefault("max_episode_tokens", 1500)
    forcing = ScriptedPolicy(world["tok"], scripts) if any(scripts) else None
    engine = HFTokenEngine(world["model"], world["tok"], forcing=forcing)
    generator = VLLMGenerator(world["model"], world["tok"], GenerationConfig(**gen), engine=engine)
    n = len(scripts)
    return generator.rollout(envs_for(world, n), rows_for(n))


def budget_sweep(world, script, protocol) -> list[dict[str, Any]]:
    """Model-free replays of one episode under every budget from too small to ample (the PPO wiring:
    the environment's max_episode_tokens equals the rollout's max_episode_tokens)."""
    out = []
    for budget in range(10, 330, 1):
        batch = hf(
            world,
            [script],
            protocol=protocol,
            model=False,
            env_cfg={"max_episode_tokens": budget},
            max_episode_tokens=budget,
        )
        out.append({"budget": budget, **describe(batch, full=False)["trajectories"][0]})
    return out


def record(world: dict[str, Any]) -> dict[str, Any]:
    return {
        "hf_chat_scripted": describe(hf(world, SCRIPTS, temperature=1.0)),
        "hf_chat_free_filtered": describe(
            hf(world, OPENINGS, temperature=0.8, top_k=40, top_p=0.9, seed=11, max_new_tokens_per_turn=24)
        ),
        "hf_chat_greedy_compacting": describe(
            hf(world, OPENINGS, temperature=0.0, compact_pad_fraction=0.05, share_prompt_prefill=False)
        ),
        "hf_search_r1": describe(hf(world, R1_SCRIPTS, protocol="search_r1", temperature=0.7, seed=3)),
        "replay_chat": describe(hf(world, SCRIPTS, model=False)),
        "vllm_hf_engine": describe(
            vllm(world, OPENINGS, temperature=1.0, seed=5, max_new_tokens_per_turn=24)
        ),
        "budget_sweep_chat": budget_sweep(world, TWO_SEARCHES, "chat"),
        "budget_sweep_search_r1": budget_sweep(world, R1_TWO_SEARCHES, "search_r1"),
    }


@pytest.fixture(scope="module")
def recorded(rollout_world: dict[str, Any]) -> dict[str, Any]:
    return record(rollout_world)


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


SCENARIOS = [
    "hf_chat_scripted",
    "hf_chat_free_filtered",
    "hf_chat_greedy_compacting",
    "hf_search_r1",
    "replay_chat",
    "vllm_hf_engine",
]


@pytest.mark.parametrize("name", SCENARIOS)
def test_rollouts_equal_the_recorded_ones_token_for_token(recorded, golden, name) -> None:
    got, want = recorded[name], golden[name]
    assert len(got["trajectories"]) == len(want["trajectories"])
    for i, (a, b) in enumerate(zip(got["trajectories"], want["trajectories"], strict=True)):
        a, b = dict(a), dict(b)
        lp_a, lp_b = a.pop("logprobs"), b.pop("logprobs")
        for key in b:
            assert a[key] == b[key], f"{name} row {i}: {key} differs"
        gap = max((abs(x - y) for x, y in zip(lp_a, lp_b, strict=True) if x != y), default=0.0)
        assert gap <= LOGPROB_TOL, f"{name} row {i}: logprobs differ by {gap}"
    assert got["stats"] == pytest.approx(want["stats"]), name


@pytest.mark.parametrize("name", ["budget_sweep_chat", "budget_sweep_search_r1"])
def test_every_token_budget_ends_the_episode_where_it_did(recorded, golden, name) -> None:
    want = {row["budget"]: row for row in golden[name]}
    for row in recorded[name]:
        assert row == want[row["budget"]], f"{name}: budget {row['budget']}"
    # The sweep crosses real edges: episodes cut by the budget, and the whole episode at the top.
    terminations = {row["termination"] for row in recorded[name]}
    assert {"token_budget", "answered"} <= terminations
    # However the budget cuts, the environment's record holds only what the policy was shown.
    assert all(row["unseen"] == [] for row in recorded[name])


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        data = record(build_rollout_world(Path(tmp)))
    FIXTURE.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size // 1024} KiB)")
