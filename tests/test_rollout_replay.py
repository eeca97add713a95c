"""Model-free replay: forced episodes through the same loop, without running a model.

The expert's demonstrations are fully forced, so running the policy over them only costs time. With
`HFGenerator(model=None, forcing=...)` the loop is the same; these tests check that every id, mask,
span, message and tool call equals the model-driven forced rollout, and that a gap in the script is
an error rather than silent uniform sampling.
"""

from __future__ import annotations

import pytest
import torch
from worlds import TINY_ONE_LAYER

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy
from searchrl.sft.expert import ExpertConfig, ExpertPolicy


@pytest.fixture(scope="module")
def world(synthetic_index):
    torch.set_num_threads(1)
    synthetic = synthetic_index(5)
    task, backend = synthetic.task, synthetic.backend
    rows = task.splits["train"][:12]
    tok = train_tokenizer(tokenizer_training_texts(task.corpus, rows), vocab_size=800)
    model = build_policy(
        tok,
        TINY_ONE_LAYER,
    )
    return backend, tok, model, rows


@pytest.mark.parametrize("tool_schema_in_prompt", [True, False])
def test_replay_equals_the_model_driven_forced_rollout(world, tool_schema_in_prompt: bool) -> None:
    backend, tok, model, rows = world
    cfg = EnvConfig(tool_schema_in_prompt=tool_schema_in_prompt)
    expert = ExpertPolicy(ExpertConfig(noise=0.5, seed=1))
    with_model = expert.demonstrate(
        model, tok, [SearchEnvironment(backend, cfg, tokenizer=tok) for _ in rows], rows
    )
    replayed = expert.demonstrate(
        None, tok, [SearchEnvironment(backend, cfg, tokenizer=tok) for _ in rows], rows
    )
    assert len(with_model) == len(replayed) == len(rows)
    for a, b in zip(with_model, replayed, strict=True):
        assert a.input_ids == b.input_ids
        assert a.action_mask == b.action_mask
        assert [(s.kind, s.start, s.end, s.text) for s in a.spans] == [
            (s.kind, s.start, s.end, s.text) for s in b.spans
        ]
        assert a.messages == b.messages
        assert [(c.name, c.arguments, c.status, c.doc_ids) for c in a.tool_calls] == [
            (c.name, c.arguments, c.status, c.doc_ids) for c in b.tool_calls
        ]
        assert (a.answer, a.citations, a.termination) == (b.answer, b.citations, b.termination)
    assert any(len(t.tool_calls) == 2 for t in replayed)  # two-hop demonstrations went through


def test_replay_refuses_an_unforced_token(world) -> None:
    backend, tok, _, rows = world
    script = ScriptedPolicy(tok, [["<answer>x</answer>"]])  # one row's script; the rest unforced
    gen = HFGenerator(None, tok, GenerationConfig(), forcing=script)
    envs = [SearchEnvironment(backend, EnvConfig(), tokenizer=tok) for _ in rows[:2]]
    with pytest.raises(ValueError, match="needs every token forced"):
        gen.rollout(envs, rows[:2])
    with pytest.raises(ValueError, match="pass a forcing hook"):
        HFGenerator(None, tok, GenerationConfig()).rollout(envs[:1], rows[:1])
