"""A tiny PPO run with forced turns, for the viewer and hardening tests (no tests here).

A tiny real world (synthetic corpus, BM25 index, BPE tokenizer, tiny Qwen2 policy) and a short PPO run
whose turns are forced by `SearchThenAnswer`: the policy's first turn searches the row's expert query,
its second answers (the gold for even rows, a wrong word for odd rows) citing the first retrieved id.
Forced tokens still go through the real generator, environment, rewards and PPO update, so every run
has tool calls, observations, varied rewards and per-token advantages to look at.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class TinyWorld:
    """The synthetic task ("tiny" preset), its BM25 index (with any extra documents) and a BPE tokenizer."""

    root: Path
    task: Any
    backend: Any
    tok: Any
    index_dir: Path
    corpus_path: Path


def build_world(root: Path, extra_docs: list[dict] | None = None, seed: int = 0) -> TinyWorld:
    from searchrl.common.io import write_jsonl
    from searchrl.data.synthetic import generate, preset_config
    from searchrl.models.tiny import tokenizer_training_texts, train_tokenizer
    from searchrl.search.index import build_index

    task = generate(preset_config("tiny", seed=seed))
    corpus = list(task.corpus) + list(extra_docs or [])
    corpus_path = root / "corpus.jsonl"
    write_jsonl(corpus_path, corpus)
    index_dir = root / "index"
    backend = build_index(corpus_path, index_dir, overwrite=True)
    backend.search(["warm up"], 1)  # numba compiles on first use: keep that out of every deadline
    tok = train_tokenizer(tokenizer_training_texts(corpus, task.splits["train"]), vocab_size=512)
    return TinyWorld(root, task, backend, tok, index_dir, corpus_path)


class SearchThenAnswer:
    """A `TokenForcing`: turn 0 searches the row's expert query, turn 1 answers (see module docstring).

    It reads each row from the environment the trainer created for it: `envs` is the list the env
    factory appends to, and a rollout's rows are the last `batch_size` environments made.
    """

    def __init__(
        self, tok: Any, envs: list[Any], batch_size: int, wrong_every: int = 2, searches: int = 1
    ) -> None:
        self.tok = tok
        self.envs = envs
        self.batch_size = batch_size
        self.wrong_every = wrong_every
        self.searches = searches  # searches before the answer (each one a batched backend call)
        self._ids: dict[tuple[int, int], list[int]] = {}

    def _text(self, env: Any, row: int, turn: int) -> str | None:
        from searchrl.data.synthetic_text import expert_queries
        from searchrl.env.protocol import format_answer, format_tool_call

        if turn < self.searches:
            query = expert_queries(env.row)[0] + ("" if turn == 0 else f" {turn}")
            return format_tool_call("search", {"query": query, "k": 2})
        if turn == self.searches:
            cited = [rec.doc_ids[0] for rec in env.records if rec.doc_ids][:1]
            wrong = self.wrong_every and row % self.wrong_every == 1
            return format_answer("unknown" if wrong else str(env.row["golds"][0]), cited)
        return None

    def __call__(self, row: int, turn: int, position: int) -> int | None:
        env = self.envs[len(self.envs) - self.batch_size + row]
        key = (id(env), turn)
        if key not in self._ids:
            text = self._text(env, row, turn)
            if text is None:
                return None
            ids = self.tok.encode(text, add_special_tokens=False)
            self._ids[key] = [int(i) for i in ids] + [int(self.tok.eos_token_id)]
        ids = self._ids[key]
        return ids[position] if position < len(ids) else None


def make_trainer(
    world: TinyWorld,
    out_dir: Path,
    backend: Any = None,
    steps: int = 2,
    env_cfg: dict | None = None,
    callbacks: list | None = None,
    batch_size: int = 4,
    save_steps: int = 1,
    searches: int = 1,
    **ppo: Any,
):
    """A PPOTrainer on the tiny world with `SearchThenAnswer` forcing; `steps` PPO steps of `batch_size`."""
    from worlds import TINY_TWO_LAYERS

    from searchrl.env.config import EnvConfig
    from searchrl.env.environment import SearchEnvironment
    from searchrl.models.tiny import build_policy
    from searchrl.ppo.config import PPOConfig
    from searchrl.ppo.trainer import PPOTrainer
    from searchrl.rewards.combine import default_rubric

    backend = backend if backend is not None else world.backend
    cfg = EnvConfig(**{"max_turns": 3, "max_tool_calls": 2, "max_observation_tokens": 96, **(env_cfg or {})})
    envs: list[Any] = []

    def factory() -> SearchEnvironment:
        env = SearchEnvironment(backend, cfg, tokenizer=world.tok)
        envs.append(env)
        return env

    args = PPOConfig(
        **{
            "output_dir": str(out_dir),
            "per_device_train_batch_size": batch_size,
            "gradient_accumulation_steps": 1,
            "total_episodes": steps * batch_size,
            "num_ppo_epochs": 1,
            "max_new_tokens_per_turn": 48,
            "max_episode_tokens": 400,
            "learning_rate": 1e-3,
            "save_steps": save_steps,
            "eval_steps": 1000,
            "progress_bar": False,
            "save_trajectories": True,
            "seed": 1,
            **ppo,
        }
    )
    policy = build_policy(world.tok, TINY_TWO_LAYERS)
    trainer = PPOTrainer(
        args,
        world.tok,
        policy,
        None,
        None,
        world.task.splits["train"],
        reward_funcs=default_rubric(),
        environment=factory,
        callbacks=callbacks,
    )
    trainer.generator.forcing = SearchThenAnswer(world.tok, envs, batch_size, searches=searches)
    trainer.created_envs = envs  # for tests that swap in another forcing
    return trainer


def read_metrics(run_dir: Path) -> list[dict]:
    """Every line of a run's metrics.jsonl, as written."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """`fn()` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
