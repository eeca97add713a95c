"""Reading a run: what a path is, what it holds, and the settings it ran with. Nothing here writes.

`RunReader` is the one reader of run files: `searchrl view`, `audit`, `report`, `eval`, the trainers'
comparison, the demos and the benchmarks read `metrics.jsonl` and `eval/*` through it. Given a path it finds
what it is (a demo directory, a PPO or GRPO run directory, or one trajectories file), the run's config class
(from `manifest.json`), its metrics (with the collapse guard's rollbacks applied), trajectory sources, eval
files, checkpoints, data, index and tokenizer, and the settings it ran with (`environment`, `generation`,
`rubric`), and refuses anything else with a `RunTargetError` that says what a valid target is.

What a path is, and the refusals, are `target.py`; a run's metrics as kept, its trajectory sources and its
eval files `sources.py`. A demo directory is read through the layout its `summary.json` holds
(`searchrl.run.layout`): the demo names its runs, stages, evaluations, starting policy, data and index; this
package knows none of them.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from searchrl.common.config import load_config
from searchrl.run.errors import VALID_TARGETS, RunTargetError
from searchrl.run.layout import DemoLayout, read_layout
from searchrl.run.manifest import config_class_at
from searchrl.run.sources import (
    EvalFile,
    TrajectorySource,
    eval_folder,
    kept_metrics,
    read_json,
    read_metric_lines,
    step_sort_key,
)
from searchrl.run.target import (
    RunKind,
    check_trajectories_file,
    demo_of_main_run,
    enclosing_run,
    is_demo_dir,
    is_run_dir,
    refuse_folder,
    trainer_of,
)
from searchrl.run.writer import (
    AUDIT_FILE,
    AUDIT_SUFFIX,
    BEST_CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    EVAL_DIR,
    MANIFEST_FILE,
    METRICS_FILE,
    REPORT_FILE,
    SUMMARY_FILE,
    TRAJECTORIES_DIR,
    complete_checkpoints,
    step_name,
    trajectory_stem,
)

if TYPE_CHECKING:
    from searchrl.env.config import EnvConfig
    from searchrl.rewards.combine import Rubric
    from searchrl.rollout.loop import GenerationConfig

TRAINER_LABELS: dict[str, str] = {"ppo": "PPO", "grpo": "GRPO"}
# The config class of a run whose manifest predates `config_class`, by its trainer, as a dotted path.
TRAINER_CONFIG_CLASSES: dict[str, str] = {
    "ppo": "searchrl.ppo.config.PPOConfig",
    "grpo": "searchrl.grpo.config.GRPORunConfig",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def recorded_path_candidates(path: str | Path, near: str | Path) -> list[Path]:
    """Where a path a run recorded may be on this machine, in order: the path itself when absolute; else
    against the working directory, then against each folder above `near` (the file or folder that recorded
    it: a relative path was written from wherever the run was started, often a folder above the run)."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return [given]
    return [Path.cwd() / given, *(folder / given for folder in Path(near).resolve().parents)]


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise RunTargetError(
            f"{path}: cannot be read as YAML ({type(e).__name__}: {e}); fix or remove it"
        ) from None
    return data if isinstance(data, dict) else {}


def _has_tokenizer(folder: Path | None) -> bool:
    return folder is not None and folder.is_dir() and any((folder / f).is_file() for f in _TOKENIZER_FILES)


