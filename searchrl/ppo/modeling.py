"""The models PPO holds, and how they are made: policy + critic in one module, the critic and the frozen
reference built from the policy so that neither can share code or storage with it.

One module holds policy and critic so that one optimizer and one `accelerate.prepare` cover both (TRL
1.12's `PolicyAndValueWrapper` idea; the critic is a score head over per-token hidden states). The
reference (`frozen_copy`) and the critic (`value_model_from_policy`) are rebuilt from the policy's config
with its weights copied in, never `copy.deepcopy`'d: after an in-process SFT the policy carries trainer
wrappers on its `forward` whose closures point at the policy itself, and a deep copy would run the live
policy (`searchrl.models.forward_patches` has the story). `prepare_policy` removes those wrappers from the
policy before training starts. `frozen_models` puts the reference and the reward model on the device (sharded
for inference under DeepSpeed), frozen.

The logprob and entropy helpers here are the per-position views PPO needs (`out[:, t]` scores token t,
position 0 gets 0) over the shared math in `searchrl.rollout.generator.sampling_log_probs` and
`searchrl.ppo.losses.entropy_from_logits`.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForSequenceClassification

from searchrl.models.forward_patches import independent_copy, remove_trainer_forward_patches, shares_storage
from searchrl.ppo.distributed import RankOps, prepare_for_inference
from searchrl.ppo.losses import entropy_from_logits
from searchrl.rewards.reward_model import FrozenRewardModel
from searchrl.rollout.generator import sampling_log_probs

logger = logging.getLogger("searchrl.ppo")


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """`out[:, t] = log p(input_ids[:, t] | input_ids[:, :t])` under the sampling distribution; `out[:, 0] = 0`.

    The distribution is the rollout's own (`sampling_log_probs`: temperature, then top-k, then top-p), so
    before any update these equal the rollout's logprobs (invariant 11: parity with sampling).
    """
    logp = sampling_log_probs(logits[:, :-1], temperature, top_k, top_p)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(lp, (1, 0), value=0.0)


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-position entropy of the tempered distribution, aligned like `token_logprobs` (`out[:, 0] = 0`)."""
    return F.pad(entropy_from_logits(logits[:, :-1].float() / temperature), (1, 0), value=0.0)


class PolicyAndValue(nn.Module):
    """Policy (causal LM) plus critic.

    `value_mode="separate"`: the critic is a sequence-classification model whose `.score` head runs over
    its own backbone's per-token hidden states (TRL 1.12). `value_mode="shared_backbone"`: a linear value
    head on the policy's last hidden state. Either way `values[:, t]` is the value of the state in which
    token t is chosen, i.e. read at position t-1, aligned with `token_logprobs`.
    """

    def __init__(self, policy: nn.Module, value_model: nn.Module | None, value_mode: str = "separate"):
        super().__init__()
        self.policy = policy
        self.value_mode = value_mode
        if value_mode == "separate":
            if value_model is None:
                raise ValueError("value_mode='separate' needs a value_model (a seq-cls model, num_labels=1)")
            self.value_model = value_model
        elif value_mode == "shared_backbone":
            self.value_head = nn.Linear(policy.config.hidden_size, 1)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        else:
            raise ValueError(f"value_mode must be 'separate' or 'shared_backbone', got {value_mode!r}")

    def value_parameters(self) -> list[nn.Parameter]:
        return list((self.value_model if self.value_mode == "separate" else self.value_head).parameters())

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        position_ids = position_ids_from_mask(attention_mask)
        shared = self.value_mode == "shared_backbone"
        out = self.policy(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=shared,
            use_cache=False,
        )
        if shared:
            raw = self.value_head(out.hidden_states[-1]).squeeze(-1)
            return out.logits, F.pad(raw[:, :-1].float(), (1, 0), value=0.0)
        return out.logits, self.critic_values(input_ids, attention_mask)

    def critic_values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The separate critic alone (no policy pass), aligned like `forward`'s values: the critic-only steps
        of `value_replay_steps` (`ppo/value_replay.py`)."""
        if self.value_mode != "separate":
            raise ValueError("critic_values needs value_mode='separate' (the critic's own model)")
        position_ids = position_ids_from_mask(attention_mask)
        backbone = getattr(self.value_model, self.value_model.base_model_prefix)
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        raw = self.value_model.score(hidden).squeeze(-1)
        return F.pad(raw[:, :-1].float(), (1, 0), value=0.0)


def disable_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    cfg = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop"):
        if cfg is not None and hasattr(cfg, name):
            setattr(cfg, name, 0.0)


def prepare_policy(model: nn.Module, role: str = "policy") -> nn.Module:
    """Remove the `forward` wrappers an earlier trainer left on `model` (TRL's fused LM head, accelerate's
    autocast), so that it runs its own class's forward in its own precision; refuse unknown wrappers."""
    removed = remove_trainer_forward_patches(model)
    if removed:
        logger.info(
            "%s: removed %d forward wrapper(s) left by an earlier trainer: %s",
            role,
            len(removed),
            ", ".join(p.origin for p in removed),
        )
    return model


