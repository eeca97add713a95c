"""SFT warm start with TRL's SFTTrainer on expert trajectories: a real (small) training run.

One module-scoped run (tiny model, 150 steps) backs the behavioural tests: the loss falls, parameters
change, and greedy first turns on dev questions, through the real environment, are well-formed tool
calls at least 80% of the time (the untrained model writes none). Smaller tests check that the trainer
keeps our labels exactly and that bad input is refused.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import TrainerCallback
from worlds import TINY_WIDE

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import Trajectory
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.sft.examples import (
    IGNORE_INDEX,
    answer_turn_example,
    copy_pretraining_dataset,
    first_turn_example,
    sft_dataset,
    sft_example,
    span_copy_example,
    with_copy_examples,
)
from searchrl.sft.expert import ExpertConfig, ExpertPolicy
from searchrl.sft.pipeline import dev_tool_call_rate, prompt_texts
from searchrl.sft.warm_start import (
    SFTWarmStartConfig,
    make_sft_trainer,
    run_sft,
    sft_total_steps,
    warm_start,
)

MODEL = TINY_WIDE
TRAIN = SFTWarmStartConfig(
    learning_rate=1e-2, max_steps=150, per_device_train_batch_size=4, warmup_ratio=0.1, logging_steps=1
)


@pytest.fixture(scope="module")
def setup(synthetic_index):
    torch.set_num_threads(1)
    synthetic = synthetic_index(0)
    task, backend = synthetic.task, synthetic.backend
    rows = task.splits["train"]
    probe = SearchEnvironment(backend, EnvConfig())
    tok = train_tokenizer(
        tokenizer_training_texts(task.corpus, rows) + prompt_texts(probe, rows), vocab_size=1024
    )
    policy = build_policy(tok, MODEL)
    envs = [SearchEnvironment(backend, EnvConfig(), tokenizer=tok) for _ in rows]
    # k=1 keeps observations short (cheap steps); the format to learn is the same for any k.
    demos = ExpertPolicy(ExpertConfig(noise=0.0, k=1)).demonstrate(policy, tok, envs, rows)
    return {"task": task, "backend": backend, "tok": tok, "policy": policy, "demos": demos}


@pytest.fixture(scope="module")
def trained(setup):
    policy, tok = setup["policy"], setup["tok"]
    dev = setup["task"].splits["dev"]
    before_rate = dev_tool_call_rate(policy, tok, setup["backend"], EnvConfig(), dev)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    outcome = run_sft(policy, tok, setup["demos"], TRAIN)
    return {"outcome": outcome, "before": before, "before_rate": before_rate}


def test_sft_loss_falls(trained):
    losses = trained["outcome"].losses
    assert len(losses) == TRAIN.max_steps
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert last < 0.25 * first, f"loss should fall well below its start: {first:.3f} -> {last:.3f}"


def test_sft_changes_every_parameter_tensor(trained):
    tuned = dict(trained["outcome"].policy.named_parameters())
    unchanged = [n for n, before in trained["before"].items() if torch.equal(before, tuned[n].detach())]
    assert unchanged == []


def test_tuned_model_writes_well_formed_tool_calls_on_dev(setup, trained):
    policy = trained["outcome"].policy
    dev = setup["task"].splits["dev"]
    rate = dev_tool_call_rate(policy, setup["tok"], setup["backend"], EnvConfig(), dev)
    assert trained["before_rate"] < 0.2, "the untrained model should not already write tool calls"
    assert rate >= 0.8, f"only {rate:.0%} of dev first turns are well-formed tool calls"


def test_sft_trainer_keeps_our_ids_and_labels(setup, tmp_path):
    """The collated batch holds exactly our ids and labels (no re-tokenising, no dropped labels)."""
    demos = setup["demos"][:3]
    dataset = sft_dataset(demos)
    policy = build_policy(setup["tok"], MODEL)
    config = SFTWarmStartConfig(max_steps=1, per_device_train_batch_size=3)
    trainer = make_sft_trainer(policy, setup["tok"], dataset, config, str(tmp_path))
    batch = next(iter(trainer.get_train_dataloader()))
    rows = {tuple(sft_example(t)["input_ids"]): sft_example(t)["labels"] for t in demos}
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True):
        n = int(mask.sum())
        key = tuple(int(i) for i in ids[:n])
        assert key in rows, "the trainer changed the token ids"
        assert [int(x) for x in labels[:n]] == rows[key]
        assert set(int(x) for x in labels[n:]) <= {IGNORE_INDEX}


def test_warm_start_returns_the_tuned_policy(setup):
    policy = build_policy(setup["tok"], MODEL)
    before = [p.detach().clone() for p in policy.parameters()]
    config = SFTWarmStartConfig(max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3)
    tuned = warm_start(policy, setup["tok"], setup["demos"][:4], config)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, tuned.parameters(), strict=True))


def test_max_length_cuts_examples_and_refuses_ones_with_nothing_to_train(setup):
    traj = setup["demos"][0]
    cut = sft_example(traj, max_length=traj.prompt_length + 3)
    assert len(cut["input_ids"]) == traj.prompt_length + 3
    with pytest.raises(ValueError, match="no action token"):
        sft_dataset([traj], max_length=traj.prompt_length)
    with pytest.raises(ValueError, match="at least one trajectory"):
        sft_dataset([])


def test_inconsistent_trajectory_is_refused():
    bad = Trajectory(id="t", question_id="q", question="?", golds=[], input_ids=[1, 2], action_mask=[1])
    with pytest.raises(ValueError, match="same length"):
        sft_example(bad)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"max_steps": -1, "num_train_epochs": 0}, "num_train_epochs"),
        ({"max_length": 2}, "max_length"),
        ({"warmup_ratio": 1.5}, "warmup_ratio"),
        ({"answer_turn_steps": -1}, "answer_turn_steps"),
        ({"answer_turn_batch_size": 0}, "answer_turn_batch_size"),
        ({"copy_pretrain_steps": -1}, "copy_pretrain_steps"),
        ({"copy_pretrain_batch_size": 0}, "copy_pretrain_batch_size"),
        ({"copy_pretrain_window": 3}, "copy_pretrain_window"),
        ({"copy_pretrain_learning_rate": -1e-3}, "copy_pretrain_learning_rate"),
        ({"copy_pretrain_task_share": 1.5}, "copy_pretrain_task_share"),
        ({"copy_replay_share": 1.0}, "copy_replay_share"),
        ({"copy_replay_share": -0.1}, "copy_replay_share"),
    ],
)
def test_bad_sft_config_is_refused(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        SFTWarmStartConfig(**kwargs)


def test_first_turn_example_is_the_prompt_and_the_first_action_turn(setup):
    for traj in setup["demos"][:8]:
        full, first = sft_example(traj), first_turn_example(traj)
        n = len(first["input_ids"])
        assert first["input_ids"] == full["input_ids"][:n] and first["labels"] == full["labels"][:n]
        first_action = next(s for s in traj.spans if s.kind == "action")
        assert n == first_action.end  # cut right after the first action turn (its EOS included)
        trained = [i for i, label in enumerate(first["labels"]) if label != IGNORE_INDEX]
        assert trained == list(range(first_action.start, first_action.end))
        assert len(traj.action_texts) == 1 or n < len(full["input_ids"])


def test_answer_turn_example_keeps_the_context_and_labels_only_the_last_action_turn(setup):
    searched = [t for t in setup["demos"] if len(t.action_texts) > 1][:8]
    assert searched, "the fixture's expert searches before it answers"
    for traj in searched:
        full, answer = sft_example(traj), answer_turn_example(traj)
        last_action = [s for s in traj.spans if s.kind == "action"][-1]
        n = len(answer["input_ids"])
        assert n == last_action.end and answer["input_ids"] == full["input_ids"][:n]
        trained = [i for i, label in enumerate(answer["labels"]) if label != IGNORE_INDEX]
        assert trained == list(range(last_action.start, last_action.end))
        assert [answer["labels"][i] for i in trained] == full["input_ids"][
            last_action.start : last_action.end
        ]
        assert "<answer>" in setup["tok"].decode(full["input_ids"][last_action.start : last_action.end])
    with pytest.raises(ValueError, match="exclude each other"):
        sft_dataset(searched, first_turn_only=True, answer_turn_only=True)


def test_the_curriculum_trains_first_turns_then_whole_demonstrations(setup):
    policy = build_policy(setup["tok"], MODEL)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    config = SFTWarmStartConfig(
        max_steps=3,
        per_device_train_batch_size=2,
        first_turn_steps=4,
        first_turn_batch_size=4,
        lr_scheduler_type="warmup_stable_decay",
        decay_ratio=0.5,
        logging_steps=1,
    )
    outcome = run_sft(policy, setup["tok"], setup["demos"][:8], config)
    assert len(outcome.losses) == 4 + 3  # one logged loss per step of each phase
    with_answers = run_sft(
        build_policy(setup["tok"], MODEL),
        setup["tok"],
        setup["demos"][:8],
        dataclasses.replace(config, answer_turn_steps=2, answer_turn_batch_size=2),
    )
    assert len(with_answers.losses) == 4 + 2 + 3
    tuned = dict(outcome.policy.named_parameters())
    assert all(not torch.equal(b, tuned[n].detach()) for n, b in before.items())


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 50), min_size=4, max_size=300),
    window=st.integers(4, 160),
    max_span=st.integers(1, 24),
    seed=st.integers(0, 2**16),
)
def test_a_span_copy_example_repeats_a_span_of_its_window_and_labels_it_after_the_cue(
    ids, window, max_span, seed
):
    ex = span_copy_example(ids, random.Random(seed), window=window, max_span=max_span)
    labels, tokens = ex["labels"], ex["input_ids"]
    trained = [i for i, label in enumerate(labels) if label != IGNORE_INDEX]
    assert trained, "every example trains at least two tokens"
    span_start = trained[0] - 2  # the cue: the span's first two tokens, given, not trained
    context, span = tokens[:span_start], tokens[span_start:]
    assert trained == list(range(span_start + 2, len(tokens)))
    assert [labels[i] for i in trained] == span[2:]
    assert 4 <= len(span) <= max(4, min(max_span, len(context))) and len(context) <= window
    assert any(ids[i : i + len(context)] == context for i in range(len(ids) - len(context) + 1))
    assert any(context[i : i + len(span)] == span for i in range(len(context) - len(span) + 1))


def test_a_span_copy_example_refuses_a_context_too_short_to_copy_from():
    with pytest.raises(ValueError, match="at least 4 tokens"):
        span_copy_example([1, 2, 3], random.Random(0))
    with pytest.raises(ValueError, match="a window of 3"):
        span_copy_example(list(range(50)), random.Random(0), window=3)


def test_copy_pretraining_data_is_drawn_from_the_demonstrations_by_seed(setup):
    demos = setup["demos"][:8]
    a, b = copy_pretraining_dataset(demos, 16, seed=3), copy_pretraining_dataset(demos, 16, seed=3)
    assert len(a) == 16 and a["input_ids"] == b["input_ids"]
    assert a["input_ids"] != copy_pretraining_dataset(demos, 16, seed=4)["input_ids"]
    streams = [[int(i) for i in d.input_ids] for d in demos]
    for tokens, labels in zip(a["input_ids"], a["labels"], strict=True):
        context = tokens[: labels.index(next(x for x in labels if x != IGNORE_INDEX)) - 2]
        assert any(
            s[i : i + len(context)] == context for s in streams for i in range(len(s) - len(context) + 1)
        )


def test_task_copy_examples_take_their_share_of_the_span_copy_data(setup):
    demos = setup["demos"][:8]
    task = [{"input_ids": [7, 8, 9, 7, 8, 9], "labels": [IGNORE_INDEX] * 5 + [9]}]
    spans = copy_pretraining_dataset(demos, 40, seed=3)
    assert copy_pretraining_dataset(demos, 40, seed=3, task_examples=task)["input_ids"] == spans["input_ids"]
    assert copy_pretraining_dataset(demos, 40, 3, 128, task, 1.0)["input_ids"] == [task[0]["input_ids"]] * 40
    mixed = copy_pretraining_dataset(demos, 400, 3, 128, task, 0.5)["input_ids"]
    assert 150 <= mixed.count(task[0]["input_ids"]) <= 250
    with pytest.raises(ValueError, match="task_examples"):
        copy_pretraining_dataset(demos, 4, 3, 128, (), 0.5)


def test_the_span_copy_phase_trains_at_its_own_rate_and_asks_for_the_task_s_examples(setup):
    rates: list[tuple[int, float]] = []

    class Rates(TrainerCallback):
        phase = 0

        def on_train_begin(self, args, state, control, **kw):
            Rates.phase += 1

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "learning_rate" in logs:
                rates.append((Rates.phase, logs["learning_rate"]))

    config = SFTWarmStartConfig(
        learning_rate=3e-3, max_steps=2, per_device_train_batch_size=2, warmup_ratio=0.0,
        lr_scheduler_type="constant", copy_pretrain_steps=2, copy_pretrain_batch_size=2, copy_pretrain_window=32,
        copy_pretrain_learning_rate=1e-3, copy_pretrain_task_share=0.5, logging_steps=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="copy_examples"):
        run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:4], config)
    task = [
        {"input_ids": [int(i) for i in setup["demos"][0].input_ids[:40]], "labels": [IGNORE_INDEX] * 39 + [5]}
    ]
    run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:4], config, [Rates()], task)
    assert {round(r, 6) for p, r in rates if p == 1} == {1e-3}
    assert {round(r, 6) for p, r in rates if p == 2} == {3e-3}


def test_replayed_copy_examples_take_their_share_and_leave_the_demonstrations_as_they_were(setup):
    demos = sft_dataset(setup["demos"][:8])
    task = [
        {"input_ids": [7, 8, 9, 7, 8, 9], "labels": [IGNORE_INDEX] * 5 + [9]},
        {"input_ids": [5, 6], "labels": [-100, 6]},
    ]
    assert with_copy_examples(demos, task, 0.0) is demos
    mixed = with_copy_examples(demos, task, 0.5, seed=1)
    assert (
        len(mixed) == 16
        and mixed["input_ids"][:8] == demos["input_ids"]
        and mixed["labels"][:8] == demos["labels"]
    )
    assert all(ids in [t["input_ids"] for t in task] for ids in mixed["input_ids"][8:])
    assert len(set(map(tuple, mixed["input_ids"][8:]))) == 2  # drawn from every example, not one
    assert mixed["input_ids"] == with_copy_examples(demos, task, 0.5, seed=1)["input_ids"]
    assert len(with_copy_examples(demos, task, 0.2)) == 10
    with pytest.raises(ValueError, match="copy examples"):
        with_copy_examples(demos, (), 0.2)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        with_copy_examples(demos, task, 1.0)


def test_every_later_phase_replays_the_task_s_copies_and_the_total_counts_them(setup):
    seen: list[int] = []

    class Sizes(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kw):
            seen.append(len(train_dataloader.dataset))

    # max_steps 0: the epochs decide
    config = SFTWarmStartConfig(
        max_steps=0, num_train_epochs=1, per_device_train_batch_size=4, first_turn_steps=1, first_turn_batch_size=4,
        copy_replay_share=0.5, logging_steps=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="copy_replay_share"):
        run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:4], config)
    task = [
        {"input_ids": [int(i) for i in setup["demos"][0].input_ids[:40]], "labels": [IGNORE_INDEX] * 39 + [5]}
    ]
    outcome = run_sft(
        build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:4], config, [Sizes()], task
    )
    assert seen == [8, 8]  # first-turn and whole-demonstration phases: 4 demonstrations + 4 copies each
    assert outcome.num_examples == 8
    assert len(outcome.losses) == sft_total_steps(config, 4) == 1 + 2  # 8 examples, batch 4


def test_span_copying_comes_before_the_curriculum_and_counts_in_the_total(setup):
    policy = build_policy(setup["tok"], MODEL)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    config = SFTWarmStartConfig(
        max_steps=3,
        per_device_train_batch_size=2,
        copy_pretrain_steps=3,
        copy_pretrain_batch_size=4,
        copy_pretrain_window=32,
        first_turn_steps=2,
        first_turn_batch_size=4,
        logging_steps=1,
    )
    assert sft_total_steps(config, 8) == 3 + 2 + 3
    outcome = run_sft(policy, setup["tok"], setup["demos"][:8], config)
    assert len(outcome.losses) == 3 + 2 + 3  # one logged loss per step of each phase
    tuned = dict(outcome.policy.named_parameters())
    assert all(not torch.equal(b, tuned[n].detach()) for n, b in before.items())


def test_the_plain_loss_gives_trl_s_loss_and_gradients(setup, tmp_path):
    """`trl_loss=False` swaps TRL's chunked loss kernel for transformers' own; the optimisation must not change."""
    policy = build_policy(setup["tok"], MODEL)
    dataset = sft_dataset(setup["demos"][:8])

    def loss_and_grad(trl_loss: bool) -> tuple[float, torch.Tensor, str]:
        config = SFTWarmStartConfig(max_steps=1, per_device_train_batch_size=8, trl_loss=trl_loss)
        trainer = make_sft_trainer(policy, setup["tok"], dataset, config, str(tmp_path / str(trl_loss)))
        batch = next(iter(trainer.get_train_dataloader()))
        policy.zero_grad()
        policy.train()
        items = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        loss = trainer.compute_loss(policy, dict(batch), num_items_in_batch=items)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
        return loss.item(), grad, type(trainer).__name__

    trl_value, trl_grad, trl_name = loss_and_grad(True)
    plain_value, plain_grad, plain_name = loss_and_grad(False)
    assert (trl_name, plain_name) == ("SFTTrainer", "PlainLossSFTTrainer")
    assert plain_value == pytest.approx(trl_value, rel=1e-5)
    assert torch.nn.functional.cosine_similarity(plain_grad, trl_grad, dim=0) > 0.9999
    assert torch.allclose(plain_grad, trl_grad, rtol=1e-3, atol=1e-6)


GATED = SFTWarmStartConfig(
    max_steps=8,
    per_device_train_batch_size=2,
    lr_scheduler_type="warmup_stable_decay",
    decay_ratio=0.25,  # the decay's 2 steps start after step 6: where the gate measures
    logging_steps=1,
    copy_gate=0.5,
    copy_gate_chunk=3,
    copy_gate_max_steps=9,
)


def _rates(monkeypatch, *rates: float) -> list[float]:
    """The copy gate's measurements, in order (the last one repeats)."""
    from searchrl.sft import copy_check

    given = list(rates)
    monkeypatch.setattr(
        copy_check, "answer_copy_rate", lambda policy, demos: given.pop(0) if len(given) > 1 else given[0]
    )
    return given


