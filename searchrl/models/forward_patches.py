"""Instance-level `forward` patches that trainers leave on a model, and copies that cannot share them.

Why this module exists: after an in-process SFT the policy is not the plain model it looks like.
TRL 1.16's trainers (`SFTTrainer`, `GRPOTrainer`, ...) call `trl.trainer.utils.add_fused_lm_head`, which
sets `model.forward` to a wrapper that closes over the *original bound* forward; accelerate's mixed
precision (`bf16=True`) sets another wrapper (`convert_outputs_to_fp32(autocast(forward))`) on top and
keeps the previous one as `model._original_forward`. Both stay on the instance after training. Two things
then go wrong silently:

- `copy.deepcopy(model)` copies the wrapper but not what its closure points at, so the "copy" runs the
  original model's forward: a PPO reference built that way is the live policy (KL exactly 0 forever);
- the autocast wrapper keeps every later forward in bfloat16, so sampling (one token at a time over a KV
  cache) and PPO's recomputation (one pass over the whole sequence) round differently: their logprobs
  disagree by 0.05-0.12 nats instead of 1e-6.

`remove_trainer_forward_patches(model)` restores the class's own `forward` on every submodule that carries
one of these known patches, and refuses (with `ForwardPatchError`) a patch it does not recognise, because
a user's own wrapper might matter. `independent_copy(model)` builds a frozen-able copy from the config and
a cloned state dict, so a reference or a critic can never share code or storage with the policy, whatever
wrapped it; `shares_storage(a, b)` is the check.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

# Packages whose trainers are known to leave a `forward` on the instance, and whose wrappers delegate to
# the class's forward (removing them restores the plain model).
KNOWN_PATCHING_PACKAGES = ("trl", "accelerate", "transformers")


class ForwardPatchError(ValueError):
    """A module's `forward` was replaced on the instance by code searchrl does not recognise."""


@dataclass(frozen=True)
class ForwardPatch:
    """One instance-level `forward` found on a (sub)module."""

    module_path: str  # "" for the model itself, else the dotted submodule name
    origin: str  # "<function name> (<file>:<line>)"
    package: str | None  # the known package it comes from, or None when unknown

    @property
    def known(self) -> bool:
        return self.package is not None


def _package_of(filename: str) -> str | None:
    parts = Path(filename).parts
    for package in KNOWN_PATCHING_PACKAGES:
        # site-packages/<package>/..., or a source checkout's <package>/ directory
        if package in parts:
            index = parts.index(package)
            if index > 0 and parts[index - 1] in ("site-packages", "dist-packages", "src"):
                return package
    return None


def _describe(forward: object) -> tuple[str, str | None]:
    func = getattr(forward, "__func__", forward)
    code = getattr(func, "__code__", None)
    if code is None:  # a callable object, a functools.partial, ...
        return type(forward).__qualname__, None
    # functools.wraps copies the wrapped function's name; the code object keeps the wrapper's own.
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})", _package_of(code.co_filename)


def find_forward_patches(model: nn.Module) -> list[ForwardPatch]:
    """Every submodule (the model included) whose `forward` is an instance attribute, outermost first."""
    found = []
    for name, module in model.named_modules():
        forward = vars(module).get("forward")
        if forward is not None:
            origin, package = _describe(forward)
            found.append(ForwardPatch(name, origin, package))
    return found


def remove_trainer_forward_patches(model: nn.Module) -> list[ForwardPatch]:
    """Restore the class's `forward` wherever TRL, accelerate or transformers left a wrapper; returns them.

    Raises `ForwardPatchError` (and changes nothing) when a patch comes from elsewhere.
    """
    patches = find_forward_patches(model)
    unknown = [p for p in patches if not p.known]
    if unknown:
        where = "; ".join(f"{p.module_path or '<model>'}.forward = {p.origin}" for p in unknown)
        raise ForwardPatchError(
            f"the model's forward was replaced on the instance by code searchrl does not recognise ({where}). "
            "A reference or critic copied from such a model may run the original's weights, and sampling may "
            "not match training. Remove the wrapper (`del module.forward`) before passing the model, or pass "
            "ref_model= and value_model= built yourself."
        )
    modules = dict(model.named_modules())
    for patch in patches:
        module = modules[patch.module_path]
        # Wrappers stack (accelerate's autocast over TRL's fused head, two SFT phases); peel them all.
        while "forward" in vars(module):
            del module.forward
        vars(module).pop("_original_forward", None)  # accelerate's record of the wrapped forward
    return patches


def shares_storage(a: nn.Module, b: nn.Module) -> bool:
    """True when any parameter or buffer of `a` lives in the same memory as one of `b`."""

    def pointers(m: nn.Module) -> set[int]:
        tensors = [*m.parameters(), *m.buffers()]
        return {t.untyped_storage().data_ptr() for t in tensors if t.numel() > 0}

    return bool(pointers(a) & pointers(b))


def independent_copy(model: nn.Module) -> nn.Module:
    """A copy with its own code path and storage: rebuilt from the config with a cloned state dict.

    A Hugging Face model is constructed again from a copy of its config, so no instance attribute of the
    original (a patched `forward`, hooks) comes along; other modules are deep-copied and then must carry
    no unknown `forward` patch. Either way the copy is checked not to share storage with the original.
    """
    if isinstance(model, PreTrainedModel):
        first = next(iter(model.parameters()), None)
        dtype = first.dtype if first is not None else torch.float32
        device = first.device if first is not None else torch.device("cpu")
        # Built in the model's own dtype (no float32 detour for a bf16 model), then the weights copied in.
        clone = type(model)._from_config(copy.deepcopy(model.config), dtype=dtype)
        clone.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
        clone.to(device=device)
        if getattr(model, "generation_config", None) is not None:
            clone.generation_config = copy.deepcopy(model.generation_config)
    else:
        clone = copy.deepcopy(model)
        remove_trainer_forward_patches(clone)
    if shares_storage(model, clone):
        raise RuntimeError(
            "independent_copy: the copy shares storage with the original (a bug; please report)"
        )
    return clone
