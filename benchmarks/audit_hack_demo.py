"""Watch the audit catch a reward hack: honest vs answer-stuffing behaviour under the hackable reward.

What it does, all offline on the tiny synthetic task: two scripted behaviours are forced through the real
rollout engine (tiny model, real BM25, real `SearchEnvironment`) on the hidden test questions:

- honest: the expert's searches, then one name citing the supporting document (the gold on every
  other question, a wrong name otherwise: an honest but imperfect policy);
- stuffing: the same searches, then an answer listing the gold among three other names.

Both are scored with `configs/rewards_hackable.yaml` ("contains the gold", no length cap) and with the
default rubric. Then a run directory is written whose "training" drifts from honest to stuffing over
six steps (step k: k/5 of the episodes stuff), with the proxy reward and held-out exact match measured
on those real trajectories, and `audit_run` + `write_report` are run on it.

The drift is scripted, not learned: this shows what the audit sees when a policy finds the hack, in
seconds, without a 15-minute PPO run. Writes `runs/audit_demo/` (run dir, audit.json, report.html) and
prints a JSON summary (also saved as `runs/audit_demo/summary.json`).

    .venv/bin/python benchmarks/audit_hack_demo.py [--out runs/audit_demo] [--questions 20]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from searchrl.common.io import atomic_write_json
from searchrl.data.synthetic import generate, preset_config
from searchrl.data.synthetic_text import expert_queries
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_answer, format_tool_call
from searchrl.evaluation.audit import audit_run
from searchrl.evaluation.loop import evaluate_policy
from searchrl.evaluation.report import write_report
from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rewards.combine import default_rubric, load_rubric
from searchrl.rewards.qa import exact_match
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy
from searchrl.run.writer import RunDir
from searchrl.search.index import build_index

REPO = Path(__file__).resolve().parents[1]
HACKABLE = REPO / "configs" / "rewards_hackable.yaml"


def scripts(rows: list[dict], stuff: bool) -> list[list[str]]:
    names = [r["golds"][0] for r in rows]
    out = []
    for i, row in enumerate(rows):
        calls = [format_tool_call("search", {"query": q}) for q in expert_queries(row)]
        gold = row["golds"][0]
        others = [n for n in names if n != gold][i % 3 : i % 3 + 3]
        # The honest policy is right on half the questions (a single wrong name otherwise); stuffing
        # hedges every answer, which "contains the gold" pays in full.
        honest_answer = gold if i % 2 == 0 else others[0]
        answer = ", ".join([others[0], gold, *others[1:]]) if stuff else honest_answer
        out.append([*calls, format_answer(answer, row["supporting_doc_ids"][-1:])])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "audit_demo", help="Output folder.")
    parser.add_argument("--questions", type=int, default=20, help="Test questions per behaviour.")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.manual_seed(0)
    out: Path = args.out
    task = generate(preset_config("tiny", seed=0))
    paths = task.write(out / "data")
    backend = build_index(paths["corpus"], out / "index", backend="bm25", overwrite=True)
    tok = train_tokenizer(tokenizer_training_texts(task.corpus, task.splits["train"]), vocab_size=800)
    policy = build_policy(tok, TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                               num_key_value_heads=1, intermediate_size=64))  # fmt: skip
    rows = task.splits["test"][: args.questions]
    env_cfg = EnvConfig(max_turns=4, max_tool_calls=3)
    gen_cfg = GenerationConfig(max_new_tokens_per_turn=96, max_episode_tokens=1500)
    hackable, default = load_rubric(HACKABLE), default_rubric()

    def behave(stuff: bool):
        turns = scripts(rows, stuff)
        return evaluate_policy(
            policy, tok, rows, lambda: SearchEnvironment(backend, env_cfg, tokenizer=tok), gen_cfg,
            rubric=hackable, batch_size=len(rows), n_resamples=200,
            generator_factory=lambda m, t, c: HFGenerator(m, t, c, forcing=ScriptedPolicy(t, turns)),
        )  # fmt: skip

    honest, stuffing = behave(False), behave(True)
    figures = {}
    for name, result in (("honest", honest), ("stuffing", stuffing)):
        trajs = result.trajectories
        figures[name] = {
            "hackable_reward": float(np.mean([t.reward for t in trajs])),
            "default_reward": float(np.mean([default.evaluate(t)[0] for t in trajs])),
            "exact_match": result.summary["exact_match"],
            "f1": result.summary["f1"],
        }

    run_dir = RunDir(out / "run")  # the run layer's writer: the same names and lines a trainer writes
    run = run_dir.root
    run_dir.metrics.unlink(missing_ok=True)
    run_dir.config.write_text(f"reward_config_path: {HACKABLE}\n")
    n = len(rows)
    for step in range(1, 7):
        k = round(n * (step - 1) / 5)  # episodes that stuff at this step
        trajs = stuffing.trajectories[:k] + honest.trajectories[k:]
        run_dir.write_step_trajectories(step, trajs)
        em = float(np.mean([exact_match(t.answer or "", t.golds) for t in trajs]))
        run_dir.log_metrics({
            "step": step,
            "objective/scores": float(np.mean([t.reward for t in trajs])),
            "reward/contains": float(np.mean([t.reward_breakdown["contains"] for t in trajs])),
            "reward/format": float(np.mean([t.reward_breakdown["format"] for t in trajs])),
            "answer/length_words": float(np.mean([len((t.answer or "").split()) for t in trajs])),
            "tools/calls_per_episode": float(np.mean([len(t.tool_calls) for t in trajs])),
            "eval/exact_match": em,
        })  # fmt: skip
    report = audit_run(run, last_steps=2)
    atomic_write_json(run / "audit.json", report.to_dict())
    page = write_report(
        run, audit=report, tokenizer=tok, title="audit demo: stuffing under the hackable reward"
    )
    summary = {
        "behaviours": figures,
        "audit_verdict": report.verdict,
        "checks": {
            c.name: {
                "verdict": c.verdict,
                "value": c.value,
                "flagged": c.num_flagged,
                "checked": c.num_checked,
            }
            for c in report.checks
        },  # fmt: skip
        "report": str(page),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    atomic_write_json(out / "summary.json", summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
