"""KL between the policy and the frozen reference: per-token estimators and the coefficient controllers.

PPO for language models keeps the policy near its reference by paying a per-token penalty
`-beta * KL_t` inside the reward (TRL, lm-human-preferences and Search-R1 all do it this way). This
module supplies the three pieces of that:

- `kl_penalty(logprobs, ref_logprobs, estimator)`: the per-token KL estimate of the sampled token,
  with Schulman's k1 / k2 / k3 estimators (http://joschu.net/blog/kl-approx.html).
- `sequence_kl(kl_per_token, mask)`: the one KL *unit* the controllers understand.
- `FixedKLController` and `AdaptiveKLController` (Ziegler et al. 2019, arXiv 1909.08593): the
  coefficient `beta`, fixed or steered toward a target KL.

The unit matters because the literature mixes two: TRL and lm-human-preferences feed the controller
the batch mean of each trajectory's KL *summed* over its tokens (nats per sequence, "target 6"), while
verl feeds a per-token *mean* ("target_kl 0.1"). Here it is always the first, summed over action
tokens only (observation tokens were not sampled by the policy, so they carry no KL).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

import torch

from searchrl.ppo.config import KL_ESTIMATORS

KLEstimator = Literal["k1", "k2", "k3"]


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate of the sampled tokens, same shape as the inputs (any shape, e.g. `(batch, T)`).

    With `log r = ref_logprobs - logprobs` for tokens sampled from the policy (Schulman,
    "Approximating KL Divergence"):

    - "k1" = `-log r` = `logp - ref`: unbiased, high variance, can be negative per token.
    - "k2" = `0.5 * (log r)^2`: biased (little, when the two are close), low variance, >= 0.
    - "k3" = `(r - 1) - log r` = `exp(ref - logp) - (ref - logp) - 1`: unbiased, low variance, >= 0.

    No mask is applied: the caller masks (padding and observation positions may hold anything).
    """
    _check_estimator(estimator)
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"kl_penalty: logprobs has shape {tuple(logprobs.shape)} but ref_logprobs has shape "
            f"{tuple(ref_logprobs.shape)}; compute both over the same token positions."
        )
    log_ratio = ref_logprobs - logprobs  # log r = log p_ref(x) - log pi(x)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    # k3: expm1 keeps (r - 1) accurate when r is close to 1, where the difference is tiny.
    return torch.expm1(log_ratio) - log_ratio


def per_sequence_kl(kl_per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each trajectory's KL summed over its action tokens: `(batch, T)` -> `(batch,)`."""
    if kl_per_token.shape != mask.shape or kl_per_token.dim() != 2:
        raise ValueError(
            f"per_sequence_kl: expected kl_per_token and mask of the same (batch, T) shape, got "
            f"{tuple(kl_per_token.shape)} and {tuple(mask.shape)}."
        )
    # where, not multiply: masked positions may hold inf/NaN (e.g. k3 on garbage logprobs) and 0*inf is NaN.
    return torch.where(mask.bool(), kl_per_token, torch.zeros_like(kl_per_token)).sum(dim=1)


def sequence_kl(kl_per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The controller's KL unit: batch mean of each trajectory's KL summed over its action tokens (nats).

    Returns a 0-dim tensor; pass `float(sequence_kl(...))` to `controller.update`. This is TRL's
    `objective/kl` (`kl.sum(1).mean()`), restricted to tokens the policy sampled.
    """
    return per_sequence_kl(kl_per_token, mask).mean()


class KLController(Protocol):
    """What the trainer needs from a controller: the coefficient, an update rule and checkpointing."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class FixedKLController:
    """A constant KL coefficient; `update` is accepted (so callers need no branch) and changes nothing."""

    def __init__(self, kl_coef: float) -> None:
        _check_coef(kl_coef, "kl_coef", allow_zero=True)
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Ignore the measurement and return the unchanged coefficient."""
        _check_kl_measurement(current_kl, n_steps)
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state_type(state, "fixed")
        self.value = float(state["value"])

    def __repr__(self) -> str:
        return f"FixedKLController(value={self.value:g})"


class AdaptiveKLController:
    """Ziegler et al. 2019's proportional controller that steers the measured KL toward `target`.

    Each update: `error = clip(current_kl / target - 1, -0.2, 0.2)`, then
    `value *= 1 + error * n_steps / horizon`. `current_kl` is in the unit of `sequence_kl`: the batch
    mean of each trajectory's KL *summed* over its action tokens, in nats (TRL's unit; TRL's old
    defaults were init 0.2, target 6, horizon 10000). `n_steps` counts episodes (trajectories) in the
    batch that was measured, so `horizon` is in episodes too. The update is multiplicative, so the
    coefficient stays positive while `n_steps <= horizon`, and one update moves it by at most a factor
    `1 +- 0.2 * n_steps / horizon`.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        _check_coef(init_kl_coef, "init_kl_coef", allow_zero=False)
        _check_coef(target, "target", allow_zero=False)
        _check_coef(horizon, "horizon", allow_zero=False)
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Move the coefficient toward the target after a batch of `n_steps` episodes; return it."""
        _check_kl_measurement(current_kl, n_steps)
        if n_steps > self.horizon:
            # With n_steps > horizon a clipped error of -0.2 could flip the sign of the coefficient
            # (factor 1 - 0.2 * n / h <= 0 once n >= 5h); refuse before that is possible at all.
            raise ValueError(
                f"AdaptiveKLController.update: n_steps={n_steps} exceeds horizon={self.horizon:g}; the horizon "
                "is in episodes and must be larger than one batch (raise kl_horizon, e.g. to 10000)."
            )
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"type": "adaptive", "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state_type(state, "adaptive")
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])

    def __repr__(self) -> str:
        return f"AdaptiveKLController(value={self.value:g}, target={self.target:g}, horizon={self.horizon:g})"


def make_kl_controller(
    kl_coef: float, kl_target: float | None = None, kl_horizon: float = 10000.0
) -> FixedKLController | AdaptiveKLController:
    """The controller a config asks for: adaptive when `kl_target` is set (starting at `kl_coef`), else fixed."""
    if kl_target is None:
        return FixedKLController(kl_coef)
    return AdaptiveKLController(kl_coef, kl_target, kl_horizon)


def _check_estimator(estimator: str) -> None:
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"Unknown KL estimator {estimator!r}; use one of {list(KL_ESTIMATORS)} "
            "(k1 = logp - ref, k2 = 0.5*(logp - ref)^2, k3 = exp(ref - logp) - (ref - logp) - 1)."
        )


def _check_coef(value: float, name: str, *, allow_zero: bool) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}.")


def _check_kl_measurement(current_kl: float, n_steps: int) -> None:
    if not math.isfinite(float(current_kl)):
        raise ValueError(
            f"KL controller got current_kl={current_kl!r}; the measured KL must be finite (a NaN/inf KL "
            "usually means logprobs were computed at padded positions or the policy has diverged)."
        )
    if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 0:
        raise ValueError(
            f"KL controller n_steps must be a non-negative int (episodes in the batch), got {n_steps!r}."
        )


def _check_state_type(state: dict[str, Any], expected: str) -> None:
    found = state.get("type")
    if found != expected:
        raise ValueError(
            f"Cannot load a {found!r} KL controller state into a {expected!r} controller; the checkpoint was "
            "written with a different kl_target setting (set kl_target as in the original run)."
        )
