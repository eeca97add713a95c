"""The real loop (issue 17) at toy size, the real-question expert, the baselines' forcing, configs and CLI.

One SmolLM2 import for the session (`support.smollm2.smollm2_import`: the demo's own import stage with
`model_dir: null`), one toy `run_real_demo` for the module (a few questions, three SFT steps, two PPO steps of
two episodes, short episodes): about two minutes of CPU. `searchrl eval` then evaluates the toy run's LoRA
checkpoint and its starting policy on a corpus and questions written here, from another working directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import typer.main
from test_rollout_engine import check_masks_and_spans
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.config import ConfigError, load_config
from searchrl.common.trajectory import read_trajectories
from searchrl.data.realqa import build_realqa
from searchrl.demo.baselines import RealGenerator
from searchrl.demo.configs import RealDemoConfig, check_real_config, is_real_demo_yaml, toy_real_config
from searchrl.demo.layouts import BASELINE_FILES, real_demo_layout
from searchrl.demo.real import import_base, run_real_demo
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_search_r1_call
from searchrl.models.io import load_policy, load_tokenizer
from searchrl.ppo.config import PPOConfig
from searchrl.rewards.citation import citation_status
from searchrl.rewards.qa import contains_answer
from searchrl.rollout.generator import GenerationConfig
from searchrl.search.index import build_index
from searchrl.sft.examples import sft_example
from searchrl.sft.forcing import baseline_forcing, question_query
from searchrl.sft.real_expert import RealExpert, RealExpertConfig

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
# A corpus and questions no stage of the demo ever saw, with fields searchrl does not use (ignored).
FRESH_CORPUS = [
    {
        "id": "w1",
        "title": "Lake Orvan",
        "contents": "Lake Orvan is a lake in the Brindle Hills. Its deepest point is 84 metres.",
        "url": "https://example.org/lake-orvan",
        "views": 12,
    },
    {
        "id": "w2",
        "title": "Brindle Hills",
        "contents": "The Brindle Hills are a range of low hills whose highest peak is Mount Sele.",
        "lang": "en",
    },
    {"id": "w3", "title": "Mount Sele", "contents": "Mount Sele was first climbed by Ilsa Marrow in 1921."},
]
FRESH_QUESTIONS = [
    {"id": "fq1", "question": "How deep is Lake Orvan?", "golds": ["84 metres"], "difficulty": "easy"},
    {
        "id": "fq2",
        "question": "Who first climbed Mount Sele?",
        "golds": ["Ilsa Marrow"],
        "source": "invented",
    },
    {
        "id": "fq3",
        "question": "What is the highest peak of the hills that hold Lake Orvan?",
        "golds": ["Mount Sele"],
        "supporting_titles": ["Lake Orvan", "Brindle Hills"],
    },
]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory, smollm2_dir):
    out = tmp_path_factory.mktemp("demo-real") / "run"
    cfg = toy_real_config(str(out), str(smollm2_dir))
    summary = run_real_demo(cfg)
    return SimpleNamespace(out=out, cfg=cfg, summary=summary)


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def realqa(tmp_path_factory):
    """The shipped HotpotQA + SQuAD slices, split, with a BM25 index over their corpus."""
    task = build_realqa("both", seed=0)
    root = tmp_path_factory.mktemp("realqa")
    task.write(root)
    backend = build_index(root / "corpus.jsonl", root / "index")
    backend.search(["warm up"], 1)
    docs = {d["id"]: d for d in task.corpus}
    return SimpleNamespace(task=task, backend=backend, docs=docs)


# -- the toy run end to end -----------------------------------------------------------------------------------


def test_toy_run_writes_the_layout_and_every_summary_key(toy_run):
    out, s = toy_run.out, toy_run.summary
    for path in (
        "demo_config.yaml",
        "summary.json",
        "data/corpus.jsonl",
        "data/test.jsonl",
        "data/meta.json",
    ):
        assert (out / path).is_file(), path
    assert (out / "index" / "meta.json").is_file()
    assert (out / "sft" / "policy" / "model.safetensors").is_file() and (
        out / "sft" / "expert.jsonl.gz"
    ).is_file()
    for path in ("config.yaml", "manifest.json", "metrics.jsonl"):  # a normal PPO run directory
        assert (out / "ppo" / path).is_file(), path
    assert list((out / "ppo" / "checkpoints").glob("step-*/trainer_state.json"))
    assert list((out / "ppo" / "trajectories").glob("step-*.jsonl.gz"))
    names = [*BASELINE_FILES.values(), "sft-test", "ppo-test", "grpo-test"]
    for name in names:
        assert (out / "eval" / f"{name}.json").is_file(), name
        assert (out / "eval" / f"{name}.trajectories.jsonl.gz").is_file(), name  # the run writer's one suffix
    # summary.json: the returned figures, and the demo's layout (what the run reader reads the folder by).
    written = json.loads((out / "summary.json").read_text())
    assert written.pop("layout") == real_demo_layout(toy_run.cfg.baselines, grpo=True).to_dict()
    assert written == json.loads(json.dumps(s))
    assert load_config(RealDemoConfig, out / "demo_config.yaml") == toy_run.cfg

    assert set(s["baselines"]) == {"closed_book", "naive_rag", "zero_shot"}
    n_test = sum(toy_run.cfg.test_questions.values())
    stages = [s["sft"]["test"], s["ppo"]["test"], s["grpo"]["test"]]
    for stage in [s["baselines"][b]["test"] for b in s["baselines"]] + stages:
        assert stage["n"] == n_test
        for key in ("exact_match", "f1", "citation_support", "format_valid", "searches_per_question"):
            low, high = stage["ci95"][key]
            assert low <= stage[key] <= high, key
        assert set(stage["by_type"]) <= {"bridge", "comparison", "squad"} and stage["by_type"]
        assert sum(g["n"] for g in stage["by_type"].values()) == n_test
    assert list(s["stages_seconds"]) == [
        "import",
        "data",
        "index",
        "base closed_book",
        "base naive_rag",
        "base zero_shot",
        "expert",
        "sft",
        "eval sft",
        "ppo",
        "eval ppo",
        "grpo",
        "eval grpo",
    ]
    assert set(s["stages_cpu_seconds"]) == set(s["stages_seconds"])
    assert s["imported_now"] is False  # model_dir given: nothing imported
    assert s["wall_seconds"] > 0 and s["peak_rss_mb"] > 500 and s["torch_threads"] >= 1
    # The thread count was decided before every stage (auto: from the others' measured CPU use).
    assert set(s["threads"]["per_stage"]) == set(s["stages_seconds"]) and "per stage" in s["threads"]["rule"]
    assert all(1 <= d["threads"] <= 2 for d in s["threads"]["per_stage"].values())
    assert set(s["eval_seconds"]) == {n for n in s["stages_seconds"] if n.startswith(("base ", "eval "))}
    assert all(e["questions"] == n_test and e["questions_per_s"] > 0 for e in s["eval_seconds"].values())
    assert set(s["targets"]) >= {"sft_format_valid_ge_0.95", "ppo_em_ge_sft", "ppo_kl_nonzero_after_step_1"}
    assert s["sft"]["demonstrations_trained"] >= 1 and s["sft"]["finetune"] == "lora"
    assert 0 < s["sft"]["trainable_parameters"] < s["sft"]["total_parameters"] / 10  # LoRA: a few percent


def test_toy_run_reports_paired_differences_on_the_same_questions(toy_run):
    s, out = toy_run.summary, toy_run.out
    expected = {
        "ppo_minus_sft",
        "ppo_minus_naive_rag",
        "sft_minus_naive_rag",
        "grpo_minus_sft",
        "grpo_minus_ppo",
    }
    assert expected <= set(s)
    for name in expected:
        for metric in ("exact_match", "f1"):
            diff = s[name]["test"][metric]
            low, high = diff["ci95"]
            assert low <= diff["mean"] <= high and diff["n"] == s["test_questions"], (name, metric)
    # The mean difference is the difference of the two headline means (the same questions on both sides).
    for name, (a, b) in {"ppo_minus_sft": ("ppo", "sft"), "grpo_minus_ppo": ("grpo", "ppo")}.items():
        for metric in ("exact_match", "f1"):
            assert s[name]["test"][metric]["mean"] == pytest.approx(
                s[a]["test"][metric] - s[b]["test"][metric]
            )
    rag = s["baselines"]["naive_rag"]["test"]["f1"]
    assert s["ppo_minus_naive_rag"]["test"]["f1"]["mean"] == pytest.approx(s["ppo"]["test"]["f1"] - rag)
    assert {"ppo_minus_sft_em_ge_0.05", "ppo_minus_sft_em_ci_above_0", "ppo_minus_sft_f1_ci_above_0"} <= set(
        s["targets"]
    )
    # GRPO: a normal run directory, stopped by its wall-clock budget, from the SFT policy with a LoRA adapter.
    g = s["grpo"]
    assert g["mode"] == "our_rollout" and g["steps"] >= 1 and g["stopped_by_wall_clock"] is True
    assert g["budget_train_s"] == 1.0 and g["train_s"] >= 1.0 and g["episodes"] >= 2
    for path in ("config.yaml", "manifest.json", "metrics.jsonl"):
        assert (out / "grpo" / path).is_file(), path
    policy = next((out / "grpo" / "checkpoints").glob("step-*/policy"))
    assert (policy / "adapter_config.json").is_file()
    assert (
        json.loads((policy / "adapter_config.json").read_text())["base_model_name_or_path"]
        == str((out / "sft" / "policy").resolve())
        or (policy / "adapter_model.safetensors").is_file()
    )


def test_toy_run_changes_the_weights_in_sft_and_ppo(toy_run, smollm2_dir):
    s = toy_run.summary
    assert s["sft"]["max_weight_change"] > 0 and s["ppo"]["max_weight_change"] > 0
    # The saved warm start is not the base model (LoRA merged into the weights).
    base = load_policy(smollm2_dir)
    sft = load_policy(toy_run.out / "sft" / "policy")
    diffs = [
        float((a.detach() - b.detach()).abs().max())
        for (name, a), (_, b) in zip(base.named_parameters(), sft.named_parameters(), strict=True)
        if name.endswith("q_proj.weight")
    ]
    assert max(diffs) > 0
    # PPO's checkpoint holds an adapter whose B matrices moved off their zero start.
    from safetensors.torch import load_file

    adapter = load_file(
        str(next((toy_run.out / "ppo" / "checkpoints").glob("step-*/policy")) / "adapter_model.safetensors")
    )
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert lora_b and max(float(t.abs().max()) for t in lora_b) > 0


def test_toy_run_ppo_has_a_working_reference(toy_run):
    kl = toy_run.summary["ppo"]["objective/kl"]
    assert len(kl) == toy_run.summary["ppo"]["steps"] >= 2
    assert abs(kl[0]) < 1e-6  # before the first update the policy is its reference (LoRA B starts at 0)
    assert any(abs(k) > 1e-6 for k in kl[1:])  # after it, the frozen reference differs from the policy
    assert toy_run.summary["targets"]["ppo_kl_nonzero_after_step_1"] is True


def test_reuse_warm_start_reruns_ppo_on_the_same_warm_start(toy_run, tmp_path):
    """`reuse_warm_start`: baselines, demonstrations, SFT and its evaluation are read back (not rerun, their
    files untouched); PPO trains afresh from the SFT files to the same step scores; the summary compares the
    new PPO with the read-back trajectories, question by question."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(toy_run.out, out)
    before = json.loads((out / "summary.json").read_text())
    kept = {p: (out / p).read_bytes() for p in ("sft/policy/model.safetensors", "eval/sft-test.json")}
    cfg = dataclasses.replace(toy_run.cfg, out_dir=str(out), reuse_warm_start=True)
    cfg.grpo = dataclasses.replace(cfg.grpo, enabled=False)  # a PPO-side change: still the same warm start
    summary = run_real_demo(cfg)

    assert summary["warm_start"]["reused"] is True and before["warm_start"] == {"reused": False}
    assert list(summary["stages_seconds"]) == ["import", "data", "index", "ppo", "eval ppo"]
    assert summary["warm_start"]["stages_seconds_when_trained"]["sft"] == before["stages_seconds"]["sft"]
    assert all((out / p).read_bytes() == b for p, b in kept.items())
    assert summary["baselines"] == before["baselines"] and summary["sft"]["test"] == before["sft"]["test"]
    for key in ("final_loss", "max_weight_change", "num_demonstrations", "demonstrations_trained"):
        assert summary["sft"][key] == before["sft"][key], key
    assert (
        summary["ppo"]["objective/scores"] == before["ppo"]["objective/scores"]
    )  # same warm start, same PPO
    assert "grpo" not in summary and not (out / "grpo").exists()  # the old GRPO run was removed
    steps = [json.loads(line)["step"] for line in (out / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # one PPO run, not two appended
    diff = summary["ppo_minus_sft"]["test"]["f1"]
    assert diff["mean"] == pytest.approx(summary["ppo"]["test"]["f1"] - before["sft"]["test"]["f1"])


def test_reuse_warm_start_refuses_other_settings_and_missing_files(toy_run, tmp_path):
    from searchrl.demo.real_reuse import find_real_warm_start

    hotter = dataclasses.replace(toy_run.cfg.generation, temperature=1.0)  # PPO's sampling only: reusable
    same, why = find_real_warm_start(
        dataclasses.replace(toy_run.cfg, num_threads=1, generation=hotter), toy_run.out
    )
    assert same is not None and why == "" and len(same.sft_trajectories) == toy_run.summary["test_questions"]
    greedy_off = dataclasses.replace(
        toy_run.cfg.generation, eval_temperature=0.5
    )  # evaluations: not reusable
    found, why = find_real_warm_start(dataclasses.replace(toy_run.cfg, generation=greedy_off), toy_run.out)
    assert found is None and why.endswith("other settings: generation")
    other = dataclasses.replace(toy_run.cfg, sft=dataclasses.replace(toy_run.cfg.sft, learning_rate=1e-3))
    found, why = find_real_warm_start(other, toy_run.out)
    assert found is None and why.endswith("trained its warm start with other settings: sft")
    found, why = find_real_warm_start(toy_run.cfg, tmp_path)
    assert found is None and "no finished warm start" in why and "sft-test.trajectories.jsonl.gz" in why


def test_model_dir_null_imports_smollm2_into_base_once(smollm2_import):
    # The session's import is the demo's import stage with model_dir null: it wrote <out_dir>/base ...
    root, base = smollm2_import.root, smollm2_import.out
    assert smollm2_import.imported_now is True and base == root / "base"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "import_manifest.json"):
        assert (base / name).is_file(), name
    assert load_tokenizer(base).pad_token_id != load_tokenizer(base).eos_token_id
    # ... and a second run of the stage finds the complete import and keeps it.
    stamp = (base / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    assert import_base(RealDemoConfig(out_dir=str(root), model_dir=None), root) == (base, False)
    assert time.perf_counter() - started < 2 and (base / "model.safetensors").stat().st_mtime_ns == stamp


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_eval_of_the_lora_run_on_unseen_data_from_another_directory(toy_run, tmp_path, monkeypatch):
    from searchrl.demo.baselines import real_generator_factory
    from searchrl.evaluation.targets import evaluate_run, load_policy_for_eval
    from searchrl.run.reader import RunReader

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    _write_jsonl(fresh / "corpus.jsonl", FRESH_CORPUS)
    _write_jsonl(fresh / "test.jsonl", FRESH_QUESTIONS)
    built = runner.invoke(
        app, ["index", "--corpus", str(fresh / "corpus.jsonl"), "--out", str(fresh / "index")]
    )
    assert built.exit_code == 0, built.output
    run, sft = toy_run.out / "ppo", toy_run.out / "sft" / "policy"
    latest = RunReader(run).latest_checkpoint()
    adapter_config = latest / "policy" / "adapter_config.json"
    original = adapter_config.read_text()
    # The demo records the adapter's base (the SFT policy) by its absolute path ...
    assert json.loads(original)["base_model_name_or_path"] == str(sft.resolve())
    # ... but a run trained from a relative path records it relative to where training ran (`make demo-real`:
    # runs/demo-real/sft/policy from the repository root). Make it so, then evaluate from elsewhere.
    relative = os.path.relpath(sft, toy_run.out.parent)
    adapter_config.write_text(json.dumps({**json.loads(original), "base_model_name_or_path": relative}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    results = {}
    try:
        assert not (elsewhere / relative).exists()
        for name, pick in (
            ("latest", []),
            ("initial", ["--checkpoint", "initial"]),
            ("sft", ["--model", str(sft)]),
        ):
            out = tmp_path / f"{name}.json"
            args = ["eval", "--run", str(run), *pick, "--data", str(fresh), "--index", str(fresh / "index")]
            result = runner.invoke(app, [*args, "--bootstrap", "20", "--out", str(out)])
            assert result.exit_code == 0, result.output
            trajs = read_trajectories(out.with_name(f"{name}.trajectories.jsonl.gz"))
            results[name] = (json.loads(out.read_text()), trajs)
        # The toy policy seldom searches on its own: force the naive-RAG search to see the fresh index answer.
        forced, _ = evaluate_run(
            run,
            data_dir=fresh,
            index_dir=fresh / "index",
            output=tmp_path / "forced.json",
            n_resamples=20,
            generator_factory=real_generator_factory(False, "naive_rag"),
        )
        reader = RunReader(run)
        merged, _ = load_policy_for_eval(reader, reader.config, latest / "policy")
    finally:
        adapter_config.write_text(original)

    fresh_ids = {d["id"] for d in FRESH_CORPUS}
    env = dataclasses.asdict(toy_run.cfg.environment.env_config())
    for name, (data, trajs) in results.items():
        assert data["n"] == len(FRESH_QUESTIONS) and data["data"] == str(fresh / "test.jsonl"), name
        assert data["index"] == str(fresh / "index")
        assert data["env_config"] == env  # the run's prompt, protocol and budgets
        assert [t.question_id for t in trajs] == [q["id"] for q in FRESH_QUESTIONS]
        assert all(set(c.doc_ids) <= fresh_ids for t in trajs for c in t.tool_calls)
    searched = [t.tool_calls[0].doc_ids for t in forced.trajectories]
    assert [ids[0] for ids in searched[:2]] == ["w1", "w3"]  # BM25 over the corpus written here
    assert all(set(ids) <= fresh_ids for ids in searched)
    latest_data, _ = results["latest"]
    assert latest_data["checkpoint"] == latest.name and latest_data["model"] == str(latest / "policy")
    # --checkpoint initial is the run's starting policy, the SFT policy: the same greedy episodes as --model.
    initial_data, initial_trajs = results["initial"]
    assert initial_data["checkpoint"] == "initial" and initial_data["step"] == 0
    assert Path(initial_data["model"]).resolve() == sft.resolve()
    sft_trajs = results["sft"][1]
    assert [t.input_ids for t in initial_trajs] == [t.input_ids for t in sft_trajs]
    assert [t.answer for t in initial_trajs] == [t.answer for t in sft_trajs]
    # The latest checkpoint is the SFT policy with PPO's adapter merged in, not the SFT policy itself.
    assert not any("lora" in n for n, _ in merged.named_parameters())
    sft_weights = dict(load_policy(sft).named_parameters())
    moved = [
        float((p.detach() - sft_weights[n].detach()).abs().max())
        for n, p in merged.named_parameters()
        if n.endswith("q_proj.weight")
    ]
    assert max(moved) > 0


def test_baselines_force_their_turns(toy_run, tok):
    test_rows = [json.loads(line) for line in (toy_run.out / "data" / "test.jsonl").read_text().splitlines()]
    questions = {r["id"]: r["question"] for r in test_rows}

    def actions(traj):
        return [sp.text for sp in traj.spans if sp.kind == "action"]

    rag = read_trajectories(toy_run.out / "eval" / "base-test-naive-rag.trajectories.jsonl.gz")
    closed = read_trajectories(toy_run.out / "eval" / "base-test-closed-book.trajectories.jsonl.gz")
    zero = read_trajectories(toy_run.out / "eval" / "base-test-zero-shot.trajectories.jsonl.gz")
    for traj in rag:
        check_masks_and_spans(traj)
        turns = actions(traj)
        assert turns[0] == format_search_r1_call(question_query(questions[traj.question_id]))
        assert len(turns) >= 2 and turns[1].startswith("<answer>")
        assert len(traj.tool_calls) >= 1 and traj.tool_calls[0].status == "ok" and traj.tool_calls[0].doc_ids
    for traj in closed:
        check_masks_and_spans(traj)
        assert actions(traj)[0].startswith("<answer>") and not traj.retrieved
    # The zero-shot agent is not forced: a RealGenerator for it carries no forcing hook.
    assert zero and all(t.spans[1].kind == "action" for t in zero)
    gen = RealGenerator(None, tok, GenerationConfig(), baseline="zero_shot")
    row = {"question": "Who wrote it?"}
    env = SimpleNamespace(config=EnvConfig(protocol="search_r1"))
    assert gen.baseline is None and baseline_forcing(gen.baseline, tok, [env], [row]) is None
    rag = baseline_forcing(
        RealGenerator(None, tok, GenerationConfig(), baseline="naive_rag").baseline, tok, [env], [row]
    )
    forced = []
    for turn in range(2):
        ids: list[int] = []
        while (token := rag(0, turn, len(ids))) is not None:
            ids.append(token)
        forced.append(ids)
    assert [tok.decode(t) for t in forced] == ["<search>Who wrote it?</search>", "<answer>"]


# -- the real expert -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["search_r1", "chat"])
def test_real_expert_demonstrations_are_supported_and_masked(realqa, tok, protocol):
    rows = [r for r in realqa.task.splits["train"] if r["source"] == "hotpotqa"][:16]
    rows += [r for r in realqa.task.splits["train"] if r["source"] == "squad"][:16]
    env_cfg = EnvConfig(
        protocol=protocol,
        topk=1,
        citation_style="number",
        max_observation_tokens=256,
        max_turns=4,
        max_tool_calls=3,
        max_episode_tokens=1024,
    )
    envs = [SearchEnvironment(realqa.backend, env_cfg, tokenizer=tok) for _ in rows]
    gen = GenerationConfig(max_new_tokens_per_turn=96, max_episode_tokens=1024)
    trajs = RealExpert(RealExpertConfig()).demonstrate(tok, envs, rows, gen)
    checked = 0
    for traj, row in zip(trajs, rows, strict=True):
        check_masks_and_spans(traj)
        example = sft_example(traj)  # SFT labels sit exactly on the action tokens
        assert [x != -100 for x in example["labels"]] == [bool(m) for m in traj.action_mask]
        assert traj.termination == "answered" and traj.metadata["expert_searches"]
        assert traj.metadata["expert_searches"][0] == question_query(row["question"])
        shown_support = [d for d in row["supporting_doc_ids"] if d in traj.retrieved]
        gold_in_support = [
            d for d in shown_support if any(contains_answer(traj.retrieved[d], g) for g in row["golds"])
        ]
        if gold_in_support:  # the gold is in a supporting paragraph it read: it must answer it and cite that
            checked += 1
            assert traj.metadata["supported"] is True
            assert citation_status(traj) == "supported"
            assert any(contains_answer(traj.retrieved[d], traj.answer) for d in traj.citations)
            assert traj.answer in row["golds"]
        if row["type"] == "bridge" and len(traj.metadata["expert_searches"]) == 2:
            # The second search is a supporting paragraph's title the first one did not show.
            assert traj.metadata["expert_searches"][1] in row["supporting_titles"]
    assert checked >= 16, f"only {checked} of {len(rows)} demonstrations read their gold"
    two_hop = [
        t for t, r in zip(trajs, rows, strict=True) if r["source"] == "hotpotqa" and len(t.tool_calls) == 2
    ]
    assert two_hop, "no HotpotQA demonstration searched a second paragraph"


def test_real_expert_refuses_bad_rows_and_budgets(realqa, tok):
    env = SearchEnvironment(
        realqa.backend, EnvConfig(protocol="search_r1", max_turns=2, max_tool_calls=2), tok
    )
    row = realqa.task.splits["train"][0]
    with pytest.raises(ValueError, match="max_turns >= 3"):
        RealExpert().demonstrate(tok, [env], [row])
    with pytest.raises(ValueError, match="supporting_doc_ids"):
        RealExpert().demonstrate(tok, [env], [{"question": "q?", "golds": ["a"]}])
    with pytest.raises(ConfigError, match="title_search_sources"):
        RealExpertConfig(title_search_sources=["wiki"])


# -- configs and the command line --------------------------------------------------------------------------------


def test_shipped_configs_load():
    path = ROOT / "configs" / "demo_real.yaml"
    assert is_real_demo_yaml(path) and not is_real_demo_yaml(ROOT / "configs" / "ppo_tiny.yaml")
    cfg = load_config(RealDemoConfig, path)
    assert (
        cfg.kind == "real"
        and cfg.environment.protocol in ("search_r1", "chat")
        and cfg.out_dir == "runs/demo-real"
    )
    qwen = load_config(PPOConfig, ROOT / "configs" / "real" / "qwen2.5-3b_ppo.yaml")
    assert qwen.rollout_backend == "vllm" and qwen.mixed_precision == "bf16" and qwen.topk == 3
    assert (
        qwen.finalize(num_train_rows=10_000).batch_size > cfg.ppo.finalize(num_train_rows=10_000).batch_size
    )


def test_gpu_configs_for_qwen_load_and_agree():
    """configs/real/: the real loop and a full-parameter PPO run at Qwen2.5-3B on one GPU (not run here)."""
    demo = load_config(RealDemoConfig, ROOT / "configs" / "real" / "demo_real_qwen2.5-3b.yaml")
    check_real_config(demo)  # what run_real_demo refuses before any slow step
    assert demo.kind == "real" and demo.model_dir and demo.out_dir == "runs/demo-real-qwen2.5-3b"
    assert (
        demo.generation.rollout_backend == "vllm"
        and not demo.ppo.use_cpu
        and demo.environment.protocol == "chat"
    )
    assert demo.finetune == "lora" and demo.ppo.value_mode == "shared_backbone"
    # Uncapped: every question of every split (caps above the slices' sizes).
    task = build_realqa(
        demo.source, seed=demo.seed, dev_fraction=demo.dev_fraction, test_fraction=demo.test_fraction
    )
    for split, caps in (
        ("train", demo.train_questions),
        ("dev", demo.dev_questions),
        ("test", demo.test_questions),
    ):
        for source in ("hotpotqa", "squad"):
            assert caps[source] >= sum(r["source"] == source for r in task.splits[split]), (split, source)
    n_train = len(task.splits["train"])
    steps = demo.ppo_config().finalize(num_train_rows=n_train)
    assert steps.batch_size == 64 and 50 <= steps.num_total_batches <= 200
    # The PPO config reads what the Qwen demo writes (its data, index and SFT policy) with the same episode.
    ppo = load_config(PPOConfig, ROOT / "configs" / "real" / "qwen2.5-3b_ppo.yaml")
    out = Path(demo.out_dir)
    assert (
        Path(ppo.train_file) == out / "data" / "train.jsonl"
        and Path(ppo.dev_file) == out / "data" / "dev.jsonl"
    )
    assert Path(ppo.index_dir) == out / "index" and Path(ppo.policy_model_path) == out / "sft" / "policy"
    assert ppo.env_config() == demo.environment.env_config()
    full = ppo.finalize(num_train_rows=n_train)
    assert full.batch_size == 64 and full.num_total_batches == steps.num_total_batches
    assert ppo.value_mode == "separate" and ppo.rollout_backend == "vllm"


def test_bad_real_configs_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: real\ntrain_questions: {wiki: 3}\n")
    with pytest.raises(ConfigError, match="unknown source"):
        load_config(RealDemoConfig, bad)
    bad.write_text("kind: real\nbaselines: [oracle]\n")
    with pytest.raises(ConfigError, match="baselines"):
        load_config(RealDemoConfig, bad)
    cfg = dataclasses.replace(RealDemoConfig(), expert=RealExpertConfig(max_searches=4))
    with pytest.raises(ConfigError, match="max_searches"):
        run_real_demo(cfg)


def test_demo_command_dispatches_a_real_yaml(tmp_path, monkeypatch):
    import searchrl.demo.real as real

    seen = {}

    def fake(cfg):
        seen["cfg"] = cfg
        test = {"exact_match": 0.5, "f1": 0.6, "format_valid": 1.0}
        return {
            "baselines": {"naive_rag": {"test": test}},
            "sft": {"test": test},
            "ppo": {"test": test},
            "ppo_minus_sft": {
                "test": {m: {"mean": 0.1, "ci95": [0.0, 0.2], "n": 4} for m in ("exact_match", "f1")}
            },
            "wall_seconds": 1.0,
            "peak_rss_mb": 2.0,
        }

    monkeypatch.setattr(real, "run_real_demo", fake)
    result = runner.invoke(
        app, ["demo", "--config", str(ROOT / "configs" / "demo_real.yaml"), "--out", str(tmp_path), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert isinstance(seen["cfg"], RealDemoConfig) and seen["cfg"].out_dir == str(tmp_path)
    assert seen["cfg"].progress_bar is False and seen["cfg"].reuse_warm_start is False
    again = ["demo", "--config", str(ROOT / "configs" / "demo_real.yaml"), "--out", str(tmp_path), "--quiet"]
    assert runner.invoke(app, [*again, "--reuse-warm-start"]).exit_code == 0
    assert seen["cfg"].reuse_warm_start is True
    refused = runner.invoke(app, [*again, "--compare-grpo"])
    assert refused.exit_code != 0 and "grpo.enabled" in refused.output
    headline = json.loads(result.output[: result.output.rindex("}") + 1])
    assert headline["ppo.test.exact_match"] == 0.5
    # The paired difference on the same questions is in the headline; GRPO's only when it ran.
    assert headline["ppo_minus_sft.test.f1"] == {"mean": 0.1, "ci95": [0.0, 0.2], "n": 4}
    assert not any(key.startswith("grpo") for key in headline)
    help_text = runner.invoke(app, ["demo", "--help"]).output
    assert (
        "--real" in help_text and "kind: real" in typer.main.get_command(app).commands["demo"].params[1].help
    )
    assert torch.get_num_threads() >= 1