def test_a_policy_that_copies_at_the_gate_trains_exactly_as_without_it(setup, monkeypatch):
    _rates(monkeypatch, 0.9)
    torch.manual_seed(0)
    gated = run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:8], GATED)
    torch.manual_seed(0)
    plain = run_sft(
        build_policy(setup["tok"], MODEL),
        setup["tok"],
        setup["demos"][:8],
        dataclasses.replace(GATED, copy_gate=0.0),
    )
    assert gated.copy_gate == [{"step": 6.0, "answer_copy_rate": 0.9}] and plain.copy_gate == []
    assert len(gated.losses) == len(plain.losses) == 8
    plain_weights = dict(plain.policy.named_parameters())
    assert all(torch.equal(p, plain_weights[n]) for n, p in gated.policy.named_parameters())


def test_a_policy_that_does_not_copy_trains_on_at_the_stable_rate_until_it_does_then_decays(
    setup, monkeypatch
):
    _rates(monkeypatch, 0.0, 0.1, 0.8, 0.85)  # at the gate, after each stable chunk, after the decay
    outcome = run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:8], GATED)
    assert [h["step"] for h in outcome.copy_gate] == [6, 9, 12, 14]
    assert [h["answer_copy_rate"] for h in outcome.copy_gate] == [0.0, 0.1, 0.8, 0.85]
    assert len(outcome.losses) == 6 + 3 + 3 + 2  # the whole phase stopped at the gate; two chunks; the decay


