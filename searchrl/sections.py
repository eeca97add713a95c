"""The settings PPO, GRPO, SFT and the demos share, in sections: each declared, documented and checked once.

What: seven dataclasses, one per concern.

- `RunSection`: where a run is written and how it is recorded (output_dir, seed, loggers, the evaluation,
  saving and logging cadence);
- `ModelSection`: the starting policy, its tokenizer and the reward rubric;
- `DataSection`: the training and dev questions;
- `SearchSection`: where the search engine is (a local index, built from a corpus when missing, or a server);
- `EnvironmentSection`: the episode (protocol, prompt, citations, turns, searches, top-k, deadline, token
  budgets). It *is* the environment's `searchrl.env.config.EpisodeSettings`, where those fields are declared
  and checked, plus the rollout's per-turn token limit; `env_config()` copies them, same names, onto the
  `EnvConfig` the environment runs with;
- `GenerationSection`: sampling (training and evaluation temperatures, nucleus and top-k) and the rollout
  engine (`rollout_backend`: HF or vLLM, and vLLM's memory share and prefix caching), which PPO and GRPO's
  `our_rollout` build with `searchrl.rollout.backends.make_generator`; `generation_config()` is the one
  mapping of a trainer config onto the engine's `GenerationConfig`;
- `TrainingSection`: the batch, the episode budget and the optimiser.

`topk` and `search_timeout_s` are environment settings, not search ones: the environment applies them (its
default k per call and its deadline), and SFT and the demos set them without naming a search engine.

How they are used. A trainer config keeps TRL's flat shape by inheriting the sections (`PPOConfig(...,
max_turns=3)`, `args.max_turns`, flat YAML files) and adds only its algorithm's fields. The demos and SFT hold
sections as parts (`environment:`, `generation:` in YAML), so a setting such as `max_turns` appears once there
too, and their stage configs are built from those parts with `with_sections_of`, which copies the sections two
configs share (PPO's settings onto GRPO for a side-by-side run, the demo's parts onto its PPO stage).

Validation: constructing any config runs the `check` of every section class it is, each on its own fields,
then the trainer's own `check` (`searchrl.common.config.check_sections`, with `Section` and the `require`
helpers). The episode's quantities (protocol, citation style,
turns, searches, top-k, deadline, token budgets) are checked by `EpisodeSettings.check`, the same check an
`EnvConfig` runs, so the environment and every trainer refuse the same values with the same words and names.

Why this module sits above `searchrl.env` and `searchrl.search` (not in `searchrl.common`): the environment
section is the environment's `EpisodeSettings` and maps onto `EnvConfig`, and the search section opens a
backend; the trainers, SFT and the demos sit above it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from searchrl.common.config import (
    ConfigError,
    Section,
    help_text,
    require,
    require_choice,
    require_int,
)
from searchrl.env.config import EnvConfig, EpisodeSettings
from searchrl.rollout.sampling import ROLLOUT_BACKENDS
from searchrl.search.base import Backend

if TYPE_CHECKING:
    from searchrl.rollout.loop import GenerationConfig
    from searchrl.search.index import SearchConfig

T = TypeVar("T")

SEARCH_BACKENDS = ("bm25", "dense", "http")
LR_SCHEDULER_TYPES = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)


@dataclass
class RunSection(Section):
    """Where a run is written and how it is recorded: the run directory, seed, loggers and cadence."""

    # A trainer config names its default run directory here (output_dir null means it).
    default_output_dir: ClassVar[str] = "runs/run"

    output_dir: str | None = field(
        default=None,
        metadata=help_text(
            "The run directory (TRL's meaning): config.yaml, manifest.json, metrics.jsonl, eval/, trajectories/ "
            "and checkpoints/ go here; null: the trainer's default, runs/ppo or runs/grpo."
        ),
    )
    run_name: str | None = field(
        default=None,
        metadata=help_text(
            "Name shown by the loggers of report_to (wandb, trackio, tensorboard); null: the output_dir's name."
        ),
    )
    seed: int = field(
        default=42,
        metadata=help_text(
            "Random seed of the model init, the data order and the rollouts (PPO: process i uses seed + i * "
            "100003 so ranks sample different rollouts)."
        ),
    )
    report_to: list[str] = field(
        default_factory=lambda: ["none"],
        metadata=help_text(
            'Extra loggers through transformers callbacks, e.g. ["tensorboard"], ["wandb"] or ["trackio"]; '
            '["none"] for none. metrics.jsonl is always written.'
        ),
    )
    use_cpu: bool = field(
        default=False,
        metadata=help_text("Train on the CPU even when a GPU is available (TrainingArguments' name)."),
    )
    logging_steps: int = field(
        default=1,
        metadata=help_text(
            "Write a metrics.jsonl line (and call the loggers) every this many steps; PPO always writes a step "
            "that evaluated, rolled back or ended the run."
        ),
    )
    eval_steps: int = field(
        default=50,
        metadata=help_text(
            "Evaluate on the dev questions every this many steps (RUN/eval/step-N.json; GRPO also at the last "
            "step); 0: never."
        ),
    )
    eval_on_start: bool = field(
        default=False,
        metadata=help_text(
            "Also evaluate the starting policy before the first update (RUN/eval/step-0.json and a step-0 "
            "metrics line; transformers' name). Off by default as in TRL, on in the shipped configs."
        ),
    )
    num_eval_questions: int = field(default=64, metadata=help_text("Dev questions per evaluation."))
    save_steps: int = field(
        default=50,
        metadata=help_text("Write RUN/checkpoints/step-N every this many steps; 0: only the last step's."),
    )
    save_trajectories: bool = field(
        default=True,
        metadata=help_text("Write every step's trajectories to RUN/trajectories/step-N.jsonl.gz."),
    )
    save_total_limit: int | None = field(
        default=None,
        metadata=help_text(
            "Keep only this many most recent checkpoints (never the best or a rollback target); null: all."
        ),
    )
    best_metric: str | None = field(
        default="eval/reward",
        metadata=help_text(
            "Keep the checkpoint of the dev evaluation with the highest value of this metric (eval/reward, "
            "eval/exact_match, eval/f1, ...): it is written when it is reached, never pruned, named in "
            "RUN/best_checkpoint.json and evaluated with `searchrl eval --checkpoint best`; null: off."
        ),
    )
    num_sample_generations: int = field(
        default=10,
        metadata=help_text(
            "How many times over the run to write a few sampled episodes as text to RUN/samples.jsonl; 0: never."
        ),
    )
    progress_bar: bool = field(default=True, metadata=help_text("Show a progress bar while training."))

    def check(self) -> None:
        if self.output_dir is None:
            self.output_dir = type(self).default_output_dir
        if not isinstance(self.report_to, list) or not all(isinstance(r, str) for r in self.report_to):
            raise ConfigError(
                f'report_to must be a list of logger names such as ["tensorboard"], got {self.report_to!r}.'
            )
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ConfigError(
                f'report_to {self.report_to!r} mixes "none" with loggers; use ["none"] or drop "none".'
            )
        require_int(self.logging_steps >= 1, "logging_steps", self.logging_steps, ">= 1")
        require_int(self.num_eval_questions >= 1, "num_eval_questions", self.num_eval_questions, ">= 1")
        require_int(self.eval_steps >= 0, "eval_steps", self.eval_steps, ">= 0 (0: never)")
        require_int(self.save_steps >= 0, "save_steps", self.save_steps, ">= 0 (0: the last step only)")
        if self.save_total_limit is not None:
            require_int(self.save_total_limit >= 1, "save_total_limit", self.save_total_limit, ">= 1 or null")
        require_int(
            self.num_sample_generations >= 0, "num_sample_generations", self.num_sample_generations, ">= 0"
        )
        if self.best_metric is not None and not (
            isinstance(self.best_metric, str) and self.best_metric.startswith("eval/")
        ):
            raise ConfigError(
                f"best_metric: {self.best_metric!r} must name a dev-evaluation metric such as eval/reward or "
                "eval/exact_match, or be null"
            )

    @property
    def run_dir(self) -> Path:
        """The run directory (`output_dir`)."""
        return Path(str(self.output_dir))

    @property
    def loggers(self) -> list[str]:
        """The loggers of `report_to` without "none" (empty: none)."""
        return [r for r in self.report_to if r != "none"]


@dataclass
class ModelSection(Section):
    """The starting policy, its tokenizer and the reward rubric."""

    policy_model_path: str | None = field(
        default=None,
        metadata=help_text(
            "Local folder of the starting policy (e.g. the SFT warm start's output). Never downloaded. PPO "
            "builds a fresh tiny model when null; GRPO needs it (TRL reloads the reference from it, beta > 0)."
        ),
    )
    tokenizer_path: str | None = field(
        default=None, metadata=help_text("Local folder of the tokenizer; null: policy_model_path.")
    )
    reward_config_path: str | None = field(
        default=None,
        metadata=help_text(
            "YAML of the reward functions and their weights (configs/rewards_default.yaml); null: the built-in "
            "default rubric."
        ),
    )


@dataclass
class DataSection(Section):
    """The questions a run trains and evaluates on."""

    train_file: str | None = field(
        default=None, metadata=help_text("JSONL of training questions (question, golds); the train split.")
    )
    dev_file: str | None = field(
        default=None,
        metadata=help_text(
            "JSONL of dev questions for periodic evaluation and model selection (never the test split)."
        ),
    )


@dataclass
class SearchSection(Section):
    """Where the search engine is: a local index (built from the corpus when missing) or a search server."""

    corpus_path: str | None = field(
        default=None,
        metadata=help_text("Corpus JSONL (id, title, contents); a missing index_dir is built from it."),
    )
    index_dir: str | None = field(
        default=None, metadata=help_text("Folder of the search index built by `searchrl index`.")
    )
    search_backend: Literal["bm25", "dense", "http"] = field(
        default="bm25",
        metadata=help_text(
            'Search engine: "bm25" or "dense" (the index in index_dir, in process), "http" for a server at '
            "search_url (`searchrl serve`, or Search-R1's retrieval server)."
        ),
    )
    search_url: str | None = field(
        default=None, metadata=help_text('Base URL of the search server when search_backend is "http".')
    )

    def check(self) -> None:
        require_choice(self.search_backend, "search_backend", SEARCH_BACKENDS)
        if self.search_backend == "http" and not self.search_url:
            raise ConfigError(
                'search_backend is "http" but search_url is not set; give the URL of `searchrl serve`.'
            )
        if self.search_backend != "http" and self.search_url:
            raise ConfigError(
                f"search_url is set but search_backend is {self.search_backend!r} (the local index): use one "
                'search engine, not both; set search_backend: "http" for the server, or drop search_url.'
            )

    def search_config(self, read_timeout: float = 30.0) -> SearchConfig:
        """These settings as the search room's `SearchConfig`: a server (`search_backend: http`) or a local
        index, built from `corpus_path` first when the folder does not exist yet. A server gets the bearer
        token of `SEARCHRL_SERVE_TOKEN` when that is set. `read_timeout` bounds one HTTP answer (a trainer
        passes its `search_timeout_s`; the environment enforces that deadline in any case)."""
        # The index module loads bm25s and the dense stack: imported when a backend is opened, not per config.
        from searchrl.search.index import SearchConfig

        if self.search_backend == "http":
            return SearchConfig(url=self.search_url, read_timeout=max(read_timeout, 1.0))
        if not self.index_dir:
            raise ConfigError(
                "index_dir is not set; point it at a folder made by `searchrl index` (or a new one, with "
                "corpus_path), or set search_backend: http and search_url"
            )
        return SearchConfig(
            index=self.index_dir,
            corpus=self.corpus_path,
            index_backend=self.search_backend,
            read_timeout=max(read_timeout, 1.0),
        )

    def open_backend(self, read_timeout: float = 30.0) -> Backend:
        """The search engine these settings name, through the one opener, `searchrl.search.index.open_backend`
        (which also builds a missing index from `corpus_path`, and says how to make one when there is none)."""
        from searchrl.search.index import open_backend  # bm25s and numba: when a backend is opened

        return open_backend(self.search_config(read_timeout))


@dataclass
class EnvironmentSection(EpisodeSettings):
    """The episode: the environment's own `EpisodeSettings` (declared and checked in `searchrl.env.config`),
    plus the rollout's per-turn token limit."""

    max_new_tokens_per_turn: int = field(
        default=64,
        metadata=help_text(
            "Most tokens the policy may sample in one turn (TRL's response_length; GRPO trl_loop bounds a turn "
            "by max_episode_tokens only)."
        ),
    )

    def check(self) -> None:
        require_int(
            self.max_new_tokens_per_turn >= 1, "max_new_tokens_per_turn", self.max_new_tokens_per_turn
        )
        if self.max_episode_tokens < self.max_new_tokens_per_turn:
            raise ConfigError(
                f"max_episode_tokens ({self.max_episode_tokens}) is smaller than max_new_tokens_per_turn "
                f"({self.max_new_tokens_per_turn}); raise max_episode_tokens or lower the per-turn limit."
            )
        self.env_config()  # the environment's own limits on these values (a top-k within its max_topk)

    def env_config(self) -> EnvConfig:
        """The `EnvConfig` of these settings: training, evaluation and demonstrations build this environment.

        Its episode settings are this section's, field for field (one declaration, one name); the
        environment's other settings (argument limits, retries, circuit breaker) keep `EnvConfig`'s defaults.
        """
        return EnvConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EpisodeSettings)})


