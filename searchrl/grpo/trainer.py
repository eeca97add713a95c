"""GRPO through TRL 1.16's `GRPOTrainer` on the same environment, rewards and run directory as PPO.

Why: users ask whether PPO's critic is worth it. The honest answer needs GRPO trained on the same task,
with the same rubric, the same episode budget and the same evaluation, so this package wires TRL's
trainer to our pieces rather than writing another GRPO. Two modes:

- ``trl_loop``: TRL's own tool loop over our environment (`grpo/trl_loop.py`: the `environment_factory`,
  and each rollout rebuilt as a `Trajectory`); TRL re-prefills the history every tool turn and runs calls
  row by row.
- ``our_rollout``: our batched engine as TRL's `rollout_func` (`grpo/our_rollout.py`): one batched search
  per turn, one KV cache, no re-prefill; HF or vLLM (`rollout_backend`, PPO's factory
  `searchrl.rollout.backends.make_generator`), vLLM's weights synced at every optimizer step. ``trl_loop``
  refuses vLLM (TRL generates there with its own engine).

Either way `RubricReward` (`grpo/reward.py`) scores a real `Trajectory` with our `Rubric` and logs PPO's
metrics through TRL, and `RunDirCallback` (`grpo/run_dir.py`) writes the run directory the PPO trainer
writes, through the same run layer, and finds the checkpoint a resumed run continues from. The prompts are
the environment's own (`grpo/dataset.py`). What these pieces need from TRL's batches (the rows, TRL's
token-level output) and share (episodes, trajectories, the rollout's batch count) is one `BatchRecord`
(`grpo/record.py`), made first and handed to each; none of them knows the trainer.

This module builds the trainer (`build_grpo_trainer` from objects in memory, `run_grpo` from a config) and
holds the few TRL overrides. Resume (`build_grpo_trainer(..., resume=True)`, `run_grpo(cfg, resume=True)`,
`searchrl grpo --resume`) is TRL's `resume_from_checkpoint` on the checkpoint's `trl/` folder (weights from
`policy/`), plus what TRL does not know: the episode count, `our_rollout`'s per-batch sampling seed, both
clocks and the run directory's history after the checkpoint. `EpochRepeatSampler` makes TRL's data order
depend on the epoch alone, so a resumed run replays the uninterrupted run bit for bit on CPU (tested in both
modes).

`SearchGRPOTrainer` is TRL's class with read-only hooks: it writes the batch rows (the `rollout_func`
contract passes only the prompts, and our environments need `golds` and `id`) and the token-level output
of `_generate` (TRL does not pass its tool mask to reward functions) into the record, and saves and loads
our checkpoint layout (`_save_checkpoint`, transformers' checkpoint hook, writes it through the run
directory; its own part is the policy, saved by `save_model_dir`, and TRL's resume state); each private method it overrides says why
no public hook would do. Nothing in TRL's algorithm is
changed. With compact prompts (`tool_schema_in_prompt: false`) `hide_tool_schemas` empties TRL's
per-environment schema list so that its prompts carry no tool section either.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func/environment_factory warnings

import torch
from transformers.trainer_utils import TrainOutput

from searchrl.common.config import ConfigError, save_config
from searchrl.data.datasets import load_qa
from searchrl.env.environment import SearchEnvironment
from searchrl.env.tools import ToolSpec
from searchrl.evaluation.loop import evaluate_during_training
from searchrl.grpo.config import GRPORunConfig
from searchrl.grpo.dataset import ROW_COLUMNS, prompt_dataset
from searchrl.grpo.our_rollout import EngineRollout, EngineWeightSync
from searchrl.grpo.record import BatchRecord, Generation
from searchrl.grpo.reward import RubricReward
from searchrl.grpo.run_dir import RunDirCallback, resume_state
from searchrl.grpo.trl_loop import tool_env_factory
from searchrl.models.forward_patches import remove_trainer_forward_patches, shares_storage
from searchrl.models.io import load_policy, load_tokenizer, save_model_dir
from searchrl.rewards.combine import Rubric, default_rubric, load_rubric
from searchrl.rollout.backends import RolloutBackend, check_backend, make_generator
from searchrl.run.manifest import build_manifest
from searchrl.run.writer import RunDir
from searchrl.search.base import Backend

try:  # TRL is a hard dependency; the import is here so the error names what to install
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler
except ImportError as exc:  # pragma: no cover
    raise ImportError("searchrl.grpo needs trl>=1.16 (pip install 'trl>=1.16')") from exc


# ---------------------------------------------------------------------------------------------
# The trainer: TRL's, plus the hook that remembers the batch
# ---------------------------------------------------------------------------------------------


class EpochRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` with `set_epoch`: epoch e's shuffle is the same in a fresh and a resumed run.

    TRL's sampler draws each epoch's permutation from one generator seeded once, so a resumed run (a new
    sampler) would replay epoch 0's order where the killed run was at epoch e. `set_epoch(e)` (called by
    transformers' training loop before every epoch) reseeds and skips e permutations: exactly the order
    TRL's own sampler gives a run that never stopped.
    """

    def set_epoch(self, epoch: int) -> None:
        if not self.shuffle or self.seed is None:
            return
        self.generator.manual_seed(self.seed)
        for _ in range(epoch):
            torch.randperm(self.num_samples, generator=self.generator)