class RunReader:
    """A read-only view of what `searchrl view / audit / report / eval` are pointed at.

    `RunReader(path)` finds the kind of `path`:

    - ``"demo"``: a demo directory (its `summary.json` holds a `DemoLayout`). `root` is its main run (the
      layout's first sub-run), `demo_root` the demo folder, whose evaluations, starting policy, data and index
      are where the layout says.
    - ``"ppo"`` / ``"grpo"``: a run directory; the trainer is the one `manifest.json` names (`trainer`), else
      a checkpoint's `trainer_state.json`; a folder with neither (hand-built, as some tests do) reads as PPO.
      A run that is a demo's main run gets the demo's evaluations, data and index too (`demo_root`).
    - ``"trajectories"``: one `*.jsonl.gz` / `*.jsonl` file of trajectories; when it sits in a run or demo
      (`RUN/trajectories/`, `RUN/eval/`, `DEMO/eval/`), that run is `enclosing` (metrics, tokenizer).

    Anything else raises `RunTargetError` naming what was wrong and `VALID_TARGETS`. Nothing is written.
    """

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target)
        self.kind: RunKind = "trajectories"
        self.root: Path | None = None
        self.demo_root: Path | None = None
        self.layout: DemoLayout | None = None
        self.trajectories_file: Path | None = None
        self.enclosing: RunReader | None = None
        if not self.target.exists():
            raise RunTargetError(f"{self.target}: no such file or directory; pass {VALID_TARGETS}")
        if self.target.is_file():
            self._open_file(self.target)
        else:
            self._open_dir(self.target)

    # -- what the path is (`searchrl.run.target`) -------------------------------------------------
    def _open_file(self, path: Path) -> None:
        check_trajectories_file(path)
        self.kind = "trajectories"
        self.trajectories_file = path
        enclosing = enclosing_run(path)
        if enclosing is not None:
            self.enclosing = RunReader(enclosing)
            self.root, self.demo_root = self.enclosing.root, self.enclosing.demo_root
            self.layout = self.enclosing.layout

    def _open_dir(self, folder: Path) -> None:
        if is_demo_dir(folder):
            self.kind, self.demo_root, self.layout = "demo", folder, read_layout(folder)
            main = self.layout.main_run
            self.root = folder / main.folder if main is not None and (folder / main.folder).is_dir() else None
            return
        if not is_run_dir(folder):
            refuse_folder(folder)
        self.root = folder
        self.demo_root, self.layout = demo_of_main_run(folder)
        self.kind = trainer_of(folder)
        _ = self.raw_config  # a config.yaml that does not parse is refused now, not halfway through a command

    # -- the run -----------------------------------------------------------------------------------
    @property
    def trainer(self) -> str | None:
        """ "ppo" or "grpo": the trainer of `root`, or None when there is no run (a bare file, a demo before its run)."""
        if self.kind in ("ppo", "grpo"):
            return self.kind
        if self.enclosing is not None:
            return self.enclosing.trainer
        return trainer_of(self.root) if self.kind == "demo" and self.root is not None else None

    @property
    def trainer_label(self) -> str:
        """ "PPO", "GRPO", or "training" when the trainer is unknown (x axes: "PPO step")."""
        return TRAINER_LABELS.get(self.trainer or "", "training")

    def describe(self) -> str:
        what = {
            "demo": "demo directory",
            "ppo": "PPO run",
            "grpo": "GRPO run",
            "trajectories": "trajectories file",
        }
        return f"{what[self.kind]} {self.target}"

    def require_run(self, command: str) -> Path:
        """`root`, or a RunTargetError saying why `command` needs a run directory here."""
        if self.root is not None:
            return self.root
        if self.kind == "demo":
            raise RunTargetError(
                f"{self.target}: this demo has no run yet (it stopped, or is still running, before its training "
                f"stage); {command} needs a run directory: rerun `searchrl demo`, or pass a run directory"
            )
        raise RunTargetError(
            f"{self.target}: {command} needs a run directory or a demo directory, not a single trajectories file "
            f"outside any run; pass {VALID_TARGETS.split(' or one trajectories file')[0]}"
        )

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """`root/manifest.json` ({} when absent or unreadable)."""
        return (read_json(self.root / MANIFEST_FILE) or {}) if self.root is not None else {}

    @property
    def config_path(self) -> Path | None:
        path = self.root / CONFIG_FILE if self.root is not None else None
        return path if path is not None and path.is_file() else None

    @cached_property
    def raw_config(self) -> dict[str, Any]:
        """`config.yaml` as plain YAML ({} without one): for lookups that must not fail on a partial file."""
        return _read_yaml(self.config_path) if self.config_path is not None else {}

    def config_class(self) -> type:
        """The class of the run's `config.yaml`: the manifest's `config_class`, else its trainer's (`PPOConfig`
        or `GRPORunConfig`). Named by dotted path, so this layer imports no trainer."""
        path = self.manifest.get("config_class") or TRAINER_CONFIG_CLASSES[self.trainer or "ppo"]
        return config_class_at(path, self.root / MANIFEST_FILE if self.root is not None else self.target)

    @cached_property
    def config(self) -> Any:
        """The run's `config.yaml` loaded as its trainer's config class; None when the run has none."""
        if self.config_path is None:
            return None
        return load_config(self.config_class(), self.config_path)

    def metric_lines(self) -> list[dict[str, Any]]:
        """Every line of `root/metrics.jsonl` as written, rolled-back steps included (`metrics` is what counts)."""
        return read_metric_lines(self.root / METRICS_FILE) if self.root is not None else []

    def metrics(self) -> list[dict[str, Any]]:
        """The run's `metrics.jsonl`, one line per step it kept: a step the collapse guard rolled back counts
        once, as it was redone (`kept_metrics`). What every reader of a run's metrics reads."""
        return kept_metrics(self.metric_lines())

    def rollbacks(self) -> list[dict[str, Any]]:
        """The collapse guard's rollback lines (`guard/rollback`: the failed step, why, where it went back to)."""
        return [line for line in self.metric_lines() if line.get("guard/rollback")]

    def summary(self) -> dict[str, Any] | None:
        """The demo's `summary.json` (or a run's own), its figures without the demo's layout; None without one."""
        for folder in (self.demo_root, self.root):
            if folder is not None and (folder / SUMMARY_FILE).is_file():
                data = read_json(folder / SUMMARY_FILE)
                return None if data is None else {k: v for k, v in data.items() if k != "layout"}
        return None

    # -- the settings the run ran with ---------------------------------------------------------------
    def environment(self) -> EnvConfig:
        """The `EnvConfig` the run's episodes ran in (protocol, system prompt, tool schema in the prompt, top-k,
        citation style, budgets, ...): `RUN/env.yaml` when the run recorded one, else its config's environment.
        For a demo, its main run's. Build an environment that renders the run's prompts with
        `SearchEnvironment(backend, reader.environment(), tokenizer=...)`."""
        from searchrl.env.config import EnvConfig  # the environment room: only when asked for

        root = self.require_run("the run's environment")
        if (root / "env.yaml").is_file():
            return load_config(EnvConfig, root / "env.yaml")
        return self._require_config("environment").env_config()

    def generation(self) -> GenerationConfig:
        """The rollout engine's `GenerationConfig` the run trained with (sampling, per-turn and per-episode
        token limits, seed), as its `manifest.json` recorded it."""
        from searchrl.rollout.loop import GenerationConfig  # torch: only when asked for

        root = self.require_run("the run's generation settings")
        recorded = self.manifest.get("generation_config")
        if not isinstance(recorded, dict) or not recorded:
            raise FileNotFoundError(
                f"{root / MANIFEST_FILE}: records no generation_config (the trainer writes it when the run starts)"
            )
        known = GenerationConfig.__dataclass_fields__
        return GenerationConfig(**{k: v for k, v in recorded.items() if k in known})

    def rubric(self) -> Rubric:
        """The `Rubric` that scored the run's episodes: its config's `reward_config_path`, else the default."""
        from searchrl.rewards.combine import (  # the rewards room: only when asked for
            default_rubric,
            load_rubric,
        )

        path = self._require_config("rubric").reward_config_path
        return load_rubric(path) if path else default_rubric()

    def _require_config(self, what: str) -> Any:
        root = self.require_run(f"the run's {what}")
        if self.config is None:
            raise FileNotFoundError(
                f"{root / CONFIG_FILE}: no config.yaml, so the run's {what} is not recorded"
            )
        return self.config

    # -- checkpoints and models -------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (`checkpoints/step-N/` with `trainer_state.json`), oldest first."""
        return complete_checkpoints(self.root / CHECKPOINTS_DIR) if self.root is not None else []

    def latest_checkpoint(self) -> Path | None:
        done = self.checkpoints()
        return done[-1] if done else None

    def checkpoint_policy(self, checkpoint: str = "latest") -> tuple[Path, str]:
        """(policy folder, name) of `latest`, `step-N` or `N`; FileNotFoundError listing what exists."""
        root = self.require_run("a checkpoint")
        if checkpoint == "latest":
            found = self.latest_checkpoint()
            if found is None:
                raise FileNotFoundError(
                    f"{root / CHECKPOINTS_DIR}: no complete checkpoint (a step-N folder with trainer_state.json); "
                    "train first, or pass --model PATH"
                )
            return found / "policy", found.name
        if checkpoint == "best":
            best = root / BEST_CHECKPOINT_FILE
            if not best.is_file():
                raise FileNotFoundError(
                    f"{best}: no best checkpoint recorded (the run had no dev evaluation, or best_metric: null); "
                    "use latest, initial or step-N"
                )
            checkpoint = str(json.loads(best.read_text(encoding="utf-8"))["checkpoint"])
        name = checkpoint if checkpoint.startswith("step-") else step_name(int(checkpoint))
        folder = root / CHECKPOINTS_DIR / name
        if not (folder / "policy").is_dir():
            available = sorted(p.name for p in (root / CHECKPOINTS_DIR).glob("step-*"))
            raise FileNotFoundError(
                f"{folder}/policy not found; checkpoints here: {available or 'none'} (use step-N, latest, best or initial)"
            )
        return folder / "policy", name

    def _demo_path(self, relative: str | None) -> Path | None:
        """A path the demo's layout names, in the demo folder; None when there is no demo or no such path."""
        if self.demo_root is None or relative is None:
            return None
        return self.demo_root / relative

    def recorded_initial_policy(self) -> Path | None:
        """The policy the run started from, as recorded: the config's `policy_model_path` (relative to wherever
        training ran, when it was given so), else the demo's starting policy; None when the run names none."""
        path = self.raw_config.get("policy_model_path")
        if path:
            return Path(path)
        start = self._demo_path(self.layout.initial_policy if self.layout else None)
        return start if start is not None and start.is_dir() else None

    def initial_policy(self) -> Path | None:
        """`recorded_initial_policy` on this machine, from any working directory: as recorded (absolute, or
        from the working directory), else against each folder above the run (`recorded_path_candidates`);
        the first model folder (`config.json`) wins. None when the run names none; FileNotFoundError naming
        the recorded path, what was tried and how to fix it when none of those is a model folder."""
        recorded = self.recorded_initial_policy()
        if recorded is None:
            return None
        near = self.root / CONFIG_FILE if self.root is not None else self.target
        tried = recorded_path_candidates(recorded, near)
        found = next((path for path in tried if (path / "config.json").is_file()), None)
        if found is not None:
            return found
        raise FileNotFoundError(
            f"{near}: the run started from policy_model_path {str(recorded)!r}, which is not a model folder here "
            f"(tried {', '.join(str(p) for p in tried[:6])}). Run from the directory the run was trained in, put "
            "the starting policy back at that path, or pass it with --model DIR"
        )

    def tokenizer_dir(self) -> Path | None:
        """Where the run's tokenizer lives: the newest checkpoint's `policy/` (complete ones first), the
        config's `tokenizer_path` / `policy_model_path`, or the demo's starting policy; None if nowhere."""
        if self.kind == "trajectories":
            return self.enclosing.tokenizer_dir() if self.enclosing is not None else None
        candidates: list[Path] = [p / "policy" for p in reversed(self.checkpoints())]
        if self.root is not None and (self.root / CHECKPOINTS_DIR).is_dir():
            others = sorted(
                (self.root / CHECKPOINTS_DIR).glob("step-*/policy"), key=lambda p: step_sort_key(p.parent)
            )
            candidates += list(reversed(others))
        for key in ("tokenizer_path", "policy_model_path"):
            if self.raw_config.get(key):
                candidates.append(Path(self.raw_config[key]))
        start = self._demo_path(self.layout.initial_policy if self.layout else None)
        if start is not None:
            candidates.append(start)
        return next((c for c in candidates if _has_tokenizer(c)), None)

    # -- data and search ---------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path | None:
        """The folder of the run's question files: the config's train/dev file's folder, else the demo's."""
        for key in ("dev_file", "train_file"):
            if self.raw_config.get(key):
                return Path(self.raw_config[key]).parent
        folder = self._demo_path(self.layout.data if self.layout else None)
        return folder if folder is not None and folder.is_dir() else None

    def split_file(self, split: str) -> Path | None:
        """`<split>.jsonl` of the run's data: the config's train_file/dev_file by name, else `data_dir`'s."""
        named = {"train": self.raw_config.get("train_file"), "dev": self.raw_config.get("dev_file")}
        if named.get(split):
            return Path(named[split])
        return self.data_dir / f"{split}.jsonl" if self.data_dir is not None else None

    def question_files(self) -> list[Path]:
        """Every question file the run names or ships (train, dev, and the demo's test), that exists."""
        files = [Path(self.raw_config[k]) for k in ("train_file", "dev_file") if self.raw_config.get(k)]
        if self.data_dir is not None:
            files += [self.data_dir / f"{split}.jsonl" for split in ("train", "dev", "test")]
        seen: list[Path] = []
        for f in files:
            if f.is_file() and f not in seen:
                seen.append(f)
        return seen

    @property
    def index_dir(self) -> Path | None:
        """The run's search index: the config's `index_dir`, else the demo's."""
        if self.raw_config.get("index_dir"):
            return Path(self.raw_config["index_dir"])
        folder = self._demo_path(self.layout.index if self.layout else None)
        return folder if folder is not None and folder.is_dir() else None

    # -- what there is to read ------------------------------------------------------------------------
    def sub_runs(self) -> dict[str, Path]:
        """The demo's run directories by label (its main run first), those that exist; {} outside a demo."""
        if self.kind != "demo" or self.demo_root is None or self.layout is None:
            return {}
        runs = {sub.label: self.demo_root / sub.folder for sub in self.layout.sub_runs}
        return {label: folder for label, folder in runs.items() if is_run_dir(folder)}

    def eval_files(self, demo: bool = True) -> list[EvalFile]:
        """The run's `eval/*.json` (dev step-N.json, `searchrl eval` outputs), then (with `demo`) the demo's, as
        its layout lists them."""
        if self.kind == "trajectories" and self.enclosing is not None:
            return self.enclosing.eval_files(demo)
        out: list[EvalFile] = []
        if self.root is not None:
            out += eval_folder(self.root / EVAL_DIR)
        if demo and self.demo_root is not None and self.layout is not None:
            out += eval_folder(self.demo_root / EVAL_DIR, self.demo_root, self.layout.evaluations)
        return out

    def step_evaluations(self) -> dict[int, dict[str, Any]]:
        """The trainer's periodic dev evaluations (`eval/step-N.json`), by step."""
        return {e.step: e.data for e in self.eval_files(demo=False) if e.is_step_file and e.step is not None}

    def trajectory_sources(self) -> list[TrajectorySource]:
        """What the viewer offers and the audit reads: training trajectories, then evaluations' files.

        A demo: its main run's training steps, the demo's evaluations with trajectories (in its layout's
        order), the main run's own eval trajectories, and the other runs' training steps. A run: its training
        steps and eval trajectories. A file: itself.
        """
        if self.kind == "trajectories":
            assert self.trajectories_file is not None
            known = [e.label for e in self.eval_files() if e.trajectories == self.trajectories_file]
            kind = "evaluation" if self.trajectories_file.parent.name == EVAL_DIR else "training"
            name = self.trajectories_file.name
            label = f"{known[0]} ({name})" if known else name
            return [
                TrajectorySource(
                    trajectory_stem(self.trajectories_file),
                    label,
                    kind,
                    (self.trajectories_file,),
                    trainer=self.trainer,
                )
            ]
        sources: list[TrajectorySource] = []
        if self.root is not None:
            folder = self.root / TRAJECTORIES_DIR
            label = f"{self.trainer_label} training ({self._rel(folder)}/)"
            sources.append(TrajectorySource("train", label, "training", folder=folder, trainer=self.trainer))
        # The demo's evaluations first: they are what the demo is judged by.
        for e in sorted(self.eval_files(), key=lambda e: e.stage is None):
            if e.trajectories is None:
                continue
            source_id = (
                e.stem if all(s.id != e.stem for s in sources) else f"{e.path.parent.parent.name}/{e.stem}"
            )
            label = f"{e.label} ({self._rel(e.trajectories)})"
            sources.append(TrajectorySource(source_id, label, "evaluation", (e.trajectories,)))
        for label, folder in self.sub_runs().items():
            if folder == self.root:
                continue
            steps = folder / TRAJECTORIES_DIR
            sources.append(
                TrajectorySource(
                    f"train:{folder.name}",
                    f"{label} training ({self._rel(steps)}/)",
                    "training",
                    folder=steps,
                    trainer=RunReader(folder).trainer,
                )
            )
        return sources

    def _rel(self, path: Path) -> str:
        base = self.demo_root or self.root or self.target.parent
        try:
            return str(path.relative_to(base))
        except ValueError:
            return str(path)

    # -- where outputs go ----------------------------------------------------------------------------
    def audit_path(self) -> Path:
        """Default `searchrl audit` output: DEMO/audit.json, RUN/audit.json, or FILE's `<stem>.audit.json`."""
        if self.kind == "trajectories":
            assert self.trajectories_file is not None
            return self.trajectories_file.with_name(trajectory_stem(self.trajectories_file) + AUDIT_SUFFIX)
        return (self.demo_root if self.kind == "demo" else self.root or self.target) / AUDIT_FILE

    def report_path(self) -> Path:
        """Default `searchrl report` output: DEMO/report.html or RUN/report.html."""
        return (self.demo_root if self.kind == "demo" else self.root or self.target) / REPORT_FILE
