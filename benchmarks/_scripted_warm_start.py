"""The scripted warm start two benchmarks give their tiny policy before measuring it (bench_trainers, bench_vllm),
and the GRPO tests' world (tests/worlds.py) before the tests use it.

What: `scripted_warm_start` runs one scripted expert episode per row through the real rollout engine (search
the question, then answer with the row's first gold, citing its first supporting document), then takes
plain supervised AdamW steps on those episodes' action tokens. It is not the SFT warm start
(`searchrl.sft`): a few full-batch steps, enough for a fresh tiny model to use the protocol at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from searchrl.env.protocol import format_answer, format_tool_call
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy


def scripted_warm_start(
    policy: Any,
    tokenizer: Any,
    envs: Sequence[Any],
    rows: list[dict[str, Any]],
    generation: GenerationConfig,
    steps: int,
    lr: float,
) -> list[Any]:
    """`steps` supervised steps (AdamW at `lr`, the whole batch each step) on the action tokens of one scripted
    episode per (env, row), on the policy's device; the policy is left in train mode. Returns the scripted
    episodes (the trajectories trained on), for a caller to check."""
    turns = [
        [
            format_tool_call("search", {"query": r["question"]}),
            format_answer(r["golds"][0], list(r.get("supporting_doc_ids", []))[:1]),
        ]
        for r in rows
    ]
    gen = HFGenerator(policy, tokenizer, generation, forcing=ScriptedPolicy(tokenizer, turns))
    trajs = gen.rollout(list(envs), rows).trajectories
    width = max(len(t.input_ids) for t in trajs)
    device = next(policy.parameters()).device
    ids = torch.full((len(trajs), width), tokenizer.pad_token_id)
    attention = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, t in enumerate(trajs):
        n = len(t.input_ids)
        ids[i, :n] = torch.tensor(t.input_ids)
        attention[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(t.action_mask).bool(), torch.tensor(t.input_ids), -100)
    ids, attention, labels = ids.to(device), attention.to(device), labels.to(device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    policy.train()
    for _ in range(steps):
        policy(input_ids=ids, attention_mask=attention, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return trajs
