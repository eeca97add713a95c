"""Rollout benchmark: our batched multi-turn engine vs TRL 1.16's tool loop vs plain `generate`.

Setup (all offline): the synthetic world's tiny split, a real BM25 index, the tiny Qwen2 policy and a
batch of 32 rows (16 questions x 2 generations, as GRPO groups them). The untrained tiny model does not
search on its own, so the SAME script is forced on both engines: each question's episode makes 1, 2 or 3
searches (by question index) and then answers with citations. Forcing only picks the tokens; every
forward pass, pause, search, observation and cache update is the engine's own.

Figures, side by side in one run (best of `--repeats` wall-clock each):

- `prefill_ratio`: positions run through the model (padding included, counted by a forward hook on the
  embedding) / tokens in the final trajectories. Below 1 because each group's identical prompts share
  one prefill; `prefill_ratio_distinct_prompts` is the same rollout without sharing, and TRL's figure
  is `trl_prefill_ratio`.
- `vs_trl_tool_loop`: our rollout wall-clock / the wall-clock of `GRPOTrainer._generate` (TRL's
  `_generate_single_turn` + `_tool_call_loop`, HF `generate` backend, environment_factory with
  searchrl's `SearchToolEnv` over the same index) on a real GRPOTrainer instance, the same model weights,
  questions, tool, limits and script. TRL's forcing is a logits processor that leaves one token finite.
- `vs_plain_generate`: our sampled tokens per second / a plain batched `model.generate` over the same
  prompts that samples the same number of tokens per row, with no pauses and no tools. Our observation
  tokens are pure extra work in this reading. `vs_plain_generate_trajectory_tokens` is the looser one:
  the plain generate produces as many tokens as each of our trajectories holds after its prompt
  (sampled + observation tokens), and both sides' tokens per second count those tokens.

Run: `python benchmarks/bench_rollout.py --json OUT.json` (about a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
warnings.filterwarnings("ignore")

from searchrl.data.synthetic import generate, preset_config  # noqa: E402
from searchrl.data.synthetic_text import RELATION_WORDS  # noqa: E402
from searchrl.env.config import EnvConfig  # noqa: E402
from searchrl.env.environment import SearchEnvironment  # noqa: E402
from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer  # noqa: E402
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy  # noqa: E402
from searchrl.search.index import build_index  # noqa: E402


def call(query: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': {'query': query}})}\n</tool_call>"


def script_for(row: dict[str, Any], n_searches: int) -> list[str]:
    """An expert-like episode: `n_searches` searches (subject, bridge, question), then the cited answer."""
    word = RELATION_WORDS.get(str(row.get("relation", "")).split("_")[0], "")
    queries = [f"{row['subject']} {word}".strip(), f"{row.get('bridge') or row['subject']}", row["question"]]
    cites = " ".join(f"[{d}]" for d in row.get("supporting_doc_ids", []))
    return [call(q) for q in queries[:n_searches]] + [f"<answer>{row['golds'][0]} {cites}</answer>"]


class PositionCounter:
    """Counts every position a forward pass computes (padding included), via the embedding's pre-hook."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.positions = 0
        self._handle = model.get_input_embeddings().register_forward_pre_hook(self._count)

    def _count(self, _module: Any, args: tuple) -> None:
        self.positions += int(args[0].numel())

    def take(self) -> int:
        n, self.positions = self.positions, 0
        return n


def build_world(n_questions: int, seed: int) -> dict[str, Any]:
    task = generate(preset_config("tiny", seed=seed))
    root = Path(tempfile.mkdtemp(prefix="bench_rollout_"))
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in task.corpus))
    backend = build_index(corpus, root / "index", backend="bm25")
    backend.search(["warm up the numba scorer"] + [r["title"] for r in task.corpus[:4]], 3)
    questions = task.splits["train"][:n_questions]
    tok = train_tokenizer(tokenizer_training_texts(task.corpus, task.splits["train"]), vocab_size=2048)
    model = build_policy(tok, TinyModelConfig())
    return {"backend": backend, "questions": questions, "tok": tok, "model": model, "root": root}


def env_config() -> EnvConfig:
    return EnvConfig(max_turns=5, max_tool_calls=4, max_episode_tokens=4096, max_observation_tokens=256)


