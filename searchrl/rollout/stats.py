"""Batch metrics of a rollout: search latency, tool failures, terminations, token throughput.

Why: a search agent fails quietly (timeouts become observations, budgets end episodes); these numbers
are what makes that visible in the training log. Names are flat `group/name` keys, logged as they are:
`tools/calls_per_episode`, `tools/failure_rate`, `tools/failures/<status>`, `tools/permission_denied_rate`
(permission-denied calls per episode: acting beyond the episode's authority), `search/latency_p50_ms`,
`search/latency_p99_ms`, `termination/<reason>` (share of episodes), `rollout/tokens_per_s`, ...
`scored_episode_stats` adds what PPO logs once the episodes are scored: `reward/<term>` and the answers' length.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from searchrl.common.trajectory import TERMINATION_REASONS, TOOL_STATUSES, Trajectory


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics; 0.0 when empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q} must be within [0, 100]")
    if not values:
        return 0.0
    ordered = sorted(float(v) for v in values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def tool_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Calls per episode, failure rate and counts by status, permission-denied calls per episode, and search
    latency p50/p99 of the calls that reached the backend (ok, timeout, unavailable, error)."""
    records = [rec for t in trajectories for rec in t.tool_calls]
    statuses = Counter(rec.status for rec in records)
    failures = sum(n for status, n in statuses.items() if status != "ok")
    # Latency of calls that reached the backend: rejected calls (validation, permission) cost ~0 and
    # would drag the percentiles down.
    reached = [rec.latency_ms for rec in records if rec.status in ("ok", "timeout", "unavailable", "error")]
    out: dict[str, float] = {
        "tools/calls": float(len(records)),
        "tools/calls_per_episode": len(records) / max(1, len(trajectories)),
        "tools/failures": float(failures),
        "tools/failure_rate": failures / max(1, len(records)),
        "tools/permission_denied_rate": statuses.get("permission_denied", 0) / max(1, len(trajectories)),
        "search/latency_p50_ms": percentile(reached, 50),
        "search/latency_p99_ms": percentile(reached, 99),
        "search/latency_mean_ms": sum(reached) / max(1, len(reached)),
    }
    for status in TOOL_STATUSES:
        if status != "ok":
            out[f"tools/failures/{status}"] = float(statuses.get(status, 0))
    out.update(security_stats(trajectories))
    return out


def security_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Prompt-injection counters: markup neutralised in retrieved text, and calls outside the allow-list.

    `security/disallowed_executed` counts calls to a tool the episode did not offer that still ran
    (status "ok"); the environment's allow-list keeps it at 0, and the hardening tests hold it there.
    """
    attempts = sum(int(t.metadata.get("injection_attempts", 0) or 0) for t in trajectories)
    disallowed = 0
    for t in trajectories:
        # `allowed_tools` is recorded when the episode offered tools besides search (its prompt may carry no
        # schema); `tools` is the schema the prompt carried.
        offered = set(t.metadata.get("allowed_tools", []) or [])
        offered |= {spec.get("function", {}).get("name") for spec in t.metadata.get("tools", []) or []}
        offered = offered or {"search"}
        disallowed += sum(1 for rec in t.tool_calls if rec.status == "ok" and rec.name not in offered)
    denied = sum(
        1 for t in trajectories for rec in t.tool_calls if rec.status in ("permission_denied", "unknown_tool")
    )
    return {
        "security/injection_attempts": float(attempts),
        "security/denied_tool_calls": float(denied),
        "security/disallowed_executed": float(disallowed),
    }


def termination_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Share of episodes ending for each reason (every reason present, 0.0 when absent)."""
    counts = Counter(t.termination for t in trajectories)
    n = max(1, len(trajectories))
    return {f"termination/{reason}": counts.get(reason, 0) / n for reason in TERMINATION_REASONS}


def scored_episode_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Each reward term's batch mean (an episode without the term counts 0, so a penalty only some episodes
    pay shows as its cost per episode), termination shares and the answers' length in words."""
    keys = sorted({k for t in trajectories for k in t.reward_breakdown})
    out = {
        f"reward/{k}": float(np.mean([t.reward_breakdown.get(k, 0.0) for t in trajectories])) for k in keys
    }
    out.update(termination_stats(trajectories))
    out["answer/length_words"] = float(np.mean([len((t.answer or "").split()) for t in trajectories]))
    return out


def token_stats(trajectories: Sequence[Trajectory], wall_s: float) -> dict[str, float]:
    """Token counts of the final trajectories and the action-token throughput."""
    total = sum(len(t.input_ids) for t in trajectories)
    actions = sum(t.num_action_tokens for t in trajectories)
    prompts = sum(t.prompt_length for t in trajectories)
    return {
        "rollout/episodes": float(len(trajectories)),
        "rollout/tokens": float(total),
        "rollout/prompt_tokens": float(prompts),
        "rollout/action_tokens": float(actions),
        "rollout/observation_tokens": float(total - actions - prompts),
        "rollout/turns_per_episode": sum(t.num_turns for t in trajectories) / max(1, len(trajectories)),
        "rollout/wall_s": float(wall_s),
        "rollout/tokens_per_s": actions / wall_s if wall_s > 0 else 0.0,
    }


def rollout_stats(
    trajectories: Sequence[Trajectory],
    wall_s: float,
    search_s: float = 0.0,
    model_tokens: int = 0,
    model_real_tokens: int = 0,
) -> dict[str, float]:
    """All batch metrics in one flat dict.

    `model_tokens` is every position a forward pass computed (padding included); `rollout/prefill_ratio`
    divides it by the tokens of the final trajectories (1.0 = nothing computed twice, nothing wasted).
    """
    out = tool_stats(trajectories) | termination_stats(trajectories) | token_stats(trajectories, wall_s)
    total = out["rollout/tokens"]
    out["rollout/model_tokens"] = float(model_tokens)
    out["rollout/model_real_tokens"] = float(model_real_tokens)
    out["rollout/prefill_ratio"] = model_tokens / total if total else 0.0
    out["rollout/search_s"] = float(search_s)
    out["rollout/search_share"] = search_s / wall_s if wall_s > 0 else 0.0
    return out
