"""Real rollouts: the tiny model, the real SearchEnvironment and a real BM25 index.

An untrained tiny model rarely writes a tool call, so most tests teacher-force a script through the
engine (`ScriptedPolicy`): the tokens are forced, but every logprob is still the model's, the pauses,
batched searches, cache appends and masks are the real ones. Free-sampling tests run the model alone.
"""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest
import torch
from pydantic import BaseModel, ConfigDict
from worlds import INJECTION_DOC, SMALL_GQA, VARNHOLT_CORPUS, VARNHOLT_QA, write_corpus_jsonl

from searchrl.common.trajectory import read_trajectories, write_trajectories
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.tools import SEARCH_TOOL, ToolRegistry, ToolSpec
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rollout.chat import ToolGlue, render_conversation
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy, sampling_log_probs
from searchrl.search.client import HTTPBackend
from searchrl.search.faults import FaultInjectingBackend
from searchrl.search.index import build_index

# Not conftest's `rollout_world`: the injection document is in this index and in the tokenizer's texts.
CORPUS = [*VARNHOLT_CORPUS, INJECTION_DOC]
QA = VARNHOLT_QA
MODEL = SMALL_GQA


def call(query: str, k: int | None = None, name: str = "search") -> str:
    args: dict = {"query": query} if k is None else {"query": query, "k": k}
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def answer(text: str, *cites: str) -> str:
    return "<answer>" + " ".join([text, *[f"[{c}]" for c in cites]]) + "</answer>"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    corpus_path = root / "corpus.jsonl"
    write_corpus_jsonl(corpus_path, CORPUS)
    backend = build_index(corpus_path, root / "index", backend="bm25")
    backend.search(
        ["Varnholt Quessa"], 1
    )  # the first real match JIT-compiles (seconds): not under a deadline
    tok = train_tokenizer(tokenizer_training_texts(CORPUS * 4, QA * 4), vocab_size=512)
    model = build_policy(tok, MODEL)
    return {"backend": backend, "tok": tok, "model": model}


def make_env(world, backend=None, **cfg) -> SearchEnvironment:
    registry = cfg.pop("registry", None)
    cfg.setdefault("system_prompt", "Answer with search.")  # a short prompt keeps the tests fast
    return SearchEnvironment(
        backend or world["backend"], EnvConfig(**cfg), tokenizer=world["tok"], registry=registry
    )


def run(world, scripts, envs=None, protocol="chat", forcing=True, **gen):
    gen.setdefault("max_new_tokens_per_turn", 96)
    gen.setdefault("max_episode_tokens", 1500)
    envs = envs or [make_env(world, protocol=protocol) for _ in scripts]
    rows = [QA[i % len(QA)] for i in range(len(envs))]
    policy = ScriptedPolicy(world["tok"], scripts, append_eos=(protocol == "chat")) if forcing else None
    generator = HFGenerator(world["model"], world["tok"], GenerationConfig(**gen), forcing=policy)
    return generator.rollout(envs, rows), envs


def recomputed(world, traj, temperature, top_k=0, top_p=1.0):
    ids = torch.tensor([traj.input_ids])
    with torch.no_grad():
        logits = world["model"](ids).logits[0, :-1]
    logp = sampling_log_probs(logits, temperature, top_k, top_p)
    return logp.gather(1, ids[0, 1:, None]).squeeze(1)


def action_positions(traj) -> torch.Tensor:
    return torch.tensor(traj.action_mask[1:], dtype=torch.bool)


def check_masks_and_spans(traj) -> None:
    traj.validate()
    assert traj.spans[0].kind == "prompt" and traj.spans[0].start == 0
    for before, after in zip(traj.spans, traj.spans[1:], strict=False):
        assert before.end == after.start  # spans tile the sequence
    assert traj.spans[-1].end == len(traj.input_ids)
    for span in traj.spans:
        expected = 1 if span.kind == "action" else 0
        assert all(m == expected for m in traj.action_mask[span.start : span.end]), span.kind
        if span.kind != "action":
            assert all(lp == 0.0 for lp in traj.logprobs[span.start : span.end])