class SearchGRPOTrainer(GRPOTrainer):
    """TRL 1.16's `GRPOTrainer`, writing each generation batch's rows and token-level output into `record`,
    with our run directory and its checkpoints. Nothing in TRL's algorithm is changed.

    Args (besides TRL's, passed on as they are):
        cfg: the run's config; run: its `RunDir`.
        record: the `BatchRecord` this trainer's reward and rollout were made with.
        evaluate: model -> dev metrics, or None (`RunDirCallback`).
        resume_from: (checkpoint, our saved state) from `resume_state`, or None for a fresh run.

    It makes its `RunDirCallback` (`run_callback`, first among the callbacks) and hands it the trainer's
    part of a checkpoint (`_save_trainer_state`). Public hooks first: `train` (resume from
    `resume_checkpoint`) and `training_step` (the batch rows) are transformers' documented ones. Four private methods remain, each because no public hook gives what it needs
    (TRL 1.16, transformers 5); each says why.
    """

    def __init__(
        self,
        *,
        cfg: GRPORunConfig,
        run: RunDir,
        record: BatchRecord,
        evaluate: Callable[[Any], dict[str, float]] | None = None,
        resume_from: tuple[Path, dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        **trl_kwargs: Any,
    ) -> None:
        self.run = run
        self.record = record
        self.resume_checkpoint: Path | None = resume_from[0] / "trl" if resume_from is not None else None
        self.run_callback = RunDirCallback(
            cfg,
            run,
            record,
            trl_kwargs["processing_class"],
            evaluate,
            save_trainer_state=self._save_trainer_state,
            resume_state=resume_from[1] if resume_from is not None else None,
        )
        super().__init__(callbacks=[self.run_callback, *(callbacks or [])], **trl_kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        if resume_from_checkpoint is None and self.resume_checkpoint is not None:
            resume_from_checkpoint = str(self.resume_checkpoint)
            saved = self.run_callback.resume_state
            done = int(saved["global_step"]) if saved else 0
            if done >= self.args.max_steps:
                # Already at its budget. transformers would still run one step past max_steps when resumed
                # there (it checks the budget after a step), so there is nothing to call.
                return TrainOutput(done, 0.0, {})
            # TRL counts micro-steps (`_step`) to decide when to generate and which buffered slice to train
            # on; transformers' resume restores the global step but TRL's counter starts at 0 and has no
            # setter, so set it to where the killed run was.
            self._step = done * self.args.gradient_accumulation_steps
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        # The generation batch's rows: `rollout_func(prompts, trainer)` gets only the prompts, and our
        # environments need each row's `golds` and `id` (rows with the same question may differ in them).
        self.record.rows = inputs
        return super().training_step(model, inputs, num_items_in_batch)

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        # Private, because transformers builds the sampler inside `get_train_dataloader` with no hook: TRL's
        # `RepeatSampler` draws epoch e's order from a generator seeded once, so a resumed run (a new sampler)
        # would replay epoch 0's order; `EpochRepeatSampler.set_epoch` makes the order depend on the epoch.
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is not RepeatSampler:  # pragma: no cover - a TRL version with another sampler
            return sampler
        return EpochRepeatSampler(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # transformers' checkpoint hook (what it calls when `control.should_save`), private, because `on_save`
        # fires only after transformers has written its own `checkpoint-N/` (the weights a second time, no
        # atomic completion marker, pruned by its own rules): our layout instead, `RUN/checkpoints/step-N/`
        # written atomically and pruned by the run layer (`RunDirCallback`), filled by `_save_trainer_state`.
        self.run_callback.save_checkpoint(int(self.state.global_step))

    def _save_trainer_state(self, folder: Path) -> None:
        """The trainer's part of a checkpoint: `policy/` (`save_model_dir`: weights and tokenizer) and
        `trl/`, what `resume_from_checkpoint` reads: transformers' own pieces of `_save_checkpoint` minus the
        weights (written once, in `policy/`), i.e. optimizer, scheduler, scaler, RNG and trainer state."""
        save_model_dir(self.accelerator.unwrap_model(self.model), self.processing_class, folder / "policy")
        trl_dir = folder / "trl"
        trl_dir.mkdir()
        self._save_optimizer_and_scheduler(str(trl_dir))
        self._save_scaler(str(trl_dir))
        self._save_rng_state(str(trl_dir))
        self.state.save_to_json(str(trl_dir / "trainer_state.json"))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        # Private, because transformers loads the weights from `resume_from_checkpoint` itself: ours keep
        # TRL's optimizer/scheduler/RNG/state files in `step-N/trl/` and the weights once, in `step-N/policy/`
        # (a loadable model directory), so point it there.
        policy = Path(resume_from_checkpoint).parent / "policy"
        source = policy if (policy / "config.json").is_file() else Path(resume_from_checkpoint)
        super()._load_from_checkpoint(str(source), model)

    def _generate(self, prompts: list) -> Any:
        # Private, because TRL hands reward functions the completion ids but not the prompt ids, the tool mask
        # or the sampling logprobs, which `trl_loop` needs to rebuild each rollout as a `Trajectory`.
        out = super()._generate(prompts)
        prompt_ids, completion_ids, tool_mask, _completions, logprobs = out[:5]
        self.record.generation = Generation(
            prompt_ids, completion_ids, tool_mask, logprobs, training=self.model.training
        )
        return out


# ---------------------------------------------------------------------------------------------
# Assembly
# ---------------------------------------------------------------------------------------------


def _check_reference_model_source(cfg: GRPORunConfig, model: Any) -> None:
    """TRL reloads the reference from `config._name_or_path` when beta > 0 (trl.md §2.7): it must be local."""
    if cfg.beta == 0:
        return
    source = getattr(model.config, "_name_or_path", "") or ""
    if not (Path(source) / "config.json").is_file():
        raise ConfigError(
            f"beta={cfg.beta}: TRL reloads the reference model from the policy's config._name_or_path "
            f"({source!r}), which is not a local model directory. Save the policy with save_pretrained and "
            "load it from that directory (searchrl.models.io.load_policy), or set beta: 0."
        )


def _check_reference_matches_policy(trainer: Any, model: Any) -> None:
    """TRL's reference (reloaded from disk) must be the policy GRPO starts from, weight for weight.

    A policy changed in memory after it was loaded (an in-process SFT) would otherwise be regularised
    towards the stale weights on disk; and the reference must not share storage with the policy.
    """
    ref = getattr(trainer, "ref_model", None)
    if ref is None:
        return
    ref = trainer.accelerator.unwrap_model(ref)
    if shares_storage(ref, model):
        raise RuntimeError("GRPO's reference model shares storage with the policy (a bug; please report)")
    ref_state = ref.state_dict()
    differ = [
        name
        for name, value in model.state_dict().items()
        if name in ref_state and not torch.equal(ref_state[name].to(value.device, value.dtype), value)
    ]
    if differ:
        raise ConfigError(
            f"beta={trainer.beta}: TRL loaded the reference from {model.config._name_or_path!r}, but the policy "
            f"you passed has other weights ({len(differ)} tensors differ, e.g. {differ[0]}): it was changed "
            "after it was loaded. Save the policy (save_pretrained) and load it from that directory, or set beta: 0."
        )


def hide_tool_schemas(trainer: SearchGRPOTrainer) -> None:
    """Compact prompts in TRL's loop: render no tool section, exactly as our engine does.

    TRL renders (and parses) with the per-environment schema list `_env_tools` and dispatches calls
    through a separate name -> method table, so emptying the schema list changes only the prompt text
    (and makes argument parsing untyped JSON); the `search` tool is still callable. Tested by comparing
    TRL's prompt ids with the engine's.
    """
    env_tools = getattr(trainer, "_env_tools", None)
    if not isinstance(env_tools, dict):
        raise RuntimeError("this TRL version has no GRPOTrainer._env_tools; use tool_schema_in_prompt: true")
    for name in env_tools:
        env_tools[name] = []


def build_grpo_trainer(
    cfg: GRPORunConfig,
    model: Any,
    tokenizer: Any,
    backend: Backend,
    train_rows: Sequence[dict[str, Any]],
    eval_rows: Sequence[dict[str, Any]] | None = None,
    rubric: Rubric | None = None,
    callbacks: list[Any] | None = None,
    resume: bool = False,
    generator_factory: Callable[..., Any] | None = None,
    tools: Sequence[ToolSpec] = (),
) -> SearchGRPOTrainer:
    """A ready-to-train `SearchGRPOTrainer` for `cfg.mode`, with config.yaml and manifest.json written.

    The trainer carries `.run` (the `RunDir`), `.record` (its `BatchRecord`) and `.run_callback`. With
    `resume=True` and a complete checkpoint in `cfg.output_dir`, `trainer.train()` continues from the newest one
    (`resume_state`); without a checkpoint the run starts fresh, as `searchrl train --resume` does.
    `generator_factory(model, tokenizer, generation_config)` starts `our_rollout`'s engine (PPOTrainer's
    argument); None: `make_generator` with the config's `rollout_backend`, checked here first. `tools` are
    user-defined tools every episode offers besides search (`SearchEnvironment(tools=...)`), in both modes.
    """
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ValueError("the tokenizer needs a pad token distinct from EOS (Qwen2.5: <|endoftext|>)")
    _check_reference_model_source(cfg, model)
    # Wrappers an earlier trainer (an in-process SFT) left on `forward` go before TRL adds its own.
    remove_trainer_forward_patches(model)
    rubric = rubric if rubric is not None else default_rubric()
    run = RunDir(cfg.output_dir)
    resume_from = resume_state(cfg, run) if resume else None
    env_config = cfg.env_config()

    def search_env() -> SearchEnvironment:
        return SearchEnvironment(backend, env_config, tokenizer=tokenizer, tools=tools)

    # What the trainer, its reward, rollout and run directory share; a resumed run's counts go on.
    saved = resume_from[1] if resume_from is not None else {}
    record = BatchRecord(
        episodes=int(saved.get("episode", 0)), rollout_calls=int(saved.get("rollout_calls", 0))
    )
    reward = RubricReward(rubric, tokenizer, record)
    rollout = None
    if cfg.mode == "our_rollout":
        if generator_factory is None:
            engine_settings = RolloutBackend.of(cfg)
            check_backend(engine_settings)  # before TRL loads anything: vllm, CUDA, use_cpu
            generator_factory = partial(make_generator, backend=engine_settings)
        rollout = EngineRollout(tokenizer, search_env, cfg.generation_config(), record, generator_factory)
    evaluate = None
    if eval_rows and (cfg.eval_steps or cfg.eval_on_start):
        dev_rows = [
            {k: r[k] for k in ROW_COLUMNS if k in r} for r in list(eval_rows)[: cfg.num_eval_questions]
        ]
        eval_config = cfg.generation_config(temperature=cfg.eval_temperature)

        def evaluate(model: Any) -> dict[str, float]:
            # The dev loop every trainer shares, with our engine in both modes, at eval_temperature; the run's
            # own vLLM engine (its weights synced after every step) when rollout_backend is vllm, as PPO's.
            engine = rollout.engine(model) if rollout is not None and cfg.rollout_backend == "vllm" else None
            return evaluate_during_training(
                model,
                tokenizer,
                dev_rows,
                search_env,
                eval_config,
                rubric=rubric,
                batch_size=cfg.eval_batch_size,
                seed=eval_config.seed,
                generator=engine,
            )

    mode_kwargs: dict[str, Any]
    own_callbacks: list[Any] = []
    if rollout is None:
        mode_kwargs = {"environment_factory": tool_env_factory(backend, env_config, tokenizer, tools)}
    else:
        mode_kwargs = {"rollout_func": rollout}
        own_callbacks.append(EngineWeightSync(rollout))  # vLLM: the new weights after every optimizer step
    trainer = SearchGRPOTrainer(
        cfg=cfg,
        run=run,
        record=record,
        evaluate=evaluate,
        resume_from=resume_from,
        model=model,
        reward_funcs=[reward],
        args=cfg.to_trl_args(cuda_available=torch.cuda.is_available()),
        train_dataset=prompt_dataset(train_rows, backend, env_config),
        processing_class=tokenizer,
        callbacks=[*own_callbacks, *(callbacks or [])],
        **mode_kwargs,
    )
    if rollout is not None and cfg.rollout_backend == "vllm" and trainer.is_deepspeed_enabled:
        check_backend(RolloutBackend.of(cfg, uses_deepspeed=True))  # refused, saying why
    _check_reference_matches_policy(trainer, model)
    if cfg.mode == "trl_loop" and not cfg.tool_schema_in_prompt:
        hide_tool_schemas(trainer)
    save_config(cfg, run.config)
    run.write_manifest(
        build_manifest(
            seeds={"seed": cfg.seed},
            tokenizer=tokenizer,
            generation_config=asdict(cfg.generation_config()),
            index_fingerprint=getattr(backend, "fingerprint", None),
            config=cfg,
            extra={
                "trainer": "grpo",
                "mode": cfg.mode,
                "num_generations": cfg.num_generations,
                "beta": cfg.beta,
                "loss_type": cfg.loss_type,
                "episodes_per_step": cfg.episodes_per_step,
                "max_steps": cfg.num_steps,
                "resumed_from_step": None if resume_from is None else int(resume_from[1]["global_step"]),
            },
        )
    )
    return trainer


def run_grpo(cfg: GRPORunConfig, resume: bool = False) -> Path:
    """Train GRPO as `cfg` says and return the run directory (what the demo's side-by-side reads).

    `resume=True` continues a killed run from its newest checkpoint in `cfg.output_dir` (TRL's
    `resume_from_checkpoint` for optimizer, scheduler, RNG and data position; our episode count, rollout
    seeds, clocks and run-directory history), or starts fresh when it has none.
    """
    if not cfg.policy_model_path:
        raise ConfigError(
            "policy_model_path: set it to the starting policy's directory (e.g. the SFT output)"
        )
    if not cfg.train_file:
        raise ConfigError("train_file: set it to the training questions (JSONL with question and golds)")
    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.policy_model_path)
    model = load_policy(cfg.policy_model_path)
    model.train()
    backend = cfg.open_backend(read_timeout=cfg.search_timeout_s)
    rubric = load_rubric(cfg.reward_config_path) if cfg.reward_config_path else default_rubric()
    train_rows = load_qa(cfg.train_file)
    eval_rows = load_qa(cfg.dev_file) if cfg.dev_file else None
    trainer = build_grpo_trainer(cfg, model, tokenizer, backend, train_rows, eval_rows, rubric, resume=resume)
    trainer.train()
    return cfg.run_dir
