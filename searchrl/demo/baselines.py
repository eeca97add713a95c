"""The real loop's evaluations: the base-model baselines and every later evaluation on the test split.

What: `RealGenerator` is `HFGenerator` decoding under bfloat16 autocast (optional) with a baseline's turns
forced (`searchrl.sft.forcing.baseline_forcing`, the one owner of forced turns: closed book and naive RAG force
the first turns, the zero-shot agent nothing); `real_generator_factory` hands it to `evaluate_policy` and
`PPOTrainer`. `evaluate_test_split` is the demo's measurement of a policy: greedy, the PPO stage's limits,
`eval_batch_size` questions decoded together, a summary with bootstrap intervals, per question type and the
share of well-formed tool calls. `write_eval` writes an evaluation's JSON and trajectories under `eval/`.

Why forcing for baselines: a base model that never searches tells nothing about retrieval; forcing the
question as its one search (naive RAG) measures retrieval without an agent, and forcing the answer tag with a
search engine that finds nothing (closed book) measures what it knows alone. Both run through the same
environment and limits as every other evaluation, so the figures compare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from searchrl.common.trajectory import Trajectory
from searchrl.demo.configs import RealDemoConfig
from searchrl.demo.summary import headline_group
from searchrl.env.environment import SearchEnvironment
from searchrl.evaluation.loop import evaluate_policy
from searchrl.evaluation.statistics import summarise
from searchrl.rollout.generator import GenerationConfig, HFGenerator, RolloutBatch
from searchrl.rollout.sampling import Sampling
from searchrl.run.writer import write_evaluation
from searchrl.sft.forcing import BASELINES, baseline_forcing


class RealGenerator(HFGenerator):
    """`HFGenerator` that decodes under bfloat16 autocast (optional) and forces a baseline's turns.

    `baseline`: None or "zero_shot" (the policy acts alone), "closed_book" or "naive_rag"
    (`searchrl.sft.forcing.BaselineForcing`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: GenerationConfig | None = None,
        bf16: bool = False,
        baseline: str | None = None,
        max_query_chars: int = 256,
    ) -> None:
        super().__init__(model, tokenizer, config)
        if baseline is not None and baseline not in BASELINES:
            raise ValueError(f"baseline {baseline!r}: choose one of {list(BASELINES)} or None")
        self.bf16 = bf16
        self.baseline = None if baseline == "zero_shot" else baseline
        self.max_query_chars = max_query_chars

    def rollout(
        self, envs: list[Any], rows: list[dict[str, Any]], sampling: Sampling | None = None
    ) -> RolloutBatch:
        """One episode per (env, row), the baseline's turns forced, under bfloat16 autocast if asked."""
        self.forcing = baseline_forcing(self.baseline, self.tokenizer, envs, rows, self.max_query_chars)
        device = next(self.model.parameters()).device.type if self.model is not None else "cpu"
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=self.bf16):
            return super().rollout(envs, rows, sampling)


def real_generator_factory(
    bf16: bool, baseline: str | None = None, max_query_chars: int = 256
) -> Callable[[Any, Any, GenerationConfig], RealGenerator]:
    """`(model, tokenizer, config) -> RealGenerator`, the shape `evaluate_policy` and `PPOTrainer` take."""

    def make(model: Any, tokenizer: Any, config: GenerationConfig) -> RealGenerator:
        return RealGenerator(
            model, tokenizer, config, bf16=bf16, baseline=baseline, max_query_chars=max_query_chars
        )

    return make


def evaluate_test_split(
    policy: Any,
    tok: Any,
    rows: list[dict[str, Any]],
    env_factory: Callable[[], SearchEnvironment],
    cfg: RealDemoConfig,
    rubric: Any,
    baseline: str | None,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Greedy, the PPO stage's limits, `eval_batch_size` questions a batch (`progress(n)` after each); the
    summary with bootstrap CIs, per question type and the share of well-formed calls."""
    gen_cfg = dataclasses.replace(cfg.ppo_config().generation_config(), seed=cfg.seed)
    result = evaluate_policy(
        policy,
        tok,
        rows,
        env_factory,
        gen_cfg,
        rubric=rubric,
        batch_size=cfg.eval_batch_size,
        seed=cfg.seed,
        generator_factory=real_generator_factory(cfg.bf16_rollouts, baseline, cfg.expert.max_query_chars),
        progress=progress,
    )
    trajs = list(result.trajectories)
    types = {str(r["id"]): str(r.get("type", "unknown")) for r in rows}
    for t in trajs:
        t.metadata["type"] = types.get(t.question_id, "unknown")
    summary = summarise(trajs, seed=cfg.seed)
    summary["by_type"] = {
        kind: headline_group(summarise([t for t in trajs if t.metadata["type"] == kind], seed=cfg.seed))
        for kind in sorted({t.metadata["type"] for t in trajs})
    }
    summary["well_formed_calls"] = well_formed_call_share(trajs)
    return summary, trajs


def well_formed_call_share(trajs: Sequence[Trajectory]) -> float | None:
    """Share of tool calls that parsed and validated (not malformed / bad arguments); None without calls."""
    calls = [c for t in trajs for c in t.tool_calls]
    if not calls:
        return None
    bad = {"malformed", "invalid_arguments", "unknown_tool"}
    return sum(c.status not in bad for c in calls) / len(calls)


def write_eval(out: Path, name: str, summary: dict[str, Any], trajs: list[Trajectory], extra: dict) -> None:
    """`out/eval/NAME.json` (the summary after `extra`, e.g. stage and split) and its trajectories beside it,
    through the run writer (`write_evaluation`)."""
    write_evaluation(out / "eval" / f"{name}.json", {**extra, **summary}, trajs)
