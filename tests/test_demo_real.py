"""The real loop (issue 17) at toy size, the real-question expert, the baselines' forcing, configs and CLI.

One SmolLM2 import for the session (`real_model_support.smollm2_dir`), one toy `run_real_demo` for the module
(a few questions, three SFT steps, two PPO steps of two episodes, short episodes): about two minutes of CPU.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import typer.main
from real_model_support import smollm2_dir  # noqa: F401  (the session's one SmolLM2 import)
from test_rollout_engine import check_masks_and_spans
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.config import ConfigError, load_config
from searchrl.common.trajectory import read_trajectories
from searchrl.data.realqa import build_realqa
from searchrl.demo.real import (
    BASELINE_FILES,
    RealDemoConfig,
    RealGenerator,
    is_real_demo_yaml,
    run_real_demo,
    toy_real_config,
)
from searchrl.env.environment import EnvConfig, SearchEnvironment
from searchrl.env.protocol import format_search_r1_call
from searchrl.models.tiny import load_policy, load_tokenizer
from searchrl.ppo.config import PPOConfig
from searchrl.rewards.citation import citation_status
from searchrl.rewards.qa import contains_answer
from searchrl.rollout.generator import GenerationConfig
from searchrl.search.index import build_index
from searchrl.sft.real_expert import RealExpert, RealExpertConfig, question_query
from searchrl.sft.warm_start import sft_example

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory, smollm2_dir):  # noqa: F811
    out = tmp_path_factory.mktemp("demo-real") / "run"
    cfg = toy_real_config(str(out), str(smollm2_dir))
    summary = run_real_demo(cfg)
    return SimpleNamespace(out=out, cfg=cfg, summary=summary)


@pytest.fixture(scope="module")
def tok(smollm2_dir):  # noqa: F811
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
    names = [*BASELINE_FILES.values(), "sft-test", "ppo-test"]
    for name in names:
        assert (out / "eval" / f"{name}.json").is_file() and (out / "eval" / f"{name}.jsonl.gz").is_file(), (
            name
        )
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(s))
    assert load_config(RealDemoConfig, out / "demo_config.yaml") == toy_run.cfg

    assert set(s["baselines"]) == {"closed_book", "naive_rag", "zero_shot"}
    n_test = sum(toy_run.cfg.test_questions.values())
    for stage in [s["baselines"][b]["test"] for b in s["baselines"]] + [s["sft"]["test"], s["ppo"]["test"]]:
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
    ]
    assert set(s["stages_cpu_seconds"]) == set(s["stages_seconds"])
    assert s["imported_now"] is False  # model_dir given: nothing imported
    assert s["wall_seconds"] > 0 and s["peak_rss_mb"] > 500 and s["torch_threads"] >= 1
    assert set(s["targets"]) >= {"sft_format_valid_ge_0.95", "ppo_em_ge_sft", "ppo_kl_nonzero_after_step_1"}
    assert s["sft"]["demonstrations_trained"] >= 1 and s["sft"]["finetune"] == "lora"
    assert 0 < s["sft"]["trainable_parameters"] < s["sft"]["total_parameters"] / 10  # LoRA: a few percent


def test_toy_run_changes_the_weights_in_sft_and_ppo(toy_run, smollm2_dir):  # noqa: F811
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


def test_baselines_force_their_turns(toy_run, tok):
    test_rows = [json.loads(line) for line in (toy_run.out / "data" / "test.jsonl").read_text().splitlines()]
    questions = {r["id"]: r["question"] for r in test_rows}

    def actions(traj):
        return [sp.text for sp in traj.spans if sp.kind == "action"]

    rag = read_trajectories(toy_run.out / "eval" / "base-test-naive-rag.jsonl.gz")
    closed = read_trajectories(toy_run.out / "eval" / "base-test-closed-book.jsonl.gz")
    zero = read_trajectories(toy_run.out / "eval" / "base-test-zero-shot.jsonl.gz")
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
    assert gen.baseline is None and gen._forced_turns([env], [row]) == [[]]
    rag = RealGenerator(None, tok, GenerationConfig(), baseline="naive_rag")._forced_turns([env], [row])
    assert [tok.decode(t) for t in rag[0]] == ["<search>Who wrote it?</search>", "<answer>"]


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
        max_total_tokens=1024,
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
            "wall_seconds": 1.0,
            "peak_rss_mb": 2.0,
        }

    monkeypatch.setattr(real, "run_real_demo", fake)
    result = runner.invoke(
        app, ["demo", "--config", str(ROOT / "configs" / "demo_real.yaml"), "--out", str(tmp_path), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert isinstance(seen["cfg"], RealDemoConfig) and seen["cfg"].out_dir == str(tmp_path)
    assert seen["cfg"].progress_bar is False
    assert json.loads(result.output[: result.output.rindex("}") + 1])["ppo.test.exact_match"] == 0.5
    help_text = runner.invoke(app, ["demo", "--help"]).output
    assert (
        "--real" in help_text and "kind: real" in typer.main.get_command(app).commands["demo"].params[1].help
    )
    assert torch.get_num_threads() >= 1
