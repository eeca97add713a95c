"""How one rollout call samples: the `Sampling` record a caller hands `TurnLoop.rollout` with the call.

Why: a trainer samples each step with its own seed, and evaluates at another temperature, through the one
engine it shares with the run (and with the dev evaluation). When those settings go with the call, nobody
sets them on the shared engine's `GenerationConfig` and restores them afterwards (and nobody forgets to).
`GenerationConfig.sampling(**changes)` gives the config's own, with changes; the engine's length limits and
cache settings are not per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The rollout engines a run's `rollout_backend` may name (`searchrl.rollout.backends.make_generator`): declared
# here, in the light module of this room, so the settings (`sections.py`) can check the name without torch.
ROLLOUT_BACKENDS: tuple[str, ...] = ("hf", "vllm")


@dataclass(frozen=True)
class Sampling:
    """The sampling fields of `GenerationConfig` for one rollout call (module docstring); checked when made."""

    temperature: float = field(
        default=1.0,
        metadata={"help": "Softmax temperature; 0 means greedy (`GenerationConfig.temperature`)."},
    )
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass in (0, 1]; 1 disables it."})
    top_k: int = field(default=0, metadata={"help": "Keep only the k most likely tokens; 0 disables it."})
    seed: int = field(
        default=0, metadata={"help": "Seed of this rollout's sampling (same seed, same rollout)."}
    )

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables top-k)")