def run_ours(
    world: dict[str, Any], rows: list[dict], scripts: list[list[str]], gen: GenerationConfig
) -> dict:
    envs = [SearchEnvironment(world["backend"], env_config(), tokenizer=world["tok"]) for _ in rows]
    generator = HFGenerator(world["model"], world["tok"], gen, forcing=ScriptedPolicy(world["tok"], scripts))
    counter = PositionCounter(world["model"])
    started = time.perf_counter()
    batch = generator.rollout(envs, rows)
    wall = time.perf_counter() - started
    positions = counter.take()
    counter._handle.remove()
    total = sum(len(t.input_ids) for t in batch.trajectories)
    return {
        "wall_s": wall,
        "positions": positions,
        "trajectory_tokens": total,
        "action_tokens": sum(t.num_action_tokens for t in batch.trajectories),
        "tool_calls": sum(len(t.tool_calls) for t in batch.trajectories),
        "answered": sum(t.termination == "answered" for t in batch.trajectories),
        "search_s": batch.stats["rollout/search_s"],
        "prompt_tokens": sum(t.prompt_length for t in batch.trajectories),
    }


class ForceScript:
    """HF logits processor forcing the per-question script inside TRL's own `generate` calls.

    TRL calls `generate` once per turn with prompt + history, so each call starts a new turn: the row's
    question and the number of tool responses so far are read once at the start of the call.
    """

    def __init__(self, tok: Any, scripts_by_question: dict[str, list[list[int]]]) -> None:
        self.tok = tok
        self.scripts = scripts_by_question
        self.eos = int(tok.eos_token_id)
        self._start_len = -1
        self._last_len = -1
        self._plans: list[list[int]] = []

    def _plan(self, ids: torch.Tensor) -> list[list[int]]:
        plans = []
        for row in ids.tolist():
            text = self.tok.decode([t for t in row if t != self.tok.pad_token_id], skip_special_tokens=False)
            question = next(q for q in self.scripts if q in text)
            turn = text.count("<tool_response>")
            turns = self.scripts[question]
            plans.append(turns[turn] if turn < len(turns) else [self.eos])
        return plans

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        length = input_ids.shape[1]
        if length != self._last_len + 1:  # a new generate call: a new turn for every row
            self._start_len = length
            self._plans = self._plan(input_ids)
        self._last_len = length
        position = length - self._start_len
        forced = torch.tensor([p[position] if position < len(p) else self.eos for p in self._plans])
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(scores.shape[0]), forced] = 0.0
        return out


def make_trl_trainer(world: dict[str, Any], rows: list[dict], scripts: list[list[str]], max_completion: int):
    from datasets import Dataset
    from transformers import LogitsProcessorList
    from trl import GRPOConfig, GRPOTrainer

    from searchrl.env.trl_adapter import make_environment_factory
    from searchrl.rollout.chat import ChatTokenMeter

    tok = world["tok"]
    model = copy.deepcopy(world["model"])
    by_question: dict[str, list[list[int]]] = {}
    for row, script in zip(rows, scripts, strict=True):
        by_question[row["question"]] = [
            tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in script
        ]
    forcer = ForceScript(tok, by_question)
    plain_generate = model.generate

    def forced_generate(*args: Any, **kwargs: Any) -> Any:
        forcer._last_len = -1
        return plain_generate(*args, logits_processor=LogitsProcessorList([forcer]), **kwargs)

    model.generate = forced_generate
    system = SearchEnvironment(world["backend"], env_config(), tokenizer=tok).system_prompt
    data = [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": r["question"]}],
            "question": r["question"],
        }
        for r in rows
    ]
    args = GRPOConfig(
        output_dir=str(world["root"] / "trl"),
        per_device_train_batch_size=len(rows),
        num_generations=2,
        max_completion_length=max_completion,
        max_tool_calling_iterations=4,
        temperature=1.0,
        top_k=0,
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        max_steps=1,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_list(data),
        processing_class=tok,
        # As the GRPO trainer wires it: the token budget counts tool results as TRL inserts them.
        environment_factory=make_environment_factory(
            world["backend"], env_config(), tok, meter=ChatTokenMeter(tok)
        ),
    )
    return trainer, model, data


def run_trl(trainer: Any, model: torch.nn.Module, data: list[dict]) -> dict:
    timing: dict[str, Any] = {}
    inner = type(trainer)._generate

    def timed(self: Any, prompts: list) -> Any:
        started = time.perf_counter()
        out = inner(self, prompts)
        timing["wall_s"] = time.perf_counter() - started
        timing["out"] = out
        return out

    trainer._generate = timed.__get__(trainer)
    counter = PositionCounter(model)
    trainer.model.eval()
    with torch.no_grad():
        trainer._generate_and_score_completions([dict(x) for x in data])
    prompt_ids, completion_ids, tool_mask = timing["out"][:3]
    positions_in_generate = counter.take()
    counter._handle.remove()
    metrics = trainer._metrics["eval" if not trainer.model.training else "train"]
    total = sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True))
    return {
        "wall_s": timing["wall_s"],
        "positions": positions_in_generate,
        "trajectory_tokens": total,
        "action_tokens": sum(sum(m) for m in tool_mask),
        "tool_calls_per_row": metrics["tools/call_frequency"][-1]
        if metrics.get("tools/call_frequency")
        else None,
        "prompt_tokens": sum(len(p) for p in prompt_ids),
    }