def test_a_reading_gate_measures_every_turn_after_an_observation(setup, monkeypatch):
    """copy_gate_turns: reading (issue 26: an order id read out of a search result counts, not only the
    answer): the gate measures reading_copy_rate, records it under its own name, and extends on it."""
    from searchrl.sft import copy_check

    given = [0.2, 0.9]
    monkeypatch.setattr(
        copy_check, "reading_copy_rate", lambda policy, demos: given.pop(0) if len(given) > 1 else given[0]
    )
    monkeypatch.setattr(
        copy_check, "answer_copy_rate", lambda policy, demos: pytest.fail("the answer rate was read")
    )
    config = dataclasses.replace(GATED, copy_gate_turns="reading")
    outcome = run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:8], config)
    assert [h["reading_copy_rate"] for h in outcome.copy_gate] == [0.2, 0.9, 0.9]  # gate, one chunk, decay
    assert [h["step"] for h in outcome.copy_gate] == [6, 9, 11]


def test_the_gate_gives_up_when_its_budget_is_spent_and_still_decays(setup, monkeypatch):
    _rates(monkeypatch, 0.0)
    config = dataclasses.replace(GATED, copy_gate_max_steps=4)
    outcome = run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:8], config)
    assert [h["step"] for h in outcome.copy_gate] == [6, 9, 10, 12]  # chunks of 3 and 1, then the decay
    assert len(outcome.losses) == 12


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"copy_gate": 1.5}, "copy_gate: a share"),
        ({"lr_scheduler_type": "cosine"}, "warmup_stable_decay"),
        ({"copy_gate_chunk": 0}, "copy_gate_chunk"),
        ({"copy_gate_turns": "calls"}, "copy_gate_turns: one of"),
    ],
)
def test_a_bad_copy_gate_is_refused(changes, needle):
    with pytest.raises(ConfigError, match=needle):
        dataclasses.replace(GATED, **changes)