@dataclass
class GenerationSection(Section):
    """How the policy samples, in training rollouts and in evaluations, and which engine samples."""

    temperature: float = field(
        default=0.7,
        metadata=help_text(
            "Sampling temperature of training rollouts; PPO computes logprobs (policy and reference) at the same "
            "temperature. 0.7 is TRL 1.12's PPOConfig default; TRL's GRPOConfig and Search-R1 use 1.0, as the "
            "shipped GRPO and demo configs do."
        ),
    )
    eval_temperature: float = field(
        default=0.01,
        metadata=help_text("Sampling temperature of evaluations: near-greedy by default; 0 = greedy."),
    )
    top_p: float = field(
        default=1.0,
        metadata=help_text(
            "Nucleus sampling; keep 1.0: truncated sampling makes the k1 KL penalty exploitable."
        ),
    )
    top_k: int = field(
        default=0, metadata=help_text("Top-k sampling; 0 disables it (recommended, as for top_p).")
    )
    rollout_backend: Literal["hf", "vllm"] = field(
        default="hf",
        metadata=help_text(
            'Rollout engine: "hf" (searchrl.rollout.HFGenerator, CPU or GPU) or "vllm" '
            "(searchrl.rollout.vllm_generator.VLLMGenerator: needs the vllm package and a CUDA GPU; same "
            "trajectories, the policy's weights pushed to vLLM after every optimizer step). PPO and GRPO's "
            "our_rollout mode; GRPO's trl_loop refuses \"vllm\" (TRL's own use_vllm is another engine)."
        ),
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3,
        metadata=help_text(
            'rollout_backend "vllm": share of the GPU memory vLLM may take (weights and KV cache), in (0, 1]; '
            "training shares the same GPU, so keep room for the policy, critic, reference and optimizer."
        ),
    )
    vllm_enable_prefix_caching: bool = field(
        default=True,
        metadata=help_text(
            'rollout_backend "vllm": reuse cached KV blocks of the growing history, so each turn (which '
            "re-submits prompt + history) does not prefill it again. Turn off only to measure its effect."
        ),
    )

    def check(self) -> None:
        require(self.temperature > 0, "temperature", self.temperature, "must be > 0 (rollouts sample)")
        require(
            self.eval_temperature >= 0, "eval_temperature", self.eval_temperature, "must be >= 0 (0 = greedy)"
        )
        require(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]; 1.0 disables nucleus sampling")
        require(self.top_k >= 0, "top_k", self.top_k, "must be >= 0; 0 disables top-k")
        require_choice(self.rollout_backend, "rollout_backend", ROLLOUT_BACKENDS)
        require(
            0.0 < self.vllm_gpu_memory_utilization <= 1.0,
            "vllm_gpu_memory_utilization",
            self.vllm_gpu_memory_utilization,
            "must be in (0, 1] (a share of the GPU's memory)",
        )
        # `use_cpu` is the run section's: a trainer config holds both, a demo's generation part only this one.
        if self.rollout_backend == "vllm" and getattr(self, "use_cpu", False):
            raise ConfigError(
                'rollout_backend="vllm" runs on a CUDA GPU, but use_cpu is true; set use_cpu: false, or '
                'rollout_backend: "hf" to stay on the CPU.'
            )

    def generation_config(self, temperature: float | None = None) -> GenerationConfig:
        """The rollout engine's `GenerationConfig` of a trainer config (`PPOConfig`, `GRPORunConfig`).

        The one mapping from the settings onto the engine: this section's sampling, at `temperature` when given
        (an evaluation passes `eval_temperature`) else the training `temperature`; the environment section's
        per-turn and per-episode token limits; the run's seed. PPO and GRPO roll out with it, and evaluations
        and the demos measure a run's policy with it.
        """
        if not (isinstance(self, EnvironmentSection) and isinstance(self, RunSection)):
            raise TypeError(
                f"{type(self).__name__}.generation_config() needs a trainer config, which also holds the "
                "environment's token limits and the run's seed (a PPOConfig or a GRPORunConfig)"
            )
        # The rollout engine loads torch: imported when a rollout is configured, not with every config.
        from searchrl.rollout.loop import GenerationConfig

        return GenerationConfig(
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens_per_turn=self.max_new_tokens_per_turn,
            max_episode_tokens=self.max_episode_tokens,
            seed=self.seed,
        )