def run_plain(world: dict[str, Any], rows: list[dict], new_tokens: int) -> dict:
    tok, model = world["tok"], world["model"]
    env = SearchEnvironment(world["backend"], env_config(), tokenizer=tok)
    prompts = [
        tok.apply_chat_template(env.reset(r), tools=env.tools, add_generation_prompt=True, tokenize=False)
        for r in rows
    ]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=tok.pad_token_id,
        )
    wall = time.perf_counter() - started
    generated = (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    return {"wall_s": wall, "new_tokens": generated, "tokens_per_s": generated / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="Write the figures to this JSON file.")
    parser.add_argument("--batch", type=int, default=32, help="Rows per rollout (an even number).")
    parser.add_argument("--repeats", type=int, default=5, help="Timed runs per side; the best is reported.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the synthetic world and sampling.")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads.")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    world = build_world(opts.batch // 2, opts.seed)
    questions = world["questions"]
    rows = [q for q in questions for _ in range(2)]  # GRPO order: each prompt twice, consecutively
    scripts = [script_for(q, 1 + (questions.index(q) % 3)) for q in rows]
    gen = GenerationConfig(
        temperature=1.0, max_new_tokens_per_turn=256, max_episode_tokens=3000, seed=opts.seed
    )
    trainer, trl_model, data = make_trl_trainer(world, rows, scripts, max_completion=3000)

    # Warm-ups keep first-call costs out of the timings; the scripted token counts are fixed, so the
    # plain-generate lengths are known before the timed runs.
    probe = run_ours(world, rows, scripts, gen)
    after_prompt = probe["trajectory_tokens"] - probe["prompt_tokens"]
    plain_len, sampled_len = round(after_prompt / len(rows)), round(probe["action_tokens"] / len(rows))
    run_plain(world, rows[:4], 8)
    runs: dict[str, list[dict]] = {"ours": [], "trl": [], "plain": [], "plain_sampled": []}
    for _ in range(opts.repeats):  # interleaved, so every side sees the same machine load
        runs["ours"].append(run_ours(world, rows, scripts, gen))
        runs["trl"].append(run_trl(trainer, trl_model, data))
        runs["plain"].append(run_plain(world, rows, plain_len))
        runs["plain_sampled"].append(run_plain(world, rows, sampled_len))
    ours, trl, plain, plain_sampled = (min(runs[k], key=lambda r: r["wall_s"]) for k in runs)
    # The same rollout with every prompt prefilled separately (what PPO with one sample per prompt sees).
    gen_distinct = GenerationConfig(**{**gen.__dict__, "share_prompt_prefill": False})
    distinct = run_ours(world, rows, scripts, gen_distinct)
    ours_tps = after_prompt / ours["wall_s"]
    ours_sampled_tps = ours["action_tokens"] / ours["wall_s"]
    result = {
        "batch": len(rows),
        "searches_per_episode": [1 + (i % 3) for i in range(len(questions))],
        "prefill_ratio": ours["positions"] / ours["trajectory_tokens"],
        "prefill_ratio_distinct_prompts": distinct["positions"] / distinct["trajectory_tokens"],
        "trl_prefill_ratio": trl["positions"] / trl["trajectory_tokens"],
        "vs_trl_tool_loop": ours["wall_s"] / trl["wall_s"],
        "vs_plain_generate": ours_sampled_tps / plain_sampled["tokens_per_s"],
        "vs_plain_generate_trajectory_tokens": ours_tps / plain["tokens_per_s"],
        "ours": ours,
        "trl": trl,
        "plain_generate": plain_sampled,
        "plain_generate_trajectory_tokens": plain,
        "ours_sampled_tokens_per_s": ours_sampled_tps,
        "ours_trajectory_tokens_per_s": ours_tps,
        "ours_search_share": ours["search_s"] / ours["wall_s"],
        "targets": {"prefill_ratio": "<= 1.1", "vs_trl_tool_loop": "<= 0.5", "vs_plain_generate": ">= 0.8"},
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": opts.threads,
            "cpu_count": os.cpu_count(),
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