def test_the_copy_phase_gate_goes_on_in_chunks_until_its_budget_or_until_passed(setup, monkeypatch):
    steps: list[int] = []

    class Steps(TrainerCallback):
        def on_train_end(self, args, state, control, **kw):
            steps.append(state.global_step)

    # Every second example is held out for the gate: 5 and 6 in the same context, so at most one of them is
    # reproduced and a gate of 1.0 cannot pass; the phase trains on the other two.
    context = [int(i) for i in setup["demos"][0].input_ids[:40]]
    task = [{"input_ids": context, "labels": [IGNORE_INDEX] * 39 + [label]} for label in (5, 7, 6, 7)]
    base = dict(
        learning_rate=3e-3, max_steps=1, per_device_train_batch_size=2, warmup_ratio=0.0, lr_scheduler_type="constant",
        copy_pretrain_steps=2, copy_pretrain_batch_size=2, copy_pretrain_window=32, copy_pretrain_task_share=0.5,
        copy_gate_chunk=2, logging_steps=1,
    )  # fmt: skip
    demos = setup["demos"][:4]
    policy = build_policy(setup["tok"], MODEL)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    # An unreachable gate: the phase goes on, two steps a chunk, until the 3 extra steps are spent (2 + 1).
    unreachable = SFTWarmStartConfig(**base, copy_pretrain_gate=1.0, copy_pretrain_gate_max_steps=3)
    outcome = run_sft(policy, setup["tok"], demos, unreachable, [Steps()], task)
    assert steps == [2, 2, 1, 1]  # the phase, two chunks, then the whole-demonstration phase
    assert [m["copy_phase_step"] for m in outcome.copy_gate] == [2.0, 4.0, 5.0]
    assert all(m["copy_example_rate"] <= 0.5 for m in outcome.copy_gate)
    assert any(not torch.equal(before[n], p) for n, p in outcome.policy.named_parameters())
    # A gate passed after the first chunk: no further chunk (the measurements here are given, in order).
    steps.clear()
    rates = iter([0.1, 0.6, 0.9])
    monkeypatch.setattr("searchrl.sft.warm_start.labelled_copy_rate", lambda policy, examples: next(rates))
    passed = SFTWarmStartConfig(**base, copy_pretrain_gate=0.5, copy_pretrain_gate_max_steps=100)
    again = run_sft(build_policy(setup["tok"], MODEL), setup["tok"], demos, passed, [Steps()], task)
    assert steps == [2, 2, 1] and again.copy_gate == [
        {"copy_phase_step": 2.0, "copy_example_rate": 0.1},
        {"copy_phase_step": 4.0, "copy_example_rate": 0.6},
    ]
    with pytest.raises(ConfigError, match="copy_pretrain_gate gates the span-copy phase"):
        SFTWarmStartConfig(copy_pretrain_gate=0.5)
    with pytest.raises(ConfigError, match="copy_pretrain_gate must be in"):
        SFTWarmStartConfig(copy_pretrain_steps=2, copy_pretrain_gate=1.5)


