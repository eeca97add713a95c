"""`report.html`: one self-contained file with the plots, the tables and trajectories split into spans.

The trajectories come from the real rollout engine (tiny model, real BM25, scripted turns forced through
it) so they carry real prompt, action and observation spans; the metrics log uses the PPO trainer's
metric names. One test drives the real `PPOTrainer` for two steps and reports on that run.
"""

from __future__ import annotations

import base64
import html
import json
import re

import pytest
import torch
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.io import append_jsonl, atomic_write_json
from searchrl.env.environment import EnvConfig, SearchEnvironment
from searchrl.env.protocol import format_answer, format_tool_call
from searchrl.evaluation.evaluate import evaluate_for_training, evaluate_policy, evaluate_run
from searchrl.evaluation.report import render_trajectory, write_report
from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rewards.combine import default_rubric
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy
from searchrl.rollout.trajectory import write_trajectories
from searchrl.search.index import build_index

CORPUS = [
    {"id": "d1", "title": "Varnholt", "contents": "Varnholt is a river town in the province of Quessa."},
    {"id": "d2", "title": "Quessa", "contents": "Quessa is a mountain province; its capital is Orlenn."},
    {"id": "d3", "title": "Orlenn", "contents": "Orlenn was founded by the weaver Amsel Drov in 1288."},
    {"id": "d4", "title": "Amsel Drov", "contents": "Amsel Drov was a weaver born in Tiberk."},
]
QA = [
    {"id": "q1", "question": "In which province is Varnholt?", "golds": ["Quessa"], "hops": 1},
    {"id": "q2", "question": "Who founded Orlenn?", "golds": ["Amsel Drov"], "hops": 1},
    {"id": "q3", "question": "Where was the founder of Orlenn born?", "golds": ["Tiberk"], "hops": 2},
]
TINY = TinyModelConfig(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64
)
SCRIPTS = [
    [format_tool_call("search", {"query": "Varnholt province"}), format_answer("Quessa", ["d1"])],
    [format_tool_call("search", {"query": "Orlenn founded"}), format_answer("Nobody", ["d9"])],
    [
        format_tool_call("search", {"query": "Orlenn founded"}),
        format_tool_call("search", {"query": "Amsel Drov born"}),
        format_answer("Tiberk", ["d4"]),
    ],
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("reportworld")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    backend = build_index(corpus, root / "index", backend="bm25")
    tok = train_tokenizer(tokenizer_training_texts(CORPUS * 4, QA * 4), vocab_size=400)
    policy = build_policy(tok, TINY)
    result = evaluate_policy(
        policy,
        tok,
        QA,
        lambda: SearchEnvironment(backend, EnvConfig(max_turns=4), tokenizer=tok),
        GenerationConfig(max_new_tokens_per_turn=80, max_episode_tokens=900),
        rubric=default_rubric(),
        n_resamples=100,
        generator_factory=lambda m, t, c: HFGenerator(m, t, c, forcing=ScriptedPolicy(t, SCRIPTS)),
    )
    return {"root": root, "tok": tok, "result": result, "policy": policy}


def fake_training_log(run, steps: int = 6) -> None:
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "objective/scores": 0.1 * step,
            "objective/kl": 0.02 * step,
            "kl_coef": 0.05,
            "objective/entropy_per_token": 2.0 - 0.1 * step,
            "tools/calls_per_episode": 1.0 + 0.1 * step,
            "answer/length_words": 2.0,
            "reward/f1": 0.08 * step,
            "reward/format": 0.1,
            "reward/metric/exact_match": 0.5,
            "val/explained_variance": float("nan"),
        }
        if step % 2 == 0:
            row |= {"eval/exact_match": 0.1 * step, "eval/f1": 0.12 * step}
        append_jsonl(run / "metrics.jsonl", row)


