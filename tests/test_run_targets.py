"""What `searchrl view / audit / report / eval` accept, read through one `RunReader`, on real outputs.

The targets are built here: the real smoke demo (`smoke_config` + `run_demo`: a PPO run in `ppo/`, the SFT
and PPO hidden-test evaluations in `eval/`), a real one-step GRPO run, and a corpus with questions that no
run ever saw. Each command must take a demo directory, a PPO or GRPO run directory and (view, audit) one
trajectories file, and refuse anything else with a message naming what a valid target is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.sample_runs import (
    UNSEEN_CORPUS,
    UNSEEN_QUESTIONS,
    build_grpo_run,
    build_smoke_demo,
    forced_turns,
    unseen_world,
)
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.trajectory import read_trajectories, write_trajectories
from searchrl.demo.configs import DEMO_SYSTEM_PROMPT
from searchrl.evaluation.audit import audit_run, audit_trajectories
from searchrl.run.errors import VALID_TARGETS, RunTargetError
from searchrl.run.reader import RunReader

WIDE = {"COLUMNS": "2000"}  # rich wraps long messages at the terminal width; keep them on one line


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return build_smoke_demo(tmp_path_factory.mktemp("targets"))


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    return build_grpo_run(tmp_path_factory.mktemp("grpo-target"))


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def _snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in sorted(root.rglob("*"))}


# -------------------------------------------------------------------------------------------------
# RunReader: the kind of a target, its config class, its sources and eval files
# -------------------------------------------------------------------------------------------------


def test_reader_tells_a_demo_its_ppo_run_a_grpo_run_and_a_trajectories_file_apart(demo, grpo):
    from searchrl.grpo.config import GRPORunConfig
    from searchrl.ppo.config import PPOConfig

    before = _snapshot(demo)
    d = RunReader(demo)
    assert (d.kind, d.trainer, d.root, d.demo_root) == ("demo", "ppo", demo / "ppo", demo)
    assert d.config_class() is PPOConfig and isinstance(d.config, PPOConfig)
    assert d.manifest["config_class"] == "searchrl.ppo.config.PPOConfig"  # what the trainer wrote
    assert [s.id for s in d.trajectory_sources()] == ["train", "sft-test", "ppo-test"]
    train, sft, ppo = d.trajectory_sources()
    assert [p.name for p in train.files()] == ["step-000001.jsonl.gz", "step-000002.jsonl.gz"]
    assert (
        sft.files() == [demo / "eval" / "sft-test.trajectories.jsonl.gz"]
        and "SFT policy · hidden test split" in sft.label
    )
    assert ppo.files() == [demo / "eval" / "ppo-test.trajectories.jsonl.gz"] and "PPO policy" in ppo.label
    tests = {e.name: e for e in d.eval_files() if e.split == "test"}
    assert set(tests) == {"sft-test.json", "ppo-test.json", "sft-test-closed-book.json"}
    assert (
        tests["sft-test.json"].stage == "sft" and tests["sft-test-closed-book.json"].variant == "closed-book"
    )
    assert tests["sft-test-closed-book.json"].trajectories is None
    assert d.initial_policy() == demo / "sft" / "policy"  # PPO started from the SFT warm start
    assert d.index_dir == demo / "index" and d.split_file("test") == demo / "data" / "test.jsonl"
    assert d.tokenizer_dir() == d.latest_checkpoint() / "policy" and d.latest_checkpoint().name == "step-2"
    assert d.audit_path() == demo / "audit.json" and d.report_path() == demo / "report.html"

    inner = RunReader(demo / "ppo")  # the demo's PPO run on its own still knows its demo
    assert (inner.kind, inner.demo_root) == ("ppo", demo)
    assert [s.id for s in inner.trajectory_sources()] == ["train", "sft-test", "ppo-test"]

    g = RunReader(grpo.run)
    assert (g.kind, g.trainer, g.trainer_label, g.demo_root) == ("grpo", "grpo", "GRPO", None)
    assert g.config_class() is GRPORunConfig and g.config.num_generations == 2
    assert g.manifest["config_class"] == "searchrl.grpo.config.GRPORunConfig"
    assert g.initial_policy() == grpo.policy and g.index_dir == grpo.index
    assert [s.id for s in g.trajectory_sources()] == ["train"]

    f = RunReader(demo / "eval" / "ppo-test.trajectories.jsonl.gz")
    assert (f.kind, f.trainer, f.enclosing.kind) == ("trajectories", "ppo", "demo")
    (source,) = f.trajectory_sources()
    assert (
        source.files() == [demo / "eval" / "ppo-test.trajectories.jsonl.gz"] and "PPO policy" in source.label
    )
    assert f.tokenizer_dir() == d.tokenizer_dir()
    assert _snapshot(demo) == before, "the reader wrote or touched files"


README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_snippet_trains_in_the_demos_own_environment(demo, tmp_path, monkeypatch):
    """README's "Using it from Python": run as written (on this demo, short of `trainer.train()`), it gets the
    demo run's environment and rubric back through the reader, and its environment renders the very prompts the
    demo's episodes had, token for token (the defaults, `EnvConfig(max_turns=4)`, render another prompt)."""
    from searchrl.common.config import load_config
    from searchrl.demo.configs import DemoConfig
    from searchrl.env.config import EnvConfig
    from searchrl.env.environment import SearchEnvironment
    from searchrl.rollout.chat import prompt_ids

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Using it from Python") :]
    snippet = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 10)]
    assert (
        'RunReader("runs/demo")' in snippet
        and "demo.environment()" in snippet
        and "trainer.train()" in snippet
    )
    monkeypatch.chdir(tmp_path)  # args writes runs/my_run here
    names: dict = {}
    exec(snippet.replace('"runs/demo"', repr(str(demo))).replace("trainer.train()", ""), names)  # noqa: S102

    env_config, rubric, trainer = names["env_config"], names["rubric"], names["trainer"]
    demo_config = load_config(DemoConfig, demo / "demo_config.yaml")
    assert env_config == demo_config.environment.env_config()  # every setting of the demo's environment
    assert env_config == RunReader(demo / "ppo").config.env_config()  # ... which its PPO run recorded
    assert (env_config.protocol, env_config.system_prompt, env_config.topk) == ("chat", DEMO_SYSTEM_PROMPT, 1)
    assert env_config.tool_schema_in_prompt is demo_config.environment.tool_schema_in_prompt
    assert [s.name for s in rubric.specs] == [s.name for s in RunReader(demo).rubric().specs]
    tok = names["tokenizer"]
    episodes = [t for f in RunReader(demo).trajectory_sources()[0].files() for t in read_trajectories(f)]
    episodes += read_trajectories(demo / "eval" / "ppo-test.trajectories.jsonl.gz")
    default = SearchEnvironment(names["backend"], EnvConfig(max_turns=4), tokenizer=tok)
    for t in episodes:
        row = {"id": t.question_id, "question": t.question, "golds": t.golds}
        env = trainer.env_factory()  # the snippet's own environment factory
        assert prompt_ids(tok, env.reset(row), env.tools) == t.input_ids[: t.prompt_length], t.id
        assert prompt_ids(tok, default.reset(row), default.tools) != t.input_ids[: t.prompt_length]
    assert len(episodes) == 32


