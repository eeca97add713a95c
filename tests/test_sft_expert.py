"""The expert policy: real environment, real BM25 index, real rollout engine with forced turns.

Checks the token contract (ids decode to the chat template's rendering; SFT labels sit exactly on the
action mask), the expert's path (one search per hop, the bridge read from the retrieved text, a cited
correct answer) and that the noise knob produces each listed failure kind.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import TINY_ONE_LAYER

from searchrl.common.config import ConfigError
from searchrl.data.synthetic_text import FACT_TEMPLATES, RELATION_WORDS, relation_chain
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rewards.citation import citation_status
from searchrl.rewards.qa import exact_match, normalize_answer
from searchrl.rollout.chat import ToolGlue, render_conversation
from searchrl.sft.examples import IGNORE_INDEX, sft_example
from searchrl.sft.expert import NOISE_KINDS, ExpertConfig, ExpertPolicy, read_fact_object
from searchrl.sft.pipeline import prompt_texts

MODEL = TINY_ONE_LAYER


class _EmptyBackend:
    """A backend that finds nothing: retrieval fails, so the expert must fall back to the oracle."""

    def search(self, queries, k):
        return [[] for _ in queries]


@pytest.fixture(scope="module")
def world(synthetic_index):
    torch.set_num_threads(1)
    synthetic = synthetic_index(3)
    task, backend = synthetic.task, synthetic.backend
    probe = SearchEnvironment(backend, EnvConfig())
    rows = task.splits["train"]
    tok = train_tokenizer(
        tokenizer_training_texts(task.corpus, rows) + prompt_texts(probe, rows), vocab_size=1024
    )
    model = build_policy(tok, MODEL)
    return {"task": task, "backend": backend, "tok": tok, "model": model, "rows": rows}


def demonstrate(world, rows, backend=None, **cfg):
    envs = [SearchEnvironment(backend or world["backend"], EnvConfig(), tokenizer=world["tok"]) for _ in rows]
    trajs = ExpertPolicy(ExpertConfig(**cfg)).demonstrate(world["model"], world["tok"], envs, rows)
    return trajs, envs


@pytest.fixture(scope="module")
def clean(world):
    rows = world["rows"][:24]
    trajs, envs = demonstrate(world, rows, noise=0.0)
    return rows, trajs, envs


def test_ids_decode_to_the_template_rendering_and_labels_equal_the_action_mask(world, clean):
    tok = world["tok"]
    rows, trajs, envs = clean
    for traj, env in zip(trajs, envs, strict=True):
        decoded = tok.decode(traj.input_ids, skip_special_tokens=False)
        # The template closes the last assistant turn with "\n" after <|im_end|>; the policy stops at EOS.
        assert render_conversation(tok, traj.messages, env.tools) == decoded + "\n"
        example = sft_example(traj)
        assert example["input_ids"] == traj.input_ids
        trained = [label != IGNORE_INDEX for label in example["labels"]]
        assert trained == [bool(m) for m in traj.action_mask]
        # Every trained token is the id itself; the EOS closing each action turn is trained.
        assert all(
            lab == tid for lab, tid in zip(example["labels"], traj.input_ids, strict=True) if lab != -100
        )
        eos = tok.eos_token_id
        for span in (s for s in traj.spans if s.kind == "action"):
            assert traj.input_ids[span.end - 1] == eos and example["labels"][span.end - 1] == eos
        # Observation tokens are exactly the template glue and carry no label.
        glue = ToolGlue(tok, env.tools)
        tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
        obs = [s for s in traj.spans if s.kind == "observation"]
        assert len(obs) == len(tool_msgs)
        for span, msg in zip(obs, tool_msgs, strict=True):
            assert traj.input_ids[span.start : span.end] == glue.suffix_ids([msg])
            assert set(example["labels"][span.start : span.end]) == {IGNORE_INDEX}
        assert set(example["labels"][: traj.prompt_length]) == {IGNORE_INDEX}


def test_expert_searches_once_per_hop_reads_the_bridge_and_cites_the_answer(clean):
    rows, trajs, _ = clean
    hops = {1: 0, 2: 0}
    for row, traj in zip(rows, trajs, strict=True):
        chain = relation_chain(row["relation"])
        hops[len(chain)] += 1
        assert traj.metadata["expert_kind"] == "expert"
        assert traj.termination == "answered"
        assert len(traj.tool_calls) == len(chain), "one search per hop"
        queries = [c.arguments["query"] for c in traj.tool_calls]
        assert queries[0] == f"{row['subject']} {RELATION_WORDS[chain[0]]}"
        if len(chain) == 2:
            assert queries[1] == f"{row['bridge']} {RELATION_WORDS[chain[1]]}"
            assert traj.metadata["bridge_source"] == "retrieved"
        assert exact_match(traj.answer, row["golds"]) == 1.0
        assert citation_status(traj) == "supported"
        assert traj.citations == [row["supporting_doc_ids"][-1]]
    assert hops[1] > 0 and hops[2] > 0, "the sample must hold both single- and two-hop questions"


def test_expert_speaks_the_search_r1_protocol_too(world):
    rows = [r for r in world["rows"] if r["hops"] == 2][:2] + [r for r in world["rows"] if r["hops"] == 1][:2]
    envs = [
        SearchEnvironment(world["backend"], EnvConfig(protocol="search_r1"), tokenizer=world["tok"])
        for _ in rows
    ]
    trajs = ExpertPolicy().demonstrate(world["model"], world["tok"], envs, rows)
    for row, traj in zip(rows, trajs, strict=True):
        assert traj.termination == "answered" and len(traj.tool_calls) == row["hops"]
        assert exact_match(traj.answer, row["golds"]) == 1.0 and citation_status(traj) == "supported"
        assert traj.action_texts[0].startswith("<search>") and traj.action_texts[0].endswith("</search>")


def test_bridge_falls_back_to_the_oracle_when_retrieval_fails(world):
    two_hop = [r for r in world["rows"] if r["hops"] == 2][:3]
    trajs, _ = demonstrate(world, two_hop, backend=_EmptyBackend(), noise=0.0)
    for row, traj in zip(two_hop, trajs, strict=True):
        assert traj.metadata["bridge_source"] == "oracle"
        assert traj.tool_calls[1].arguments["query"].startswith(row["bridge"])
        assert traj.citations == []  # nothing was retrieved, so nothing may be cited
        assert citation_status(traj) == "none"


def test_noise_knob_produces_each_listed_failure_kind(world):
    rows = world["rows"][:40]
    trajs, _ = demonstrate(world, rows, noise=1.0, seed=1)
    by_kind: dict[str, list] = {}
    for row, traj in zip(rows, trajs, strict=True):
        by_kind.setdefault(traj.metadata["expert_kind"], []).append((row, traj))
    assert set(by_kind) == set(NOISE_KINDS), "noise=1 makes every demonstration imperfect, of every kind"
    for row, traj in by_kind["no_search"]:
        assert traj.tool_calls == [] and traj.termination == "answered"
        assert exact_match(traj.answer, row["golds"]) == 0.0
    for row, traj in by_kind["one_hop"]:
        assert row["hops"] == 2 and len(traj.tool_calls) == 1
        assert normalize_answer(traj.answer) == normalize_answer(row["bridge"])
        assert exact_match(traj.answer, row["golds"]) == 0.0
    for row, traj in by_kind["no_citation"]:
        assert traj.citations == [] and exact_match(traj.answer, row["golds"]) == 1.0
        assert citation_status(traj) == "none"
    for row, traj in by_kind["wrong_entity"]:
        assert row["subject"] not in traj.tool_calls[0].arguments["query"]


def test_noise_share_and_determinism(world):
    rows = world["rows"]
    expert = ExpertPolicy(ExpertConfig(noise=0.5, seed=7))
    plan = [e.kind for e in expert.plan(rows)]
    imperfect = sum(k != "expert" for k in plan) / len(plan)
    assert 0.3 < imperfect < 0.7
    assert plan == [e.kind for e in ExpertPolicy(ExpertConfig(noise=0.5, seed=7)).plan(rows)]
    assert all(k == "expert" for k in (e.kind for e in ExpertPolicy(ExpertConfig(noise=0.0)).plan(rows)))
    only = ExpertPolicy(ExpertConfig(noise=1.0, noise_kinds=["no_citation"])).plan(rows)
    assert {e.kind for e in only} == {"no_citation"}
    # a row's kind does not depend on the batch it is demonstrated in (the demo goes 64 rows at a time)
    half = len(rows) // 2
    chunked = [e.kind for part in (rows[:half], rows[half:]) for e in expert.plan(part)]
    assert chunked == plan
    second_half = [e.kind for e in expert.plan(rows[half:])]
    assert second_half != [e.kind for e in expert.plan(rows[:half])][: len(second_half)]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"noise": 1.5}, "noise"),
        ({"noise": -0.1}, "noise"),
        ({"noise_kinds": ["hallucinate"]}, "hallucinate"),
        ({"noise": 0.3, "noise_kinds": []}, "noise_kinds"),
        ({"k": 0}, "k"),
    ],
)
def test_bad_expert_config_is_refused_with_the_field_named(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        ExpertConfig(**kwargs)


def test_expert_refuses_an_environment_too_small_for_the_hops(world):
    two_hop = [r for r in world["rows"] if r["hops"] == 2][:1]
    envs = [SearchEnvironment(world["backend"], EnvConfig(max_turns=2), tokenizer=world["tok"])]
    with pytest.raises(ValueError, match="max_turns >= 3"):
        ExpertPolicy().demonstrate(world["model"], world["tok"], envs, two_hop)


def test_expert_refuses_rows_without_the_synthetic_fields(world):
    with pytest.raises(ValueError, match="synthetic"):
        ExpertPolicy().plan([{"id": "q", "question": "Who?", "golds": ["x"]}])


_NAME = st.lists(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=8).map(str.capitalize),
    min_size=1,
    max_size=3,
).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(relation=st.sampled_from(sorted(FACT_TEMPLATES)), subject=_NAME, obj=_NAME, pick=st.integers(0, 1))
def test_read_fact_object_inverts_every_corpus_template(relation, subject, obj, pick):
    template = FACT_TEMPLATES[relation][pick % len(FACT_TEMPLATES[relation])]
    sentence = template.format(s=subject, o=obj)
    assert read_fact_object(f"{subject}\n{sentence} It is also called X.", relation, subject) == obj
    # A look-alike whose name merely ends with the subject's is another entity: its sentence is not read.
    lookalike = template.format(s="Bo" + subject.lower(), o=obj)
    assert read_fact_object(lookalike, relation, subject) is None
