"""A rubric: a weighted list of reward functions that gives PPO one scalar and people a breakdown.

PPO treats the reward as a number from the environment, so a reward function is any
`Callable[[Trajectory], float]`. `Rubric` sums `weight * value` over the functions with a non-zero
weight; functions with weight 0 are metrics: computed, stored and logged, never optimised (the verifiers
"rubric" idea). `Rubric.score` writes the scalar to `traj.reward` and the breakdown to
`traj.reward_breakdown`:

- `breakdown[name]` is the weighted contribution of a rewarded function, so these entries sum to
  `traj.reward` exactly;
- `breakdown["metric/" + name]` is the raw value of a zero-weight function.

Rubrics come from YAML (`load_rubric(path)`), naming built-in functions from `REWARD_FUNCTIONS`, a plain
dict from name to a dataclass whose fields are the function's parameters. Other modules (a reward-model
scorer, a model judge) add themselves to that dict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.common.config import ConfigError, load_config
from searchrl.common.trajectory import Trajectory
from searchrl.rewards.citation import CitationReward, FabricationCount
from searchrl.rewards.qa import ContainsReward, ExactMatchReward, F1Reward
from searchrl.rewards.retrieval import RetrievalReward, StagedReward
from searchrl.rewards.shaping import (
    AnswerLengthPenalty,
    FormatReward,
    PermissionDeniedPenalty,
    SafetyPenalty,
    SearchCost,
    SearchCount,
    TokenCost,
)

RewardFunc = Callable[[Trajectory], float]

METRIC_PREFIX = "metric/"


def model_judge(**params: Any) -> RewardFunc:
    """`ModelJudgeReward(**params)`: params model_path_or_model (a local dir), max_length, squash, max_docs."""
    from searchrl.rewards.judge import ModelJudgeReward  # torch: only a rubric that names a judge loads it

    return ModelJudgeReward(**params)


# name in YAML -> factory taking the function's parameters as keyword arguments.
REWARD_FUNCTIONS: dict[str, Callable[..., RewardFunc]] = {
    "exact_match": ExactMatchReward,
    "f1": F1Reward,
    "contains": ContainsReward,
    "citation": CitationReward,
    "fabrications": FabricationCount,
    "format": FormatReward,
    "search_cost": SearchCost,
    "token_cost": TokenCost,
    "safety": SafetyPenalty,
    "permission_denied": PermissionDeniedPenalty,
    "answer_length": AnswerLengthPenalty,
    "num_searches": SearchCount,
    "retrieval": RetrievalReward,
    "staged": StagedReward,
    "model_judge": model_judge,
}


@dataclass(frozen=True)
class RewardSpec:
    """One entry of a rubric: a name for the breakdown, the function and its weight (0 = metric only)."""

    name: str
    func: RewardFunc
    weight: float = 1.0


class Rubric:
    """Weighted sum of reward functions with a per-component breakdown. See the module docstring."""

    def __init__(self, specs: Sequence[RewardSpec]):
        names = [s.name for s in specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"reward names must be unique, repeated: {duplicates}; give each term its own name"
            )
        for s in specs:
            if not math.isfinite(s.weight):
                raise ValueError(f"reward {s.name!r}: weight must be a finite number, got {s.weight}")
        self.specs = list(specs)

    @property
    def reward_names(self) -> list[str]:
        return [s.name for s in self.specs if s.weight != 0]

    @property
    def metric_names(self) -> list[str]:
        return [s.name for s in self.specs if s.weight == 0]

    def evaluate(self, traj: Trajectory) -> tuple[float, dict[str, float]]:
        """(total, breakdown) without touching the trajectory."""
        total = 0.0
        breakdown: dict[str, float] = {}
        for spec in self.specs:
            value = float(spec.func(traj))
            if not math.isfinite(value):
                raise ValueError(
                    f"reward {spec.name!r} returned {value} for trajectory {traj.id}; rewards must be finite"
                )
            if spec.weight == 0:
                breakdown[METRIC_PREFIX + spec.name] = value
            else:
                contribution = spec.weight * value
                breakdown[spec.name] = contribution
                total += contribution
        return total, breakdown

    def score(self, traj: Trajectory) -> tuple[float, dict[str, float]]:
        """(total, breakdown), also written to `traj.reward` and `traj.reward_breakdown`."""
        total, breakdown = self.evaluate(traj)
        traj.reward = total
        traj.reward_breakdown = breakdown
        return total, breakdown

    def score_batch(self, trajs: Sequence[Trajectory]) -> list[float]:
        return [self.score(t)[0] for t in trajs]

    def __call__(self, traj: Trajectory) -> float:
        return self.score(traj)[0]


def score_batch(rubric: Rubric, trajs: Sequence[Trajectory]) -> list[float]:
    """Score every trajectory (writing reward and breakdown on each) and return the scalars in order."""
    return rubric.score_batch(trajs)


def mean_breakdown(trajs: Sequence[Trajectory], prefix: str = "reward/") -> dict[str, float]:
    """Batch means of every breakdown entry (and of the total) for the metrics log, keys prefixed.

    Entries missing from a trajectory (a term added mid-run) average over the trajectories that have it.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for traj in trajs:
        if traj.reward is None:
            raise ValueError(f"trajectory {traj.id} has no reward yet; score it with Rubric.score first")
        for key, value in {"total": traj.reward, **traj.reward_breakdown}.items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    return {prefix + key: sums[key] / counts[key] for key in sums}