def test_the_manifest_names_the_trainer(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"trainer": "grpo"}))
    assert RunReader(run).kind == "grpo"
    (run / "manifest.json").write_text(json.dumps({"extra": {"trainer": "ppo"}}))
    assert RunReader(run).kind == "ppo"
    (run / "manifest.json").write_text(json.dumps({"trainer": "sft"}))
    with pytest.raises(RunTargetError, match=r"trainer 'sft' is not one of \['ppo', 'grpo'\]"):
        RunReader(run)
    (run / "manifest.json").unlink()
    # Without a manifest the trainer is not guessed from config fields: a checkpoint's record names it, else
    # the folder reads as PPO (a hand-built one).
    (run / "config.yaml").write_text("mode: trl_loop\nnum_generations: 4\n")
    assert RunReader(run).kind == "ppo"
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "checkpoints" / "step-1" / "trainer_state.json").write_text(json.dumps({"trainer": "grpo"}))
    assert RunReader(run).kind == "grpo"
    (run / "config.yaml").write_text("mode: [unclosed\n")
    with pytest.raises(RunTargetError, match="config.yaml: cannot be read as YAML"):
        RunReader(run)


def test_the_manifest_names_the_config_class_by_dotted_path(tmp_path):
    """The run layer loads `config.yaml` as the class the manifest names, without importing any trainer itself;
    an older manifest falls back to its trainer's class, and only searchrl's config dataclasses are accepted."""
    from searchrl.grpo.config import GRPORunConfig
    from searchrl.ppo.config import PPOConfig

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("num_generations: 2\nper_device_train_batch_size: 4\n")
    manifest = {"trainer": "grpo", "config_class": "searchrl.grpo.config.GRPORunConfig"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    reader = RunReader(run)
    assert reader.config_class() is GRPORunConfig and reader.config.num_generations == 2
    (run / "manifest.json").write_text(json.dumps({"trainer": "ppo"}))  # written before config_class existed
    assert RunReader(run).config_class() is PPOConfig
    for bad, message in (
        ("os.path.join", "not a searchrl config class"),
        ("searchrl.grpo.config.GRPO_MODES", "not a config dataclass"),
        ("searchrl.nowhere.Config", "cannot be imported"),
    ):
        (run / "manifest.json").write_text(json.dumps({"trainer": "grpo", "config_class": bad}))
        with pytest.raises(RunTargetError, match=message):
            RunReader(run).config_class()


def test_reader_refuses_what_is_not_a_target_and_says_what_is(demo, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "empty.jsonl.gz").write_bytes(b"")
    cases = {
        tmp_path / "missing": "no such file or directory",
        empty: "not a run, a demo or a trajectories file",
        demo / "ppo" / "eval": f"the eval/ folder of {demo / 'ppo'}, not a run",
        demo / "ppo" / "checkpoints" / "step-1": "--checkpoint step-1 evaluates this checkpoint",
        demo / "data" / "test.jsonl": "JSON lines, but not trajectories",
        demo / "summary.json": "not a trajectories file",
    }
    for path, message in cases.items():
        with pytest.raises(RunTargetError) as err:
            RunReader(path)
        assert message in str(err.value), (path, str(err.value))
        if path.name not in ("eval", "step-1"):
            assert VALID_TARGETS in str(err.value)
    with pytest.raises(RunTargetError, match="the file is empty"):
        RunReader(tmp_path / "empty.jsonl.gz")
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(RunTargetError, match="cannot be read as JSON lines"):
        RunReader(tmp_path / "broken.jsonl.gz")


# -------------------------------------------------------------------------------------------------
# audit
# -------------------------------------------------------------------------------------------------


def test_audit_of_the_demo_checks_its_ppo_run_and_each_hidden_test_evaluation(demo, tmp_path):
    out = tmp_path / "audit.json"
    result = _cli("audit", "--run", str(demo), "--json", str(out))
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert saved["label"] == "PPO training" and saved["num_trajectories"] == 16  # 2 steps x 8 episodes
    assert set(saved["evaluations"]) == {"sft-test", "ppo-test"}
    for name in ("sft-test", "ppo-test"):
        sub = saved["evaluations"][name]
        expected = audit_trajectories(
            read_trajectories(demo / "eval" / f"{name}.trajectories.jsonl.gz")
        ).to_dict()
        assert sub["num_trajectories"] == 16 and sub["verdict"] == expected["verdict"]
        assert [c["verdict"] for c in sub["checks"]][1:-1] == [c["verdict"] for c in expected["checks"]][1:-1]
    worst = max([saved["own_verdict"]] + [e["verdict"] for e in saved["evaluations"].values()],
                key=["skipped", "pass", "warn", "fail"].index)  # fmt: skip
    assert saved["verdict"] == worst
    assert "evaluation · SFT policy · hidden test split" in result.output
    assert "evaluation · PPO policy · hidden test split" in result.output
    # The demo's PPO run gives the same audit (it knows its demo).
    same = audit_run(demo / "ppo").to_dict()
    assert set(same["evaluations"]) == set(saved["evaluations"]) and same["checks"] == saved["checks"]


def test_audit_of_one_trajectories_file_and_of_a_grpo_run(demo, grpo, tmp_path):
    copy = tmp_path / "ppo-test.jsonl.gz"
    shutil.copy(demo / "eval" / "ppo-test.trajectories.jsonl.gz", copy)
    result = _cli("audit", "--run", str(copy))
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "ppo-test.audit.json").read_text())  # default: beside the file
    assert saved["num_trajectories"] == 16 and saved["evaluations"] == {}
    assert saved["checks"][0]["verdict"] == "skipped"  # no run around it: no held-out history

    report = audit_run(grpo.run)
    assert report.label == "GRPO training" and report.num_trajectories == 2  # 1 step x 2 generations
    assert report.evaluations == {}
    checked = [c for c in report.checks if c.name == "tool_call_spam"][0]
    assert checked.num_checked == 2