@dataclass
class TrainingSection(Section):
    """The batch, the episode budget and the optimiser (TRL's names)."""

    per_device_train_batch_size: int = field(
        default=8,
        metadata=help_text(
            "Episodes per micro-batch on each process (one forward/backward; GRPO: includes the group's repeats)."
        ),
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata=help_text(
            "Micro-batches per process per rollout batch: per_device_train_batch_size * this episodes per step."
        ),
    )
    total_episodes: int | None = field(
        default=None,
        metadata=help_text(
            "Episodes to train on in total (sets the number of steps); null: PPO makes num_train_epochs passes "
            "over the training questions, GRPO takes max_steps steps."
        ),
    )
    learning_rate: float = field(default=3e-6, metadata=help_text("AdamW learning rate of the policy."))
    lr_scheduler_type: Literal[
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
    ] = field(
        default="linear", metadata=help_text("Learning-rate schedule (transformers.get_scheduler names).")
    )
    warmup_steps: int = field(default=0, metadata=help_text("Optimizer steps of linear warm-up."))
    max_grad_norm: float | None = field(
        default=1.0,
        metadata=help_text("Clip the global gradient norm to this before each optimizer step; null: off."),
    )
    weight_decay: float = field(default=0.0, metadata=help_text("AdamW weight decay."))

    def check(self) -> None:
        require_int(
            self.per_device_train_batch_size >= 1,
            "per_device_train_batch_size",
            self.per_device_train_batch_size,
        )
        require_int(
            self.gradient_accumulation_steps >= 1,
            "gradient_accumulation_steps",
            self.gradient_accumulation_steps,
        )
        if self.total_episodes is not None:
            require(self.total_episodes >= 1, "total_episodes", self.total_episodes, "must be >= 1 or null")
        require(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
        require_choice(self.lr_scheduler_type, "lr_scheduler_type", LR_SCHEDULER_TYPES)
        require(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "must be >= 0")
        if self.max_grad_norm is not None:
            require(
                self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "must be > 0, or null to disable"
            )
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")

    @property
    def episodes_per_step(self) -> int:
        """Episodes one step consumes on one process (`per_device_train_batch_size * gradient_accumulation_steps`)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps


# Never copied by `with_sections_of`: they name the run itself.
RUN_IDENTITY = ("output_dir", "run_name")


def _declaring_class(cls: type, name: str) -> type:
    """The class in `cls`'s MRO that declares the dataclass field `name`."""
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass
    raise KeyError(name)


def with_sections_of(target_cls: type[T], *sources: Any, **overrides: Any) -> T:
    """A `target_cls` config with the sections it shares with `sources` copied from them, then `overrides`.

    A field of `target_cls` is copied from a source when the source is an instance of the class that declares
    the field: a `PPOConfig` onto `GRPORunConfig` copies every section both inherit (run, model, data, search,
    environment, generation, training) and nothing PPO-only; a demo's `environment` part onto `PPOConfig`
    copies that section. Fields no source shares keep `target_cls`'s defaults, and so do `RUN_IDENTITY`'s (a
    config built from another is another run: it never writes into the source's run directory). Two sources
    giving one field, or an override that is no field of `target_cls`, raise ConfigError: nothing can
    disagree silently. The result is checked like any config (`check_sections`).

        grpo = with_sections_of(GRPORunConfig, ppo_args, mode="trl_loop", output_dir="runs/grpo")
    """
    names = [f.name for f in dataclasses.fields(target_cls) if f.init]  # type: ignore[arg-type]
    copied = [name for name in names if name not in RUN_IDENTITY]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ConfigError(f"{unknown} are not {target_cls.__name__} fields")
    values: dict[str, Any] = {}
    given_by: dict[str, str] = {}
    for name in copied:
        owner = _declaring_class(target_cls, name)
        for source in sources:
            if not isinstance(source, owner):
                continue
            if name in values:
                raise ConfigError(
                    f"{name} is given by both {given_by[name]} and {type(source).__name__}; give it once"
                )
            values[name] = _copied(getattr(source, name))
            given_by[name] = type(source).__name__
    values.update(overrides)
    return target_cls(**values)


def _copied(value: Any) -> Any:
    """A list or dict value copied, so that two configs never share one mutable value."""
    return type(value)(value) if isinstance(value, list | dict) else value