# -- configuration ----------------------------------------------------------------------------------


@dataclass
class RewardTermConfig:
    """One rubric entry in YAML."""

    function: str = field(metadata={"help": f"Built-in reward function; one of {sorted(REWARD_FUNCTIONS)}."})
    weight: float = field(
        default=1.0, metadata={"help": "Weight in the scalar reward; 0 logs it as a metric only."}
    )
    name: str = field(
        default="", metadata={"help": "Name in the breakdown and logs (default: the function name)."}
    )
    params: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Keyword parameters of the function (its dataclass fields)."}
    )


@dataclass
class RewardConfig:
    """The reward of a run: a list of weighted terms."""

    terms: list[RewardTermConfig] = field(
        default_factory=list, metadata={"help": "Reward functions with weights; weight 0 = metric only."}
    )


def _parameter_names(factory: Callable[..., RewardFunc]) -> list[str]:
    if dataclasses.is_dataclass(factory):
        return [f.name for f in dataclasses.fields(factory)]
    return []


def build_term(term: RewardTermConfig, where: str = "") -> RewardSpec:
    """Instantiate one configured term, with errors that say which term and what it accepts."""
    label = term.name or term.function
    if term.function not in REWARD_FUNCTIONS:
        raise ConfigError(
            f"{where}reward term {label!r}: unknown function {term.function!r}; known: {sorted(REWARD_FUNCTIONS)}"
        )
    factory = REWARD_FUNCTIONS[term.function]
    accepted = _parameter_names(factory)
    unknown = sorted(set(term.params) - set(accepted)) if dataclasses.is_dataclass(factory) else []
    if unknown:
        raise ConfigError(
            f"{where}reward term {label!r}: unknown parameter(s) {unknown} for {term.function!r}; "
            f"it accepts {accepted or 'no parameters'}"
        )
    try:
        func = factory(**term.params)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}reward term {label!r}: bad parameters {term.params}: {e}") from e
    return RewardSpec(name=label, func=func, weight=term.weight)


def build_rubric(config: RewardConfig, where: str = "") -> Rubric:
    if not config.terms:
        raise ConfigError(f"{where}a reward config needs at least one entry under 'terms'")
    try:
        return Rubric([build_term(t, where) for t in config.terms])
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}{e}") from e


def load_reward_config(path: str | Path, overrides: dict | None = None) -> RewardConfig:
    return load_config(RewardConfig, path, overrides)


def load_rubric(path: str | Path) -> Rubric:
    """Build a rubric from a YAML file with a `terms:` list (see `configs/rewards_default.yaml`)."""
    return build_rubric(load_reward_config(path), where=f"{path}: ")


def default_rubric() -> Rubric:
    """The rubric of `configs/rewards_default.yaml`, built in code so it works without the repo's files."""
    return Rubric(
        [
            RewardSpec("f1", F1Reward(), 1.0),
            RewardSpec("citation", CitationReward(), 0.2),
            RewardSpec("format", FormatReward(), 0.1),
            RewardSpec("search_cost", SearchCost(), 1.0),
            RewardSpec("token_cost", TokenCost(), 1.0),
            RewardSpec("safety", SafetyPenalty(), 1.0),
            RewardSpec("exact_match", ExactMatchReward(), 0.0),
            RewardSpec("contains", ContainsReward(), 0.0),
            RewardSpec("fabrications", FabricationCount(), 0.0),
            RewardSpec("num_searches", SearchCount(), 0.0),
        ]
    )
