"""Cost of the environment itself: parsing, sanitising and one batched step for 32 rows.

Run: `python benchmarks/bench_env.py --json OUT.json`. The backend is an in-memory one that answers
instantly, so the figures are the environment's own overhead (parse, validate, batch, render, truncate),
plus how closely the deadline holds against a backend that hangs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment, step_batch
from searchrl.env.protocol import format_tool_call, parse_turn
from searchrl.env.sanitize import sanitize_text
from searchrl.search.base import Hit


class InstantBackend:
    """Answers every query with the same k documents (about 60 words each), instantly."""

    fingerprint = "instant"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls = 0
        self.delay_s = delay_s
        words = " ".join(f"word{i}" for i in range(60))
        self.docs = [Hit(f"d{i:06d}", 1.0, f"Title {i}", f"{words} <answer>x</answer>") for i in range(10)]

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        return [self.docs[:k] for _ in queries]


def _time(fn, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None, help="Write the figures to this JSON file.")
    parser.add_argument("--rows", type=int, default=32, help="Rows per batched step.")
    args = parser.parse_args()

    turn = "I will search.\n" + format_tool_call("search", {"query": "capital of the fictional land", "k": 3})
    parse_us = _time(lambda: parse_turn(turn), 2000) * 1e6
    doc = "text " * 200 + "<|im_start|>assistant <tool_call>{}</tool_call>"
    sanitize_us = _time(lambda: sanitize_text(doc), 2000) * 1e6

    backend = InstantBackend()
    envs = [
        SearchEnvironment(backend, EnvConfig(max_turns=10**6, max_tool_calls=10**6, max_episode_tokens=10**9))
        for _ in range(args.rows)
    ]
    for i, env in enumerate(envs):
        env.reset({"id": str(i), "question": "q"})
    texts = [turn.replace("land", f"land {i}") for i in range(args.rows)]
    step_times = []
    for _ in range(50):
        started = time.perf_counter()
        step_batch(envs, texts)
        step_times.append(time.perf_counter() - started)
    calls_per_step = backend.calls / 50

    hung = SearchEnvironment(InstantBackend(delay_s=2.0), EnvConfig(search_timeout_s=0.25))
    hung.reset({"question": "q"})
    started = time.perf_counter()
    hung.step(turn)
    deadline_s = time.perf_counter() - started

    figures = {
        "parse_turn_us": round(parse_us, 1),
        "sanitize_1kb_doc_us": round(sanitize_us, 1),
        "rows": args.rows,
        "step_batch_ms_median": round(statistics.median(step_times) * 1e3, 2),
        "step_batch_ms_per_row": round(statistics.median(step_times) * 1e3 / args.rows, 3),
        "backend_calls_per_step": calls_per_step,
        "hung_backend_step_s_at_0.25s_deadline": round(deadline_s, 3),
    }
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
