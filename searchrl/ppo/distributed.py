"""What PPO computes over all ranks under `accelerate launch --num_processes N`; identities on one process.

How PPO runs on several processes: an `accelerate.Accelerator` wraps the policy+critic module in DDP (or a
DeepSpeed engine) and the optimizer; on one process it changes nothing. Each rank rolls out its own slice
of the global batch (rank r takes rows r, r+N, ... of the step's rows) with its own sampling seed (TRL's
`seed + rank * 100003`), gradients are averaged by DDP once per mini-batch (`no_sync` on the other
micro-batches), and the main process logs and writes checkpoints, eval files and one trajectory file per
step holding every rank's trajectories.

So every statistic that must be global goes through here: token counts for the micro-batch weights (sums),
the KL fed to the controller (means), the whitening of rewards and advantages (mean and unbiased variance
over every rank's action tokens), the logged metrics (means over ranks, maxima for `*max*` keys), the
training clock (the main process's readings) and the step's trajectories (gathered in rank order). The
DeepSpeed set-up (batch fields, frozen models sharded for inference, weights gathered for generation) lives
here too.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast, gather_object

from searchrl.ppo.advantages import WHITEN_EPS, masked_whiten


def seed_process(seed: int, rank: int) -> None:
    """Seed Python, NumPy and torch with `seed + rank * 100003` (TRL's per-rank seeds: ranks sample different
    rollouts; DDP broadcasts rank 0's weights anyway)."""
    seed = seed + rank * 100003
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class RankOps:
    """Collectives over the ranks of one `Accelerator`, and what the trainer asks of its processes."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator
        self.world_size = accelerator.num_processes
        self.rank = accelerator.process_index
        self.is_main = accelerator.is_main_process
        self.device = accelerator.device
        self.uses_deepspeed = getattr(accelerator.state, "deepspeed_plugin", None) is not None

    def prepare(self, model: torch.nn.Module, optimizer: Any) -> tuple[torch.nn.Module, Any]:
        """(module for the gradient passes, optimizer): DDP or a DeepSpeed engine over `model`'s parameters
        when there are several processes or DeepSpeed, else `model` and `optimizer` themselves. `model` stays
        the plain module for rollouts, no-grad passes and checkpoints. The scheduler is not prepared:
        accelerate's wrapper would step it once per process."""
        if self.world_size > 1 or self.uses_deepspeed:
            return self.accelerator.prepare(model, optimizer)
        return model, optimizer

    def accumulating(self, wrapped_model: torch.nn.Module, last_micro_batch: bool) -> Any:
        """Gradients are all-reduced once per mini-batch, on its last micro-batch only (`no_sync` before)."""
        return contextlib.nullcontext() if last_micro_batch else self.accelerator.no_sync(wrapped_model)

    def gather(self, items: list[Any]) -> list[Any]:
        """Every rank's `items` in rank order (on every rank); `items` itself on one process."""
        return gather_object(list(items)) if self.world_size > 1 else items

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of a scalar tensor over all ranks (the tensor itself on one process)."""
        if self.world_size == 1:
            return value
        total = value.detach().to(self.device, torch.float64).reshape(1)
        return self.accelerator.reduce(total, reduction="sum").reshape(()).to(value.dtype).cpu()

    def mean(self, per_episode: torch.Tensor) -> float:
        """Mean over every rank's episodes (all ranks hold equally many, so a mean of means is exact)."""
        if self.world_size == 1:
            return float(per_episode.mean())
        return float(self.sum(per_episode.double().mean())) / self.world_size

    def whiten(self, values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
        """`masked_whiten` with the mean and unbiased variance taken over all ranks' action tokens."""
        if self.world_size == 1:
            return masked_whiten(values, mask, shift_mean=shift_mean)
        valid = mask.bool()
        kept = torch.where(valid, values, torch.zeros_like(values)).double()
        count = self.sum(valid.sum().double())
        if float(count) < 2:
            raise ValueError(
                "whitening over all ranks needs at least 2 action tokens; use larger batches or set "
                "whiten_advantages=False / whiten_rewards=False"
            )
        mean = self.sum(kept.sum()) / count
        sq = self.sum((torch.where(valid, kept - mean, torch.zeros_like(kept)) ** 2).sum())
        variance = sq / (count - 1)
        whitened = (values.double() - mean) * torch.rsqrt(variance + WHITEN_EPS)
        if not shift_mean:
            whitened = whitened + mean
        return torch.where(valid, whitened, torch.zeros_like(whitened)).to(values.dtype)

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The same metrics on every rank: means over ranks (maxima for `*max*` keys).

        A key only some ranks report (e.g. search latency when one rank made no call) is averaged over
        the ranks that have it. Percentiles and standard deviations become means of per-rank values.
        """
        if self.world_size == 1:
            return metrics
        per_rank = gather_object([metrics])
        out: dict[str, float] = {}
        for key in metrics.keys() | {k for m in per_rank for k in m}:
            values = [float(m[key]) for m in per_rank if key in m]
            out[key] = float(max(values)) if "max" in key else float(np.mean(values))
        out["step"], out["episode"] = metrics["step"], metrics["episode"]
        return dict(
            sorted(out.items(), key=lambda kv: list(metrics).index(kv[0]) if kv[0] in metrics else 1e9)
        )

    def from_main(self, *values: float) -> tuple[float, ...]:
        """The main process's values on every rank."""
        if self.world_size == 1:
            return values
        both = torch.tensor(values, dtype=torch.float64, device=self.device)
        return tuple(float(x) for x in broadcast(both, from_process=0).tolist())


def configure_deepspeed(accelerator: Accelerator, args: Any) -> None:
    """Fill the batch fields DeepSpeed needs but cannot infer without a dataloader (NOT run here).

    One DeepSpeed "step" is one of our optimizer steps: `micro_batches_per_mini_batch` micro-batches of
    `per_device_train_batch_size` episodes; gradient clipping moves into the engine.
    """
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    ds_config["train_micro_batch_size_per_gpu"] = args.per_device_train_batch_size
    ds_config["gradient_accumulation_steps"] = args.micro_batches_per_mini_batch
    ds_config["gradient_clipping"] = args.max_grad_norm


def prepare_for_inference(model: torch.nn.Module, accelerator: Accelerator, uses_deepspeed: bool) -> Any:
    """Reference and reward models: frozen, no optimizer. DeepSpeed shards them for inference
    (`trl.models.prepare_deepspeed`, ZeRO-3 aware); otherwise they are only moved to the device."""
    if uses_deepspeed:
        from trl.models import prepare_deepspeed

        return prepare_deepspeed(model, accelerator)
    return model.to(accelerator.device)


def gathered_for_generation(wrapped_model: Any, accelerator: Accelerator, uses_deepspeed: bool) -> Any:
    """ZeRO-3 partitions the weights: gather them for generation (NOT run here); else nothing to do."""
    if not uses_deepspeed:
        return contextlib.nullcontext()
    from trl.models import unwrap_model_for_generation

    return unwrap_model_for_generation(wrapped_model, accelerator)
