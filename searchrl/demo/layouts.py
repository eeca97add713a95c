"""The demos' folder layouts: what each demo lists in its `summary.json` so the run layer can read it.

Why here: the run layer (`searchrl.run.layout`) defines the record and reads it, and knows no demo's folder
names; each demo says its own here. Both demos keep their data in `data/`, their index in `index/`, the SFT
warm start in `sft/policy` (the policy PPO starts from) and their evaluations in
`eval/<stage>-<split>[-<variant>].json` (with the run writer's trajectories beside them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from searchrl.run.layout import SPLIT_LABELS, DemoEvaluation, DemoLayout, Stage, SubRun

# The GRPO runs of `--compare-grpo` by mode: the folder is `grpo_<mode>`, the label the trainers' comparison's.
GRPO_LABELS = {"trl_loop": "GRPO (TRL loop)", "our_rollout": "GRPO (our rollout)"}
_STAGES = {"base": "base", "sft": "SFT policy", "ppo": "PPO policy", "grpo": "GRPO policy"}
# The real demo's baselines of the base model: each one's variant of the base model's test evaluation.
BASELINE_VARIANTS = {"closed_book": "closed-book", "naive_rag": "naive-rag", "zero_shot": "zero-shot"}
BASELINE_FILES = {name: f"base-test-{variant}" for name, variant in BASELINE_VARIANTS.items()}


def demo_evaluation(stage: str, split: str = "test", variant: str | None = None) -> DemoEvaluation:
    """`eval/<stage>-<split>[-<variant>].json`, named "<stage's policy> · <split>[, <variant>]"."""
    name = f"{stage}-{split}" + (f"-{variant}" if variant else "")
    label = f"{_STAGES.get(stage, stage)} · {SPLIT_LABELS.get(split, split)}"
    label += f", {variant.replace('-', ' ')}" if variant else ""
    return DemoEvaluation(f"eval/{name}.json", label, stage, split, variant)


def _layout(
    evaluations: Iterable[DemoEvaluation],
    grpo_modes: Iterable[str] = (),
    stages: Iterable[str] = ("sft", "ppo"),
) -> DemoLayout:
    modes = list(grpo_modes)
    return DemoLayout(
        sub_runs=(
            SubRun("ppo", "PPO"),
            *(SubRun(f"grpo_{mode}", GRPO_LABELS[mode]) for mode in modes),
        ),
        stages=(
            *(Stage(name, _STAGES[name]) for name in stages),
            *(Stage(f"grpo_{mode}", f"{GRPO_LABELS[mode]} policy") for mode in modes),
        ),
        evaluations=tuple(evaluations),
        initial_policy="sft/policy",
        data="data",
        index="index",
    )


def synthetic_demo_layout(compare_grpo: bool) -> DemoLayout:
    """The synthetic demo (`searchrl demo`): SFT, then PPO, each measured on the hidden test split (SFT also
    closed book); with `--compare-grpo`, the two GRPO runs beside PPO."""
    evaluations = [
        demo_evaluation("sft"),
        demo_evaluation("sft", variant="closed-book"),
        demo_evaluation("ppo"),
    ]
    return _layout(evaluations, GRPO_LABELS if compare_grpo else ())


def real_demo_layout(baselines: Iterable[str], grpo: bool = False) -> DemoLayout:
    """The real-model demo (`searchrl demo --config configs/demo_real.yaml`): the base model's baselines
    (`BASELINE_FILES`), then SFT, then PPO, each on the hidden test split; with `grpo`, the GRPO stage's run
    (`grpo/`, our rollout) and its evaluation on the same questions."""
    evaluations = [demo_evaluation("base", variant=BASELINE_VARIANTS[b]) for b in baselines]
    evaluations += [demo_evaluation("sft"), demo_evaluation("ppo")]
    if not grpo:
        return _layout(evaluations, stages=("sft", "ppo"))
    layout = _layout([*evaluations, demo_evaluation("grpo")], stages=("sft", "ppo", "grpo"))
    return dataclasses.replace(
        layout, sub_runs=(*layout.sub_runs, SubRun("grpo", GRPO_LABELS["our_rollout"]))
    )


def support_demo_layout(splits: Iterable[str] = ("dev", "test")) -> DemoLayout:
    """The customer-service demo (`searchrl demo --task support`): SFT, then PPO, each measured on the dev split
    and on the hidden test split."""
    evaluations = [demo_evaluation(stage, split) for stage in ("sft", "ppo") for split in splits]
    return _layout(evaluations, stages=("sft", "ppo"))