# -------------------------------------------------------------------------------------------------
# report
# -------------------------------------------------------------------------------------------------


class _Tables(HTMLParser):
    """Rows of every <table class=...> as lists of cell texts, by class."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._cls: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._cls = a.get("class") or ""
            self.tables.setdefault(self._cls, [])
        elif tag == "tr" and self._cls is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._cls is not None:
            self.tables[self._cls].append(self._row)
            self._row = None
        elif tag == "table":
            self._cls = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _tables(page: str) -> dict[str, list[list[str]]]:
    reader = _Tables()
    reader.feed(page)
    return reader.tables


def _record_xlabels(monkeypatch) -> list[str]:
    from searchrl.evaluation import plots

    seen: list[str] = []
    original = plots._new_figure

    def spy(xlabel: str = "step"):
        seen.append(xlabel)
        return original(xlabel)

    monkeypatch.setattr(plots, "_new_figure", spy)
    return seen


def test_report_of_the_demo_shows_the_figures_next_to_exact_match(demo, tmp_path, monkeypatch):
    from searchrl.evaluation.report import write_report

    xlabels = _record_xlabels(monkeypatch)
    page = write_report(demo, out=tmp_path / "report.html").read_text()
    summary = json.loads((demo / "summary.json").read_text())
    metrics = [json.loads(line) for line in (demo / "ppo" / "metrics.jsonl").read_text().splitlines()]
    tables = _tables(page)
    held = tables["glance-heldout"]
    assert held[0][:4] == [
        "held-out evaluation",
        "exact match [95% CI]",
        "citation support",
        "fabricated-citation rate",
    ]
    rows = {r[0]: r for r in held[1:]}
    for stage, label in (("sft", "SFT policy (sft.test)"), ("ppo", "PPO policy (ppo.test)")):
        test = summary[stage]["test"]
        lo, hi = test["ci95"]["exact_match"]
        assert rows[label][1] == f"{test['exact_match']:.3f} [{lo:.3f}, {hi:.3f}]"
        assert rows[label][2] == f"{test['citation_support']:.3f}"
        fab = audit_trajectories(
            read_trajectories(demo / "eval" / f"{stage}-test.trajectories.jsonl.gz")
        ).check("fabricated_citations")
        expected = "n/a" if fab.verdict == "skipped" else f"{fab.value:.3f}"
        assert rows[label][3].startswith(expected), rows[label]
    training = {r[0]: r[1:] for r in tables["glance-training"][1:]}
    gaps = [
        (m["step"], m["rollout/logprob_max_abs_diff"]) for m in metrics if "rollout/logprob_max_abs_diff" in m
    ]
    worst = max(gaps, key=lambda p: p[1])
    assert training["rollout/logprob_max_abs_diff"] == [
        f"max {worst[1]:.3g} (step {worst[0]})",
        f"last {gaps[-1][1]:.3g} (step {gaps[-1][0]})",
    ]
    kls = [(m["step"], m["objective/kl"]) for m in metrics if "objective/kl" in m]
    assert training["objective/kl"] == [
        f"mean {sum(v for _, v in kls) / len(kls):.4g} over {len(kls)} steps",
        f"last {kls[-1][1]:.4g} (step {kls[-1][0]})",
    ]
    assert training["dev exact match (eval/exact_match)"][0].endswith("at step 2")
    changed = [(m["step"], m["eval/answers_changed"]) for m in metrics if "eval/answers_changed" in m]
    stalled = any(m.get("eval/not_learning") for m in metrics)
    assert training["dev answers changed since the start (eval/answers_changed)"] == [
        f"{changed[-1][1]:.2f} at step {changed[-1][0]}",
        training["dev answers changed since the start (eval/answers_changed)"][1],
    ]
    assert training["dev answers changed since the start (eval/answers_changed)"][1].startswith(
        "NOT LEARNING" if stalled else "learning"
    )
    evs = [m["val/explained_variance"] for m in metrics if isinstance(m.get("val/explained_variance"), float)]
    evs = [v for v in evs if math.isfinite(v)]  # a toy batch of equal returns logs NaN: no row then
    second_half = evs[len(evs) // 2 :]
    if second_half:
        assert training["critic: val/explained_variance"][0] == (
            f"mean {sum(second_half) / len(second_half):.2f} over the second half"
        )
    else:
        assert "critic: val/explained_variance" not in training
    assert "Audit of SFT policy · hidden test split" in page and "Audit of PPO policy" in page
    assert "sft-test.json" in page and "ppo-test.json" in page  # their tables by hop count
    assert xlabels and set(xlabels) == {"PPO step"} and "x axis: PPO step" in page
    # The demo's own report.html (written by the pipeline through write_report on ppo/) has them too.
    own = _tables((demo / "report.html").read_text())
    assert [r[0] for r in own["glance-heldout"][1:3]] == ["SFT policy (sft.test)", "PPO policy (ppo.test)"]


def test_report_gives_the_fabricated_citation_rate_of_each_test_evaluation(demo, tmp_path):
    copy = tmp_path / "demo"
    shutil.copytree(demo, copy)
    trajs = read_trajectories(copy / "eval" / "ppo-test.trajectories.jsonl.gz")
    for i, t in enumerate(trajs[:8]):  # 8 answers that cite: 3 cite an id never retrieved, 5 a retrieved one
        t.answer, t.termination = "Somebody", "answered"
        t.retrieved = {"d000001": "Somebody lived here."}
        t.citations = ["d999999"] if i < 3 else ["d000001"]
    for t in trajs[8:]:
        t.citations = []
    write_trajectories(copy / "eval" / "ppo-test.trajectories.jsonl.gz", trajs)
    result = _cli("report", "--run", str(copy))
    assert result.exit_code == 0, result.output
    rows = {r[0]: r for r in _tables((copy / "report.html").read_text())["glance-heldout"][1:]}
    assert rows["PPO policy (ppo.test)"][3] == "0.375 (3/8 cited answers, 3 of 8 citations)"
    assert rows["SFT policy (sft.test)"][3].startswith("n/a")  # the SFT file is unchanged: nothing cited


def test_report_x_axes_name_the_runs_trainer_and_grpo_metrics_are_drawn(grpo, tmp_path, monkeypatch):
    from searchrl.evaluation.report import write_report

    xlabels = _record_xlabels(monkeypatch)
    page = write_report(grpo.run, out=tmp_path / "grpo.html").read_text()
    assert xlabels and set(xlabels) == {"GRPO step"} and "x axis: GRPO step" in page
    assert "PPO step" not in page
    assert "alt='Training reward'" in page  # TRL's `reward` stands in for objective/scores
    training = {r[0]: r[1:] for r in _tables(page)["glance-training"][1:]}
    assert training["rollout/logprob_max_abs_diff"][0] == "not logged (GRPO run)"


def test_report_refuses_a_trajectories_file(demo):
    result = _cli("report", "--run", str(demo / "eval" / "sft-test.trajectories.jsonl.gz"))
    assert result.exit_code != 0
    assert "needs a run directory or a demo directory" in result.output and "searchrl view" in result.output


# -------------------------------------------------------------------------------------------------
# eval
# -------------------------------------------------------------------------------------------------


def test_eval_of_the_demo_reproduces_its_hidden_test_evaluations_token_for_token(demo, tmp_path):
    # The demo evaluated its first 16 test questions in one batch; so does this, with the run's own settings.
    n = json.loads((demo / "summary.json").read_text())["test_questions"]
    for checkpoint, name in (("initial", "sft-test"), ("latest", "ppo-test")):
        out = tmp_path / f"{name}.json"
        result = _cli("eval", "--run", str(demo), "--checkpoint", checkpoint, "--batch-size", "32",
                      "--limit", str(n), "--bootstrap", "50", "--out", str(out))  # fmt: skip
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        assert data["trainer"] == "ppo" and data["run"] == str(demo / "ppo")
        assert data["data"] == str(demo / "data" / "test.jsonl") and data["index"] == str(demo / "index")
        # The demo's PPO config's environment (prompt, protocol, citation style, budgets), not the defaults.
        assert data["env_config"] == dataclasses.asdict(RunReader(demo).config.env_config())
        assert data["env_config"]["system_prompt"] == DEMO_SYSTEM_PROMPT and data["env_config"]["topk"] == 1
        if checkpoint == "initial":
            assert data["model"] == str(demo / "sft" / "policy") and data["checkpoint"] == "initial"
        ours = read_trajectories(out.with_name(f"{name}.trajectories.jsonl.gz"))
        theirs = read_trajectories(demo / "eval" / f"{name}.trajectories.jsonl.gz")
        assert [t.input_ids for t in ours] == [t.input_ids for t in theirs]
        assert [t.answer for t in ours] == [t.answer for t in theirs]
        assert data["exact_match"] == json.loads((demo / "eval" / f"{name}.json").read_text())["exact_match"]


def test_eval_of_a_grpo_run_on_a_corpus_and_questions_it_never_saw(grpo, tmp_path):
    from searchrl.evaluation.targets import evaluate_run, load_run_config
    from searchrl.grpo.config import GRPORunConfig

    assert isinstance(load_run_config(grpo.run), GRPORunConfig)  # read as GRPO, not refused as a PPOConfig
    world = unseen_world(tmp_path)
    result, path = evaluate_run(
        grpo.run,
        checkpoint="latest",
        data_dir=world.questions,
        corpus=world.corpus,
        output=tmp_path / "unseen.json",
        n_resamples=50,
        generator_factory=forced_turns("doc"),
    )
    data = json.loads(path.read_text())
    assert (
        data["trainer"] == "grpo" and data["checkpoint"] == "step-1" and data["corpus"] == str(world.corpus)
    )
    assert data["env_config"]["max_turns"] == 3 and data["env_config"]["max_tool_calls"] == 2  # the run's
    assert data["env_config"]["citation_style"] == "doc_id"
    trajs = result.trajectories
    assert [t.question_id for t in trajs] == [q["id"] for q in UNSEEN_QUESTIONS]
    unseen_ids = {d["id"] for d in UNSEEN_CORPUS}
    assert all(set(c.doc_ids) <= unseen_ids and c.doc_ids for t in trajs for c in t.tool_calls)
    assert [t.tool_calls[0].doc_ids[0] for t in trajs] == ["u1", "u3", "u4"]  # BM25 over the new corpus
    assert [t.answer for t in trajs] == ["Tamsel", "Nobody", "Quillow"]
    assert data["exact_match"] == pytest.approx(2 / 3) and data["citation_support"] == pytest.approx(2 / 3)

    # The CLI: --checkpoint initial is the GRPO run's starting policy; --index a folder built here.
    out = tmp_path / "initial.json"
    cli = _cli("eval", "--run", str(grpo.run), "--checkpoint", "initial", "--data", str(world.questions),
               "--index", str(world.index), "--bootstrap", "20", "--out", str(out))  # fmt: skip
    assert cli.exit_code == 0, cli.output
    data = json.loads(out.read_text())
    assert data["model"] == str(grpo.policy) and data["index"] == str(world.index) and data["n"] == 3
    # --data DIR takes <split>.jsonl from it.
    folder = tmp_path / "qa"
    folder.mkdir()
    shutil.copy(world.questions, folder / "hard.jsonl")
    cli = _cli("eval", "--run", str(grpo.run), "--data", str(folder), "--split", "hard", "--corpus",
               str(world.corpus), "--bootstrap", "20", "--out", str(tmp_path / "hard.json"))  # fmt: skip
    assert cli.exit_code == 0, cli.output
    data = json.loads((tmp_path / "hard.json").read_text())
    assert data["split"] == "hard" and data["data"] == str(folder / "hard.jsonl") and data["n"] == 3


def test_eval_errors_say_what_to_pass(demo, grpo, tmp_path):
    world = unseen_world(tmp_path)
    both = _cli("eval", "--run", str(grpo.run), "--index", str(world.index), "--corpus", str(world.corpus))
    assert both.exit_code != 0 and "--index and --corpus both name the search engine" in both.output
    twice = _cli("eval", "--run", str(grpo.run), "--model", str(grpo.policy), "--checkpoint", "step-1")
    assert twice.exit_code != 0 and "both name the model to evaluate" in twice.output
    nosplit = _cli("eval", "--run", str(grpo.run), "--data", str(tmp_path), "--split", "test")
    assert nosplit.exit_code != 0 and "no test.jsonl in this folder" in nosplit.output
    step = _cli("eval", "--run", str(grpo.run), "--checkpoint", "step-9")
    assert step.exit_code != 0 and "step-1" in step.output
    file = _cli("eval", "--run", str(demo / "eval" / "sft-test.trajectories.jsonl.gz"))
    assert file.exit_code != 0 and "needs a run directory or a demo directory" in file.output
    corpus = _cli("eval", "--run", str(grpo.run), "--corpus", str(tmp_path / "none.jsonl"))
    assert corpus.exit_code != 0 and "--corpus" in corpus.output and "no such file" in corpus.output


# -------------------------------------------------------------------------------------------------
# view (the JSON API; tests/test_viewer.py drives the page in Chromium)
# -------------------------------------------------------------------------------------------------


def test_viewer_api_over_a_grpo_run_and_over_one_trajectories_file(demo, grpo):
    from searchrl.viewer.server import create_app

    client = TestClient(create_app(grpo.run))
    summary = client.get("/api/summary").json()
    assert summary["kind"] == "grpo" and [s["id"] for s in summary["sources"]] == ["train"]
    assert summary["num_trajectories"] == 2 and summary["steps"] == [1]
    assert summary["source"]["label"].startswith("GRPO training")
    listed = client.get("/api/trajectories").json()
    assert listed["total"] == 2 and {r["key"] for r in listed["rows"]} == {"1-0", "1-1"}

    path = demo / "eval" / "ppo-test.trajectories.jsonl.gz"
    client = TestClient(create_app(path))
    summary = client.get("/api/summary").json()
    assert summary["kind"] == "trajectories" and summary["num_trajectories"] == 16 and summary["steps"] == []
    assert summary["tokenizer"] == "ppo/checkpoints/step-2/policy"  # found through the demo around the file
    detail = client.get("/api/trajectories/0").json()
    expected = read_trajectories(path)[0]
    assert detail["id"] == expected.id and [t["id"] for t in detail["tokens"]] == expected.input_ids
    assert detail["step"] is None and detail["source"] == "ppo-test"
