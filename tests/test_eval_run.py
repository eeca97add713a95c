"""Evaluation through the real engine: the tiny model, real BM25 over the synthetic corpus, real environments.

A fixed tiny checkpoint is built once per module in a run-directory layout (config.yaml naming the data
and the index, checkpoints/step-N/policy with the tokenizer) so `searchrl eval` is exercised exactly as a
user runs it. Scripted turns are forced through the engine where the test needs known answers.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import pytest
import torch
from support.sample_runs import UNSEEN_CORPUS, UNSEEN_QUESTIONS, forced_turns, unseen_world
from typer.testing import CliRunner
from worlds import TINY_ONE_LAYER

from searchrl.cli import app
from searchrl.common.config import save_config
from searchrl.common.io import atomic_write_json
from searchrl.common.trajectory import read_trajectories
from searchrl.data.synthetic import generate, preset_config
from searchrl.data.synthetic_text import expert_queries
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_answer, format_tool_call
from searchrl.evaluation.loop import evaluate_during_training, evaluate_policy
from searchrl.evaluation.targets import evaluate_run
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.ppo.config import PPOConfig
from searchrl.rewards.combine import default_rubric
from searchrl.rollout.generator import HFGenerator, ScriptedPolicy
from searchrl.run.writer import eval_trajectories_path
from searchrl.search.index import build_index

TINY = TINY_ONE_LAYER


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("evalworld")
    task = generate(preset_config("tiny", seed=0))
    paths = task.write(root / "data")
    backend = build_index(paths["corpus"], root / "index", backend="bm25")
    backend.search(["warm up the numba kernels"], 1)
    tok = train_tokenizer(tokenizer_training_texts(task.corpus, task.splits["train"]), vocab_size=800)
    run = root / "run"
    config = PPOConfig(
        output_dir=str(run),
        train_file=str(paths["train"]),
        dev_file=str(paths["dev"]),
        index_dir=str(root / "index"),
        max_turns=3,
        max_tool_calls=3,
        max_new_tokens_per_turn=64,
        max_episode_tokens=600,
        progress_bar=False,
    )
    (run / "checkpoints").mkdir(parents=True)
    save_config(config, run / "config.yaml")
    for step in (1, 2):
        policy = build_policy(tok, dataclasses.replace(TINY, seed=step))
        folder = run / "checkpoints" / f"step-{step}"
        policy.save_pretrained(folder / "policy")
        tok.save_pretrained(folder / "policy")
        atomic_write_json(folder / "trainer_state.json", {"global_step": step})
    return {"root": root, "task": task, "backend": backend, "tok": tok, "run": run, "config": config}


def expert_turns(row: dict, answer: str) -> list[str]:
    calls = [format_tool_call("search", {"query": q}) for q in expert_queries(row)]
    return [*calls, format_answer(answer, row["supporting_doc_ids"][-1:])]


def test_evaluate_policy_scores_forced_expert_and_wrong_answers(world):
    rows = world["task"].splits["test"][:4]
    turns = [
        expert_turns(r, r["golds"][0]) if i < 2 else expert_turns(r, "Nobody Atall")
        for i, r in enumerate(rows)
    ]
    tok, cfg = world["tok"], world["config"]
    policy = build_policy(tok, TINY)
    env_cfg = cfg.env_config()
    result = evaluate_policy(
        policy,
        tok,
        rows,
        lambda: SearchEnvironment(world["backend"], env_cfg, tokenizer=tok),
        cfg.generation_config(),
        rubric=default_rubric(),
        batch_size=4,
        n_resamples=200,
        generator_factory=lambda m, t, c: HFGenerator(m, t, c, forcing=ScriptedPolicy(t, turns)),
    )
    trajs = result.trajectories
    assert [t.answer for t in trajs[:2]] == [r["golds"][0] for r in rows[:2]]
    assert result.summary["exact_match"] == pytest.approx(0.5)
    assert result.summary["format_valid"] == 1.0 and result.summary["termination"]["answered"] == 1.0
    assert [len(t.tool_calls) for t in trajs] == [r["hops"] for r in rows]
    assert result.summary["searches_per_question"] == pytest.approx(sum(r["hops"] for r in rows) / 4)
    assert [t.metadata["hops"] for t in trajs] == [r["hops"] for r in rows]
    assert result.summary["tool_failure_rate"] == 0.0
    assert all(t.reward is not None for t in trajs) and "reward" in result.summary
    assert result.generation_config["temperature"] == 0.0  # greedy, whatever the training temperature
    assert result.metrics()["eval/exact_match"] == pytest.approx(0.5)


def test_the_dev_loop_both_trainers_run_samples_each_chunk_with_its_own_seed(world):
    """`evaluate_during_training` (PPOTrainer.evaluate, GRPO's run callback): `evaluate_policy` at the
    run's evaluation temperature, the chunk starting at row i seeded `seed + i`, reduced to the dev line."""
    rows = world["task"].splits["dev"][:4]
    tok, cfg = world["tok"], world["config"]
    policy = build_policy(tok, TINY)
    env_cfg = cfg.env_config()

    def env():
        return SearchEnvironment(world["backend"], env_cfg, tokenizer=tok)

    config = dataclasses.replace(cfg.generation_config(), temperature=1.0, max_new_tokens_per_turn=8)
    seeds = []

    class RecordingGenerator(HFGenerator):  # a trainer's own engine, reused chunk after chunk
        def rollout(self, envs, rows, sampling=None):
            seeds.append((sampling.seed, sampling.temperature))
            return super().rollout(envs, rows, sampling)

    engine = RecordingGenerator(policy, tok, config)
    kwargs = {"rubric": default_rubric(), "batch_size": 2, "seed": 7}
    answers: dict[str, str] = {}
    line = evaluate_during_training(
        policy, tok, rows, env, config, generator=engine, answers_out=answers, **kwargs
    )
    assert seeds == [(7, 1.0), (9, 1.0)]  # sampled at the given temperature, not greedily
    assert engine.config == config  # the trainer's engine keeps its own config: the sampling went per call
    assert set(line) == {"eval/exact_match", "eval/f1", "eval/searches_per_question", "eval/reward"}
    result = evaluate_policy(policy, tok, rows, env, config, decode_greedy=False, **kwargs)
    direct = HFGenerator(policy, tok, dataclasses.replace(config, seed=9)).rollout([env(), env()], rows[2:])
    assert [t.input_ids for t in result.trajectories[2:]] == [t.input_ids for t in direct.trajectories]
    assert line["eval/reward"] == pytest.approx(sum(t.reward for t in result.trajectories) / 4)
    # answers_out: each question's answer by position and text (PPO's learning check compares them)
    assert answers == {f"{i}:{t.question}": t.answer or "" for i, t in enumerate(result.trajectories)}
    assert len(answers) == len(rows)
    unscored = evaluate_during_training(policy, tok, rows, env, config, batch_size=2, seed=7)
    assert "eval/reward" not in unscored and unscored["eval/f1"] == line["eval/f1"]


def _invoke(*args: str):
    result = CliRunner().invoke(app, ["eval", *args])
    return result


def test_cli_eval_on_a_fixed_checkpoint_is_deterministic(world):
    run = world["run"]
    args = ("--run", str(run), "--split", "test", "--limit", "4", "--bootstrap", "200", "--batch-size", "2")
    first = _invoke(*args)
    assert first.exit_code == 0, first.output
    out = run / "eval" / "test-step-2.json"
    one = out.read_text()
    first_trajs = [t.to_dict() for t in read_trajectories(eval_trajectories_path(out))]
    second = _invoke(*args)
    assert second.exit_code == 0, second.output
    a, b = json.loads(one), json.loads(out.read_text())
    a.pop("timing"), b.pop("timing")
    assert a == b
    assert a["checkpoint"] == "step-2" and a["step"] == 2 and a["split"] == "test" and a["n"] == 4
    assert sum(a["termination"].values()) == pytest.approx(1.0)
    assert a["generation_config"]["temperature"] == 0.0
    assert "exact_match" in first.output and "95% CI" in first.output
    trajs = read_trajectories(eval_trajectories_path(out))
    assert [t.to_dict() for t in trajs] == [
        {**d, "metadata": {**d["metadata"], "latency_s": t.metadata["latency_s"]}}
        for d, t in zip(first_trajs, trajs, strict=True)
    ]  # token for token the same rollouts; only the wall-clock latency differs
    assert len(trajs) == 4 and all(t.question_id.startswith("test-") for t in trajs)


def test_cli_eval_on_an_older_checkpoint_and_a_plain_model_path(world):
    run, root = world["run"], world["root"]
    older = _invoke("--run", str(run), "--checkpoint", "step-1", "--limit", "2", "--bootstrap", "50")
    assert older.exit_code == 0, older.output
    assert (run / "eval" / "test-step-1.json").exists()
    out = root / "plain.json"
    plain = _invoke(
        "--model",
        str(run / "checkpoints" / "step-1" / "policy"),
        "--data",
        str(root / "data"),
        "--index",
        str(root / "index"),
        "--split",
        "dev",
        "--limit",
        "3",
        "--bootstrap",
        "50",
        "--out",
        str(out),
    )
    assert plain.exit_code == 0, plain.output
    data = json.loads(out.read_text())
    assert data["split"] == "dev" and data["n"] == 3 and data["checkpoint"] == "policy"


def test_cli_eval_explains_what_is_missing(world, tmp_path):
    bad = _invoke("--run", str(world["run"]), "--checkpoint", "step-9")
    assert bad.exit_code != 0 and "step-1" in bad.output and "step-2" in bad.output
    nothing = _invoke("--run", str(tmp_path))
    assert nothing.exit_code != 0 and "config.yaml" in nothing.output
    neither = _invoke()
    assert neither.exit_code != 0 and "--model" in neither.output


def test_a_recorded_env_yaml_wins_over_what_the_ppo_config_implies(world, tmp_path):
    from searchrl.env.config import EnvConfig
    from searchrl.evaluation.targets import load_run_config
    from searchrl.run.reader import RunReader

    cfg = load_run_config(world["run"])
    implied = RunReader(world["run"]).environment()
    assert (implied.max_turns, implied.max_tool_calls, implied.max_episode_tokens) == (3, 3, 600)
    run = tmp_path / "run"
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    save_config(EnvConfig(max_turns=2, topk=2), run / "env.yaml")
    recorded = RunReader(run).environment()
    assert (recorded.max_turns, recorded.topk) == (2, 2)


def test_cli_eval_of_the_initial_policy_a_run_started_from(world, tmp_path):
    no_initial = _invoke("--run", str(world["run"]), "--checkpoint", "initial")
    assert no_initial.exit_code != 0 and "policy_model_path" in no_initial.output
    run = tmp_path / "run"
    run.mkdir()
    cfg = world["config"]
    start = world["run"] / "checkpoints" / "step-1" / "policy"
    save_config(
        PPOConfig(**{**cfg.__dict__, "policy_model_path": str(start), "output_dir": str(run)}),
        run / "config.yaml",
    )
    ok = _invoke("--run", str(run), "--checkpoint", "initial", "--limit", "2", "--bootstrap", "20")
    assert ok.exit_code == 0, ok.output
    data = json.loads((run / "eval" / "test-initial.json").read_text())
    assert data["checkpoint"] == "initial" and data["step"] == 0 and data["model"] == str(start)


def test_eval_initial_of_a_run_trained_with_a_relative_policy_path_works_from_any_directory(
    world, tmp_path, monkeypatch
):
    """`searchrl train` records policy_model_path as given (relative to where training ran); `eval --checkpoint
    initial` finds it from elsewhere through the folders above the run, and says what to do when it is gone."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    start = project / "start" / "policy"
    build_policy(world["tok"], TINY).save_pretrained(start)
    world["tok"].save_pretrained(start)
    elsewhere.mkdir()
    data = Path(world["config"].dev_file).parent
    values = {
        "policy_model_path": "start/policy",  # relative, as configs/ppo_tiny.yaml records its warm start
        "output_dir": "runs/tiny",
        "train_file": data / "train.jsonl",
        "dev_file": data / "dev.jsonl",
        "index_dir": world["root"] / "index",
        "reward_config_path": Path(__file__).resolve().parents[1] / "configs" / "rewards_default.yaml",
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "total_episodes": 2,
        "num_ppo_epochs": 1,
        "num_mini_batches": 1,
        "max_new_tokens_per_turn": 8,
        "max_episode_tokens": 600,
        "eval_on_start": "false",
        "eval_steps": 0,
        "collapse_guard": "false",
        "save_trajectories": "false",
        "progress_bar": "false",
    }
    sets = [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]
    monkeypatch.chdir(project)
    config = Path(__file__).resolve().parents[1] / "configs" / "ppo_tiny.yaml"
    trained = CliRunner().invoke(app, ["train", "--config", str(config), *sets])
    assert trained.exit_code == 0, trained.output
    run = project / "runs" / "tiny"
    assert "policy_model_path: start/policy" in (run / "config.yaml").read_text()

    monkeypatch.chdir(elsewhere)  # "start/policy" names nothing here
    args = ("--run", str(run), "--checkpoint", "initial", "--limit", "2", "--bootstrap", "20")
    ok = _invoke(*args)
    assert ok.exit_code == 0, ok.output
    evaluated = json.loads((run / "eval" / "test-initial.json").read_text())
    assert evaluated["checkpoint"] == "initial" and Path(evaluated["model"]) == start.resolve()

    start.rename(project / "start" / "moved")
    gone = _invoke(*args)
    assert gone.exit_code != 0
    assert "policy_model_path 'start/policy'" in gone.output and "--model DIR" in gone.output


def test_a_checkpoint_on_questions_and_a_corpus_the_run_never_saw(world, tmp_path):
    unseen = unseen_world(tmp_path)
    run = world["run"]
    temp_indexes = set(Path(tempfile.gettempdir()).glob("searchrl-eval-index-*"))
    result, path = evaluate_run(
        run,
        checkpoint="step-1",
        data_dir=unseen.questions,
        corpus=unseen.corpus,
        output=tmp_path / "unseen.json",
        n_resamples=50,
        generator_factory=forced_turns("doc"),
    )
    data = json.loads(path.read_text())
    assert (
        data["checkpoint"] == "step-1" and data["trainer"] == "ppo" and data["corpus"] == str(unseen.corpus)
    )
    assert data["data"] == str(unseen.questions) and data["n"] == len(UNSEEN_QUESTIONS)
    # The run's environment (config.yaml: 3 turns, 3 tool calls, 600 tokens), not the defaults.
    env = data["env_config"]
    assert (env["max_turns"], env["max_tool_calls"], env["max_episode_tokens"]) == (3, 3, 600)
    trajs = result.trajectories
    unseen_ids = {d["id"] for d in UNSEEN_CORPUS}
    assert [t.tool_calls[0].doc_ids[0] for t in trajs] == ["u1", "u3", "u4"]
    assert all(set(c.doc_ids) <= unseen_ids for t in trajs for c in t.tool_calls)
    assert [t.answer for t in trajs] == ["Tamsel", "Nobody", "Quillow"]
    assert data["exact_match"] == pytest.approx(2 / 3) and data["by_hops"]["2"]["exact_match"] == 1.0
    # The BM25 index built from --corpus lived in a temporary folder, removed afterwards.
    assert set(Path(tempfile.gettempdir()).glob("searchrl-eval-index-*")) == temp_indexes

    # The CLI, with the index built from that corpus: --data FILE --index DIR on the run's latest checkpoint.
    out = tmp_path / "cli.json"
    cli = _invoke("--run", str(run), "--data", str(unseen.questions), "--index", str(unseen.index),
                  "--bootstrap", "20", "--out", str(out))  # fmt: skip
    assert cli.exit_code == 0, cli.output
    data = json.loads(out.read_text())
    assert data["checkpoint"] == "step-2" and data["index"] == str(unseen.index) and data["n"] == 3
    assert [t.question_id for t in read_trajectories(eval_trajectories_path(out))] == ["n1", "n2", "n3"]