def test_the_copy_phase_gate_waits_for_every_group_of_copy_examples_not_their_mean(setup, monkeypatch):
    # Two groups: "big" (4 of 5 examples) reproduced at once, "small" only after the first chunk. Their mean
    # passes a gate of 0.75 at step 2 (0.8); the gate goes on until the small group passes too.
    context = [int(i) for i in setup["demos"][0].input_ids[:40]]
    task = [
        {"input_ids": context, "labels": [IGNORE_INDEX] * 39 + [label], "group": group}
        for label, group in [(5, "big"), (6, "big"), (5, "big"), (6, "big"), (7, "small"), (8, "small")]
    ]
    measured: list[list[str]] = []
    small_rates = iter([0.0, 1.0])

    def rate(policy, examples):
        measured.append([e["group"] for e in examples])
        return 1.0 if examples[0]["group"] == "big" else next(small_rates)

    monkeypatch.setattr("searchrl.sft.warm_start.labelled_copy_rate", rate)
    config = SFTWarmStartConfig(
        learning_rate=3e-3, max_steps=1, per_device_train_batch_size=2, warmup_ratio=0.0, lr_scheduler_type="constant",
        copy_pretrain_steps=2, copy_pretrain_batch_size=2, copy_pretrain_window=32, copy_pretrain_task_share=1.0,
        copy_gate_chunk=2, logging_steps=1, copy_pretrain_gate=0.75, copy_pretrain_gate_max_steps=10,
    )  # fmt: skip
    outcome = run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:4], config, (), task)
    assert outcome.copy_gate == [
        {"copy_phase_step": 2.0, "copy_example_rate": 0.0, "copy_example_rate/big": 1.0,
         "copy_example_rate/small": 0.0},
        {"copy_phase_step": 4.0, "copy_example_rate": 1.0, "copy_example_rate/big": 1.0,
         "copy_example_rate/small": 1.0},
    ]  # fmt: skip
    assert measured == [["big", "big"], ["small"]] * 2  # each group apart, every time