def value_model_from_policy(policy: nn.Module) -> nn.Module:
    """A critic initialised from the policy's backbone with a fresh zero score head.

    Built from a copy of the policy's config with the backbone's weights copied in, so it shares no
    storage and no code path with the policy. Accepts a plain causal LM or one with PEFT layers
    injected: LoRA weights are left out and `base_layer.` is stripped, so the critic starts from the
    *base* backbone either way.
    """
    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    critic = AutoModelForSequenceClassification.from_config(config)
    prefix = critic.base_model_prefix
    source = getattr(policy, prefix).state_dict()
    base_weights = {
        k.replace(".base_layer.", "."): v.detach().clone() for k, v in source.items() if "lora_" not in k
    }
    getattr(critic, prefix).load_state_dict(base_weights)
    nn.init.zeros_(critic.score.weight)
    if getattr(critic.score, "bias", None) is not None:
        nn.init.zeros_(critic.score.bias)
    return critic


def frozen_copy(model: nn.Module) -> nn.Module:
    """The frozen reference: an independent copy (own code path, own storage) in eval mode, no gradients."""
    ref = independent_copy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def assemble_models(
    model: nn.Module,
    ref_model: nn.Module | None,
    value_model: nn.Module | None,
    value_mode: str,
    peft_config: Any = None,
    gradient_checkpointing: bool = False,
) -> tuple[PolicyAndValue, nn.Module | None, bool]:
    """(policy + critic module, frozen reference, is_peft) from the models a user passes `PPOTrainer`.

    Trainer wrappers go first (`prepare_policy`); a reference or critic sharing storage with the policy is
    refused; the critic is built from the base weights before any adapter is injected; without a reference
    the policy's frozen copy is made (with PEFT, None: the reference is the policy with its adapter
    disabled). Dropout is off in every model: PPO's ratio compares two passes over the same tokens.
    """
    if ref_model is not None and ref_model is model:
        raise ValueError("ref_model must not be the policy itself; pass None to get a frozen copy")
    prepare_policy(model)
    for role, side in (("ref_model", ref_model), ("value_model", value_model)):
        if side is not None:
            prepare_policy(side, role)
            if shares_storage(side, model):
                raise ValueError(
                    f"{role} shares weights with the policy, so it would move with every update; pass an "
                    f"independent model (or None to have one built from the policy)"
                )
    already_peft = hasattr(model, "disable_adapter")
    if already_peft and peft_config is not None:
        raise ValueError("model is already a PeftModel: pass peft_config=None, or pass the base model")
    if value_model is None and value_mode == "separate":
        value_model = value_model_from_policy(model.get_base_model() if already_peft else model)
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    is_peft = hasattr(model, "disable_adapter")
    if ref_model is None and not is_peft:
        ref_model = frozen_copy(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    module = PolicyAndValue(model, value_model, value_mode)
    for m in (module.policy, value_model, ref_model):
        if m is not None:
            disable_dropout(m)
    return module, ref_model, is_peft


def frozen_models(
    ref_model: nn.Module | None, reward_model: nn.Module | None, ranks: RankOps
) -> tuple[nn.Module | None, FrozenRewardModel | None]:
    """(reference in eval mode, reward model behind `FrozenRewardModel`), each on the device (DeepSpeed:
    sharded for inference, `prepare_for_inference`); the reward model without dropout. None stays None."""
    if reward_model is not None:
        disable_dropout(reward_model)
        reward_model = prepare_for_inference(reward_model, ranks.accelerator, ranks.uses_deepspeed)
    if ref_model is not None:
        ref_model = prepare_for_inference(ref_model, ranks.accelerator, ranks.uses_deepspeed).eval()
    return ref_model, FrozenRewardModel(reward_model) if reward_model is not None else None


def load_adapter_weights(model: nn.Module, path: Path) -> None:
    """Load a PEFT `save_pretrained` folder's adapter weights into an existing PeftModel."""
    from peft import set_peft_model_state_dict

    file = path / "adapter_model.safetensors"
    if not file.exists():
        raise FileNotFoundError(
            f"{path}: no adapter_model.safetensors (was this checkpoint written with PEFT?)"
        )
    result = set_peft_model_state_dict(model, load_file(str(file)))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise RuntimeError(f"{path}: adapter weights do not match the model (unexpected {unexpected[:3]})")


def load_weights(model: nn.Module, path: Path) -> None:
    """Load a `save_pretrained` folder's weights into an existing model (keeps optimizer references)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights to load")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise RuntimeError(
            f"{path}: weights do not match the model (missing {real_missing[:3]}, unexpected {unexpected[:3]})"
        )