SCRIPTS = [
    [answer("Quessa", "d1")],
    [call("Varnholt province"), answer("Quessa", "d1")],
    [call("capital of Quessa"), call("Orlenn founded", k=2), answer("Amsel Drov", "d3")],
    [call("Orlenn"), call("Amsel Drov"), call("Tiberk", k=1), answer("Tiberk", "d4")],
]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scripted_rollout_masks_decoding_and_logprobs(world, temperature):
    batch, envs = run(world, SCRIPTS, temperature=temperature)
    tok = world["tok"]
    for traj, script, env in zip(batch.trajectories, SCRIPTS, envs, strict=True):
        check_masks_and_spans(traj)
        assert traj.termination == "answered" and traj.num_turns == len(script)
        assert [r.status for r in traj.tool_calls] == ["ok"] * (len(script) - 1)
        # Every sampled token is the script's (plus one EOS per turn), and only those have mask 1.
        expected = [
            i for text in script for i in [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        ]
        assert [t for t, m in zip(traj.input_ids, traj.action_mask, strict=True) if m] == expected
        # No drift: the ids decode to exactly what the template renders for the recorded conversation
        # (the template adds its "\n" after the final <|im_end|>, which the policy never samples).
        decoded = tok.decode(traj.input_ids, skip_special_tokens=False)
        assert render_conversation(tok, traj.messages, env.tools) == decoded + "\n"
        # Observation tokens are exactly the template's glue for the tool messages.
        glue = ToolGlue(tok, env.tools)
        tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
        obs_spans = [s for s in traj.spans if s.kind == "observation"]
        assert len(obs_spans) == len(tool_msgs) == len(script) - 1
        for span, msg in zip(obs_spans, tool_msgs, strict=True):
            assert traj.input_ids[span.start : span.end] == glue.suffix_ids([msg])
        # Logprobs recomputed by one forward pass over the ids match the recorded ones.
        mask = action_positions(traj)
        got = torch.tensor(traj.logprobs[1:])[mask]
        again = recomputed(world, traj, temperature)[mask]
        assert (again - got).abs().max().item() <= 1e-4
        if temperature != 1.0:
            unscaled = recomputed(world, traj, 1.0)[mask]
            assert (unscaled - got).abs().max().item() > 1e-3  # invariant 11: the scaling matters
    assert batch.stats["tools/calls_per_episode"] == pytest.approx(6 / 4)
    assert batch.stats["termination/answered"] == 1.0


def test_free_sampling_with_filters_recomputes_and_is_seeded(world):
    gen = dict(temperature=0.8, top_k=40, top_p=0.9, max_new_tokens_per_turn=24, seed=7)
    scripts = [[] for _ in range(3)]
    first, _ = run(world, scripts, forcing=False, **gen)
    second, _ = run(world, scripts, forcing=False, **gen)
    other, _ = run(world, scripts, forcing=False, **{**gen, "seed": 8})
    for a, b in zip(first.trajectories, second.trajectories, strict=True):
        assert a.input_ids == b.input_ids and a.logprobs == b.logprobs
    assert [t.input_ids for t in first.trajectories] != [t.input_ids for t in other.trajectories]
    for traj in first.trajectories:
        check_masks_and_spans(traj)
        assert traj.termination in ("no_answer", "token_budget", "answered")
        mask = action_positions(traj)
        again = recomputed(world, traj, 0.8, top_k=40, top_p=0.9)[mask]
        assert (again - torch.tensor(traj.logprobs[1:])[mask]).abs().max().item() <= 1e-4


def test_a_call_samples_as_its_sampling_says_and_leaves_the_engine_config_alone(world):
    """`rollout(envs, rows, sampling)`: a trainer's step seed or an evaluation's temperature goes with the
    call, exactly as an engine built with those settings would sample, and the shared config is untouched."""
    base = GenerationConfig(temperature=0.8, top_k=40, top_p=0.9, max_new_tokens_per_turn=24, seed=7)
    generator = HFGenerator(world["model"], world["tok"], dataclasses.replace(base))
    rows = [QA[i % len(QA)] for i in range(3)]

    def envs():
        return [make_env(world) for _ in rows]

    passed = generator.rollout(envs(), rows, base.sampling(seed=8, temperature=1.0)).trajectories
    built_config = dataclasses.replace(base, seed=8, temperature=1.0)
    built = HFGenerator(world["model"], world["tok"], built_config).rollout(envs(), rows).trajectories
    assert [t.input_ids for t in passed] == [t.input_ids for t in built]
    assert [t.logprobs for t in passed] == [t.logprobs for t in built]
    assert (passed[0].metadata["seed"], passed[0].metadata["temperature"]) == (8, 1.0)
    assert generator.config == base
    default = generator.rollout(envs(), rows).trajectories  # no sampling: the config's own
    assert (default[0].metadata["seed"], default[0].metadata["temperature"]) == (7, 0.8)
    with pytest.raises(ValueError, match="top_p"):
        base.sampling(top_p=0.0)


def test_search_r1_protocol_inline_observations(world):
    scripts = [
        ["<search>Varnholt province</search>", answer("Quessa", "d1")],
        ["<search>capital of Quessa</search>", "<search>Orlenn founded</search>", answer("Amsel Drov", "d3")],
    ]
    batch, envs = run(world, scripts, protocol="search_r1", temperature=1.0)
    tok = world["tok"]
    for traj, env, script in zip(batch.trajectories, envs, scripts, strict=True):
        check_masks_and_spans(traj)
        assert traj.termination == "answered" and traj.num_turns == len(script)
        assert traj.answer == env.answer and traj.citations == env.citations
        assert all(o.startswith("\n\n<information>") for o in traj.observations)
        # One assistant message holding actions and observations; the template closes the open turn.
        assert [m["role"] for m in traj.messages] == ["system", "user", "assistant"]
        decoded = tok.decode(traj.input_ids, skip_special_tokens=False)
        assert render_conversation(tok, traj.messages, env.tools) == decoded + "<|im_end|>\n"
        mask = action_positions(traj)
        again = recomputed(world, traj, 1.0)[mask]
        assert (again - torch.tensor(traj.logprobs[1:])[mask]).abs().max().item() <= 1e-4


class _PageArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block exits: nothing listens there


def test_every_failure_kind_is_an_observation_and_other_rows_go_on(world):
    registry = ToolRegistry(
        [SEARCH_TOOL, ToolSpec("open_page", "Open a web page.", _PageArgs, lambda _l: {})]
    )
    slow = FaultInjectingBackend(world["backend"], latency_ms=1500)
    down = HTTPBackend(f"http://127.0.0.1:{_closed_port()}", max_retries=0, connect_timeout=0.5)
    ok_answer = answer("Quessa", "d1")
    cases = [  # (name, script, env kwargs, backend, expected statuses, expected termination)
        (
            "malformed",
            ['<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>', ok_answer],
            {},
            None,
            ["malformed"],
            "answered",
        ),
        ("unknown", [call("Varnholt", name="browse"), ok_answer], {}, None, ["unknown_tool"], "answered"),
        (
            "denied",
            [call("x", name="open_page").replace('"query"', '"url"'), ok_answer],
            {"registry": registry},
            None,
            ["permission_denied"],
            "answered",
        ),
        ("empty", [call("   "), ok_answer], {}, None, ["invalid_arguments"], "answered"),
        (
            "wrong_type",
            [
                '<tool_call>\n{"name": "search", "arguments": {"query": "Varnholt", "k": "three"}}\n</tool_call>',
                ok_answer,
            ],
            {},
            None,
            ["invalid_arguments"],
            "answered",
        ),
        (
            "over_budget",
            [call("Varnholt"), call("Quessa"), call("Orlenn")],
            {"max_tool_calls": 1},
            None,
            ["ok", "over_budget", "over_budget"],
            "max_tool_calls",
        ),
        ("timeout", [call("Varnholt"), ok_answer], {"search_timeout_s": 0.3}, slow, ["timeout"], "answered"),
        ("server_down", [call("Varnholt"), ok_answer], {"max_retries": 0}, down, ["unavailable"], "answered"),
        ("healthy", [call("Varnholt"), ok_answer], {}, None, ["ok"], "answered"),
        (
            "max_turns",
            [call("Varnholt"), call("Quessa")],
            {"max_turns": 2},
            None,
            ["ok", "over_budget"],
            "max_turns",
        ),
        ("no_answer", ["I do not know."], {}, None, [], "no_answer"),
    ]
    envs = [make_env(world, backend=backend, **kw) for _, _, kw, backend, _, _ in cases]
    scripts = [script for _, script, _, _, _, _ in cases]
    batch, envs = run(world, scripts, envs=envs)
    by_name = dict(zip([c[0] for c in cases], batch.trajectories, strict=True))
    for (name, _, _, _, statuses, termination), traj in zip(cases, batch.trajectories, strict=True):
        check_masks_and_spans(traj)
        assert [r.status for r in traj.tool_calls] == statuses, name
        assert traj.termination == termination, name
        assert all(r.error for r in traj.tool_calls if r.status != "ok"), name  # the record says why
        # Every failed call that the episode survived came back as an observation that says what was
        # wrong and how to do it right; calls in the turn that ended the episode are never shown.
        failed_obs = [o for o in traj.observations if o.startswith("Error (")]
        shown = {"over_budget": 1, "max_turns": 0, "no_answer": 0, "healthy": 0}.get(name, 1)
        assert len(failed_obs) == shown, name
        for obs in failed_obs:
            assert '"name": "search"' in obs or "<search>" in obs or "<answer>" in obs or "answer" in obs, (
                name
            )
    assert by_name["healthy"].retrieved and by_name["healthy"].answer == "Quessa"
    assert "timed out" in by_name["timeout"].observations[0]
    assert "unavailable" in by_name["server_down"].observations[0]
    assert by_name["over_budget"].observations[1].startswith("Error (over_budget)")
    assert batch.stats["tools/failures/timeout"] == 1 and batch.stats["tools/failures/unavailable"] == 1
    assert batch.stats["termination/answered"] == pytest.approx(8 / 11)


def test_token_budget_ends_the_episode(world):
    long_turn = call("Varnholt " * 30)
    batch, _ = run(world, [[long_turn, answer("Quessa")], [answer("Quessa")]], max_new_tokens_per_turn=20)
    cut, fine = batch.trajectories
    check_masks_and_spans(cut)
    assert cut.termination == "token_budget" and cut.num_action_tokens == 20
    assert fine.termination == "answered"
    batch, _ = run(world, [[call("Varnholt"), answer("Quessa")]], max_episode_tokens=40)
    assert batch.trajectories[0].termination == "token_budget"
    assert batch.trajectories[0].observations == []  # an observation that does not fit is not inserted


def test_injected_markup_cannot_forge_a_turn_a_call_or_an_answer(world):
    tok = world["tok"]
    batch, envs = run(world, [[call("Marrowgate fact"), answer("Quessa", "d1")]])
    traj, env = batch.trajectories[0], envs[0]
    assert "evil1" in [d for r in traj.tool_calls for d in r.doc_ids]
    assert env.injection_attempts > 0
    assert traj.answer == "Quessa" and len(traj.tool_calls) == 1 and traj.termination == "answered"
    span = next(s for s in traj.spans if s.kind == "observation")
    obs_ids = traj.input_ids[span.start : span.end]
    vocab = tok.get_vocab()
    for forbidden in ("<answer>", "</answer>", "<tool_call>", "</tool_call>", "<|endoftext|>"):
        assert vocab[forbidden] not in obs_ids, forbidden
    # Only the template's own glue opens turns: "<|im_start|>user" and "<|im_start|>assistant".
    assert obs_ids.count(vocab["<|im_start|>"]) == 2 and obs_ids.count(vocab["<|im_end|>"]) == 1
    assert "HACKED" in traj.observations[0]  # the text is still readable, only defanged


def test_prefill_ratio_counted_by_a_hook_and_padding_compaction(world):
    seen = {"positions": 0}

    def count(_module, args, _kwargs=None):
        seen["positions"] += args[0].numel()

    handle = world["model"].model.embed_tokens.register_forward_pre_hook(count)
    try:
        batch, _ = run(world, SCRIPTS * 2, compact_pad_fraction=0.0)
    finally:
        handle.remove()
    total = sum(len(t.input_ids) for t in batch.trajectories)
    assert seen["positions"] == batch.stats["rollout/model_tokens"]
    assert seen["positions"] / total <= 1.1
    # Each real token is run through the model once, except every row's last one (nothing follows it)
    # and the prompts of rows that repeat an earlier row's prompt (GRPO groups share one prefill).
    seen_prompts: set[tuple[int, ...]] = set()
    shared = 0
    for traj in batch.trajectories:
        prompt = tuple(traj.input_ids[: traj.prompt_length])
        shared += traj.prompt_length if prompt in seen_prompts else 0
        seen_prompts.add(prompt)
    assert shared > 0  # SCRIPTS * 2 asks each question twice
    assert batch.stats["rollout/model_real_tokens"] == total - len(batch.trajectories) - shared
    never, _ = run(world, SCRIPTS * 2, compact_pad_fraction=1.0)
    unshared, _ = run(world, SCRIPTS * 2, share_prompt_prefill=False)
    assert unshared.stats["rollout/model_real_tokens"] == total - len(batch.trajectories)
    assert unshared.stats["rollout/prefill_ratio"] <= 1.1
    for a, b, c in zip(batch.trajectories, never.trajectories, unshared.trajectories, strict=True):
        assert a.input_ids == b.input_ids == c.input_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5
        assert max(abs(x - y) for x, y in zip(a.logprobs, c.logprobs, strict=True)) <= 1e-5


def test_trajectories_round_trip_jsonl_gz(world, tmp_path):
    batch, _ = run(world, SCRIPTS[:2])
    path = tmp_path / "traj.jsonl.gz"
    write_trajectories(path, batch.trajectories)
    back = read_trajectories(path)
    assert [t.to_dict() for t in back] == [t.to_dict() for t in batch.trajectories]


def test_rollout_refuses_mismatched_inputs(world):
    generator = HFGenerator(world["model"], world["tok"])
    with pytest.raises(ValueError, match="one environment per row"):
        generator.rollout([make_env(world)], [QA[0], QA[1]])
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(top_p=0.0).validate()


def test_an_environment_that_raises_ends_only_its_rows_with_error(world):
    from searchrl.env.environment import step_batch

    envs = [make_env(world) for _ in range(3)]
    broken = envs[1]

    def flaky_step_batch(batch_envs, texts):
        if any(e is broken for e in batch_envs):
            raise RuntimeError("environment bug")
        return step_batch(batch_envs, texts)

    scripts = [
        [call("Varnholt"), answer("Quessa", "d1")],
        [call("Quessa capital long query words"), answer("x")],
        [answer("Quessa")],
    ]
    generator = HFGenerator(
        world["model"],
        world["tok"],
        GenerationConfig(max_new_tokens_per_turn=96, max_episode_tokens=1500),
        forcing=ScriptedPolicy(world["tok"], scripts),
        step_batch=flaky_step_batch,
    )
    batch = generator.rollout(envs, QA[:3])
    good, bad, short = batch.trajectories
    assert bad.termination == "error" and "environment bug" in bad.metadata["error"]
    assert good.termination == "answered" and short.termination == "answered"
    check_masks_and_spans(bad)
    assert batch.stats["termination/error"] == pytest.approx(1 / 3)


def test_a_model_loaded_from_a_local_directory_rolls_out_identically(world, tmp_path):
    from searchrl.models.io import load_policy, load_tokenizer

    world["model"].save_pretrained(tmp_path)
    world["tok"].save_pretrained(tmp_path)
    loaded = {"backend": world["backend"], "tok": load_tokenizer(tmp_path), "model": load_policy(tmp_path)}
    fresh, _ = run(world, SCRIPTS[1:3])
    again, envs = run(loaded, SCRIPTS[1:3])
    for a, b, env in zip(fresh.trajectories, again.trajectories, envs, strict=True):
        assert a.input_ids == b.input_ids and a.action_mask == b.action_mask
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5
        decoded = loaded["tok"].decode(b.input_ids, skip_special_tokens=False)
        assert render_conversation(loaded["tok"], b.messages, env.tools) == decoded + "\n"


def test_every_public_name_of_the_rollout_package_resolves():
    import searchrl.rollout as rollout

    for name in rollout.__all__:
        assert getattr(rollout, name) is not None, name
    from searchrl.common.trajectory import Trajectory
    from searchrl.rollout.loop import TurnLoop

    assert rollout.Trajectory is Trajectory and issubclass(rollout.HFGenerator, TurnLoop)
    assert issubclass(rollout.VLLMGenerator, TurnLoop)