def test_a_focused_chunk_draws_its_share_from_the_groups_below_the_gate_and_the_rest_from_all(
    setup, monkeypatch
):
    from searchrl.sft import warm_start

    context = [int(i) for i in setup["demos"][0].input_ids[:40]]
    task = [
        {"input_ids": context, "labels": [IGNORE_INDEX] * 39 + [label], "group": group}
        for label, group in [(5, "big"), (6, "big"), (5, "big"), (6, "big"), (7, "small"), (8, "small")]
    ]
    small_rates = iter([0.0, 1.0])
    monkeypatch.setattr(
        warm_start, "labelled_copy_rate",
        lambda policy, examples: 1.0 if examples[0]["group"] == "big" else next(small_rates),
    )  # fmt: skip
    drawn: list[list[str]] = []
    real = warm_start._copy_phase_data

    def spy(trajectories, phase, copy_examples, config):
        drawn.append([e["group"] for e in copy_examples])
        data = real(trajectories, phase, copy_examples, config)
        assert set(data.column_names) == {"input_ids", "labels"}  # the trainer sees tokens only
        return data

    monkeypatch.setattr(warm_start, "_copy_phase_data", spy)
    config = SFTWarmStartConfig(
        learning_rate=3e-3, max_steps=1, per_device_train_batch_size=2, warmup_ratio=0.0, lr_scheduler_type="constant",
        copy_pretrain_steps=2, copy_pretrain_batch_size=2, copy_pretrain_window=32, copy_pretrain_task_share=1.0,
        copy_gate_chunk=2, logging_steps=1, copy_pretrain_gate=0.75, copy_pretrain_gate_max_steps=10,
        copy_pretrain_gate_focus=1.0,
    )  # fmt: skip
    run_sft(build_policy(setup["tok"], MODEL), setup["tok"], setup["demos"][:4], config, (), task)
    phase, chunk = drawn
    assert phase.count("small") == 1  # the phase's own steps: every group at its size (one held out)
    assert chunk == ["small"] * len(phase)  # focus 1.0: the chunk practises the lagging group alone