def test_report_is_one_self_contained_file_with_plots_tables_and_spans(world, tmp_path):
    run = tmp_path / "run"
    fake_training_log(run)
    write_trajectories(run / "trajectories" / "step-000006.jsonl.gz", world["result"].trajectories)
    atomic_write_json(
        run / "eval" / "test-step-6.json",
        {"split": "test", "checkpoint": "step-6", "step": 6, **world["result"].summary},
    )
    summary = {
        "sft": {"test": {"exact_match": 0.4}},
        "ppo": {"test": {"exact_match": 0.85}},
        "wall_seconds": 12.5,
    }
    path = write_report(run, summary=summary, tokenizer=world["tok"])
    assert path == run / "report.html"
    text = path.read_text()
    assert sorted(p.name for p in run.iterdir() if p.suffix == ".html") == ["report.html"]
    # Self-contained: no external scripts, styles, images or fonts.
    assert 'src="http' not in text and "src='http" not in text and "<link" not in text
    assert "<script" not in text and "url(" not in text
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 8  # reward, components, held-out EM, reward vs EM, KL, entropy, searches, length
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    for title in ("Training reward", "Reward components", "Held-out exact match", "KL and KL coefficient", "Training reward vs held-out EM",
                  "Entropy per action token", "Searches per episode", "Answer length"):  # fmt: skip
        assert f"alt='{title}'" in text
    # Tables: the summary, the eval JSON with CIs by hops, the audit verdicts.
    assert "ppo.test.exact_match" in text and "0.850" in text
    assert "ppo − sft" in text and "+0.450" in text  # the side-by-side held-out comparison
    assert "test-step-6.json" in text and "1-hop (n=2)" in text and "2-hop (n=1)" in text
    assert "Reward-hacking audit" in text and "fabricated_citations" in text
    # Trajectories: action and observation spans, decoded per span, told apart by class.
    assert text.count('class="span action"') >= 3 and text.count('class="span observation"') >= 2
    assert "Amsel Drov born" in text and "weaver born in Tiberk" in text


def test_each_span_is_decoded_from_its_own_tokens(world):
    tok = world["tok"]
    traj = world["result"].trajectories[2]
    page = render_trajectory(traj, tok)
    kinds = re.findall(r'class="span (\w+)"', page)
    assert kinds[0] == "prompt" and kinds.count("action") == 3 and kinds.count("observation") == 2
    for span in traj.spans:
        if span.kind == "action":
            decoded = tok.decode(traj.input_ids[span.start : span.end], skip_special_tokens=False)
            assert html.escape(decoded) in page
    # Without a tokenizer the stored span text is shown instead.
    assert "Amsel Drov born" in render_trajectory(traj, None).replace("&quot;", '"')


def test_report_cli_and_an_empty_run(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(app, ["report", "--run", str(empty)])
    assert result.exit_code == 0, result.output
    assert "No metrics logged yet" in (empty / "report.html").read_text()
    missing = CliRunner().invoke(app, ["report", "--run", str(tmp_path / "nope")])
    assert missing.exit_code != 0 and "not found" in missing.output


def test_report_on_a_real_ppo_run_with_offline_eval_and_audit(world, tmp_path):
    from searchrl.ppo.config import PPOConfig
    from searchrl.ppo.trainer import PPOTrainer

    root, tok = world["root"], world["tok"]
    data = tmp_path / "data"
    data.mkdir()
    rows = QA + [{**r, "id": r["id"] + "b"} for r in QA]
    for split in ("train", "dev", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = PPOConfig(
        output_dir=str(tmp_path / "run"),
        train_file=str(data / "train.jsonl"),
        dev_file=str(data / "dev.jsonl"),
        index_dir=str(root / "index"),
        per_device_train_batch_size=3,
        total_episodes=6,
        num_ppo_epochs=1,
        max_turns=2,
        max_tool_calls=2,
        max_new_tokens_per_turn=16,
        max_episode_tokens=200,
        learning_rate=1e-3,
        save_steps=1,
        eval_steps=1,
        num_eval_questions=3,
        progress_bar=False,
    )
    from searchrl.evaluation.evaluate import env_config_from_ppo
    from searchrl.search.index import load_index

    backend = load_index(root / "index")
    env_cfg = env_config_from_ppo(args)
    trainer = PPOTrainer(
        args,
        tok,
        build_policy(tok, TINY),
        None,
        None,
        rows,
        reward_funcs=default_rubric(),
        environment=lambda: SearchEnvironment(backend, env_cfg, tokenizer=tok),
        eval_dataset=QA,
    )
    trainer.train()
    run = tmp_path / "run"
    # The hook PPOTrainer.evaluate can call: the offline loop on the trainer's own parts.
    flat = evaluate_for_training(trainer, QA, split="dev")
    assert {"eval/exact_match", "eval/f1", "eval/searches_per_question", "eval/reward"} <= set(flat)
    saved = json.loads((run / "eval" / "step-2.json").read_text())
    assert (
        saved["split"] == "dev" and saved["n"] == 3 and saved["eval/exact_match"] == flat["eval/exact_match"]
    )
    result, eval_path = evaluate_run(run, "test", "latest", n_resamples=50)
    assert eval_path.name == "test-step-2.json" and result.summary["n"] == 6
    path = write_report(run)
    text = path.read_text()
    assert "alt='KL and KL coefficient'" in text and "alt='Held-out exact match'" in text
    assert "test-step-2.json" in text and 'class="span action"' in text
    assert "verdict-" in text