def test_focused_on_draws_the_asked_share_from_the_lagging_groups():
    from searchrl.sft.warm_start import focused_on

    examples = [{"input_ids": [i], "group": "big" if i < 900 else "small"} for i in range(1000)]
    assert focused_on(examples, {"small"}, 0.0, seed=0) == examples
    assert focused_on(examples, {"absent"}, 0.5, seed=0) == examples
    half = focused_on(examples, {"small"}, 0.5, seed=0)
    share = sum(e["group"] == "small" for e in half) / len(half)
    assert len(half) == 1000 and 0.5 < share < 0.6  # half drawn from "small", and a tenth of the other half
    assert focused_on(examples, {"small"}, 0.5, seed=0) == half  # the seed decides
    with pytest.raises(ConfigError, match="copy_pretrain_gate_focus"):
        SFTWarmStartConfig(copy_pretrain_steps=2, copy_pretrain_gate=0.5, copy_pretrain_gate_focus=1.5)


def test_the_gate_holds_out_an_equal_share_of_every_group_and_trains_on_tokens_only():
    from searchrl.sft.warm_start import GATE_EXAMPLES, _held_out_for_gate

    examples = [{"input_ids": [i], "labels": [i], "group": "big"} for i in range(2000)]
    examples += [{"input_ids": [i], "labels": [i], "group": "small"} for i in range(2000, 2100)]
    examples += [{"input_ids": [2100], "labels": [2100], "group": "single"}]
    gated = SFTWarmStartConfig(copy_pretrain_steps=2, copy_pretrain_gate=0.5)
    train, held_out = _held_out_for_gate(examples, gated)
    held = {g: [e["input_ids"][0] for e in held_out if e["group"] == g] for g in ("big", "small", "single")}
    # The small group (5% of the list) gets as many held out as the big one; half of a group at most.
    assert 40 <= len(held["small"]) <= 50 and 70 <= len(held["big"]) <= GATE_EXAMPLES // 3 + 1
    assert held["single"] == []  # one example: trained on, not measured
    assert held["small"][0] == 2000 and held["small"][-1] > 2090  # spread over the group
    assert {e["group"] for e in train} == {"big", "small", "single"}  # kept for the gated chunks' focus
    assert len(train) + len(held_out) == len(examples)
    assert not {e["input_ids"][0] for e in train} & {e["input_ids"][0] for e in held_out}


def test_labelled_copy_rate_counts_examples_whose_every_labelled_token_is_the_greedy_choice(setup):
    from searchrl.sft.copy_check import labelled_copy_rate

    policy = build_policy(setup["tok"], MODEL).eval()
    ids = [int(i) for i in setup["demos"][0].input_ids[:30]]
    with torch.no_grad():
        greedy = policy(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
    # Labels at positions 10..14 equal to what the policy predicts there (the prediction for t sits at t - 1).
    right = {"input_ids": ids, "labels": [IGNORE_INDEX] * 10 + greedy[9:14] + [IGNORE_INDEX] * 15}
    one_off = dict(right, labels=list(right["labels"]))
    one_off["labels"][12] = (one_off["labels"][12] + 1) % len(setup["tok"])
    unlabelled = {"input_ids": ids, "labels": [IGNORE_INDEX] * 30}
    assert labelled_copy_rate(policy, [right]) == 1.0
    assert labelled_copy_rate(policy, [one_off]) == 0.0
    assert labelled_copy_rate(policy, [right, one_off, unlabelled, right]) == 0.5
    with pytest.raises(ValueError, match="at least one example"):
        labelled_copy_rate(policy, [])


def test_the_copy_phase_gate_measures_copy_examples_held_out_from_training_and_spread_over_the_list():
    from searchrl.sft.warm_start import _held_out_for_gate

    examples = [{"input_ids": [i], "labels": [i]} for i in range(1000)]
    gated = SFTWarmStartConfig(copy_pretrain_steps=2, copy_pretrain_gate=0.5)
    train, held_out = _held_out_for_gate(examples, gated)
    trained_ids = {e["input_ids"][0] for e in train}
    held_ids = [e["input_ids"][0] for e in held_out]
    assert 200 <= len(held_out) <= 300 and not trained_ids & set(held_ids)
    assert (
        len(train) + len(held_out) == 1000 and held_ids[0] < 10 and held_ids[-1] > 990
    )  # every kind in the list
    assert _held_out_for_gate(examples, SFTWarmStartConfig(copy_pretrain_steps=2)) == (examples, [])
    with pytest.raises(ValueError, match="at least 2 copy examples"):
        _held_out_for_gate(examples[:1], gated)
