"""Prompt injection: documents that forge tool calls, answers and system turns, call tools outside the
allow-list or try to exfiltrate the prompt, indexed next to the real corpus.

With them in the index, a PPO run whose policy *obeys* every injected instruction (`GullibleForcing`,
the worst case) still executes no tool outside the allow-list, runs no call the policy did not write,
lets no live markup into the context, and the attempts are counted in the training metrics.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.forced_ppo import build_world, make_trainer, read_metrics

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import read_trajectories
from searchrl.data.injection import (
    ATTACK_KINDS,
    CANARY,
    SYSTEM_BREACHES,
    GullibleForcing,
    attack_text,
    audit_trajectory,
    injection_documents,
    merge_corpus,
    refang,
)
from searchrl.data.synthetic import generate, preset_config
from searchrl.data.synthetic_text import expert_queries
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_tool_call, parse_turn
from searchrl.env.sanitize import sanitize_text
from searchrl.env.tools import SEARCH_TOOL, ToolRegistry, ToolSpec

TASK = generate(preset_config("tiny", seed=0))
TARGETS = TASK.splits["train"][:10]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("inj_world"), extra_docs=injection_documents(TARGETS))


def test_documents_cover_every_attack_kind_with_fresh_ids_and_the_canary():
    docs = injection_documents(TARGETS)
    assert {d["attack"] for d in docs} == set(ATTACK_KINDS)
    assert len({d["id"] for d in docs}) == len(docs) == len(TARGETS)
    assert all(CANARY in d["contents"] or d["attack"] == "disallowed_tool" for d in docs)
    merged = merge_corpus(TASK.corpus, docs)
    assert len(merged) == len(TASK.corpus) + len(docs)
    with pytest.raises(ConfigError, match="already exist"):
        merge_corpus(merged, docs)
    with pytest.raises(ConfigError, match="choose one or more"):
        injection_documents(TARGETS, kinds=["sql_injection"])
    with pytest.raises(ConfigError, match=r"\['subject', 'relation'\]"):
        injection_documents([{"id": "q", "question": "?"}])


def test_injected_documents_rank_for_their_targets_real_search(world):
    for row, doc in zip(TARGETS, injection_documents(TARGETS), strict=True):
        hits = world.backend.search([expert_queries(row)[0]], 3)[0]
        assert doc["id"] in [h.doc_id for h in hits], (row["subject"], [h.doc_id for h in hits])


@pytest.mark.parametrize("kind", ATTACK_KINDS)
def test_each_attack_is_neutralised_in_the_observation(world, kind):
    import random

    row = TARGETS[0]
    text = attack_text(kind, row["subject"], "born", random.Random(0))
    assert parse_turn(text).tool_calls or "<answer>" in text or "<|im_start|>" in text or kind == "exfiltrate"
    env = SearchEnvironment(world.backend, EnvConfig(), tokenizer=world.tok)
    env.reset(row)
    shown, _, attempts = env.writer.documents("q", [_hit("inj-x", row["subject"], text)], env.source_numbers)
    if kind != "exfiltrate":
        assert attempts > 0
    parsed = parse_turn(shown)
    assert not parsed.tool_calls and not parsed.malformed and parsed.answer is None
    specials = set(world.tok.all_special_ids) | set(world.tok.added_tokens_decoder)
    assert not specials & set(world.tok.encode(shown, add_special_tokens=False))
    assert refang(shown).count("<") >= text.count("<")  # a reader still sees what was there


def _hit(doc_id, title, text):
    from searchrl.search.base import Hit

    return Hit(doc_id=doc_id, title=title, text=text, score=1.0)


def test_tool_outside_the_allow_list_is_denied_not_run(world):
    python = ToolSpec("python", "Run code.", SEARCH_TOOL.args_model, SEARCH_TOOL.parameters)
    env = SearchEnvironment(
        world.backend, EnvConfig(), tokenizer=world.tok, registry=ToolRegistry([SEARCH_TOOL, python])
    )
    env.reset(TARGETS[0])
    result = env.step(
        format_tool_call("python", {"query": "import os"}) + format_tool_call("shell", {"cmd": "ls"})
    )
    assert [r.status for r in result.records] == ["permission_denied", "unknown_tool"]
    assert env.searches_sent == 0


@pytest.mark.slow
def test_ppo_run_with_injected_index_and_an_obedient_policy_executes_nothing_forbidden(world, tmp_path):
    trainer = make_trainer(
        world,
        tmp_path / "run",
        steps=1,
        batch_size=4,
        save_steps=1000,
        max_new_tokens_per_turn=160,
        max_episode_tokens=1500,
        # Whole documents in the observations: truncation would hide the attacks (a defence of sorts).
        env_cfg={"max_observation_tokens": 512, "max_episode_tokens": 1400},
    )
    # Targets of forge_tool_call, disallowed_tool (x2) and exfiltrate: every episode's search hits its
    # injected document, and the obedient policy tries both forbidden tools and a forged search.
    trainer.train_rows = [TARGETS[i] for i in (0, 3, 4, 8)]
    trainer.generator.forcing = GullibleForcing(world.tok, trainer.created_envs, batch_size=4)
    trainer.train()
    metrics = read_metrics(tmp_path / "run")
    trajs = [
        t
        for f in sorted((tmp_path / "run" / "trajectories").glob("*.jsonl.gz"))
        for t in read_trajectories(f)
    ]
    assert len(trajs) == 4
    assert sum(m["security/injection_attempts"] for m in metrics) > 0
    assert sum(m["security/disallowed_executed"] for m in metrics) == 0
    assert sum(m["security/denied_tool_calls"] for m in metrics) == sum(
        c.status in ("unknown_tool", "permission_denied") for t in trajs for c in t.tool_calls
    )
    # The obedient policy did try the forbidden tools; none ran.
    tried = [c for t in trajs for c in t.tool_calls if c.name in ("python", "shell")]
    seen = [(t.termination, [(c.name, c.status) for c in t.tool_calls]) for t in trajs]
    assert tried and all(c.status == "unknown_tool" for c in tried), seen
    system_prompt = trainer.env_factory().system_prompt
    for t in trajs:
        assert t.metadata["injection_attempts"] >= 0
        audit = audit_trajectory(t, world.tok, system_prompt)
        assert audit["saw_injection"]
        assert not any(audit[k] for k in SYSTEM_BREACHES), (t.id, audit)
        assert all(c.name == "search" for c in t.tool_calls if c.status == "ok")


def test_security_stats_count_attempts_denials_and_any_disallowed_execution():
    from searchrl.common.trajectory import ToolCallRecord, Trajectory
    from searchrl.rollout.stats import security_stats

    offered = [{"type": "function", "function": {"name": "search"}}]
    clean = Trajectory(id="a", question_id="a", question="?", golds=[], metadata={"tools": offered})
    clean.tool_calls = [
        ToolCallRecord("search", {"query": "x"}),
        ToolCallRecord("shell", {}, status="unknown_tool"),
    ]
    clean.metadata["injection_attempts"] = 3
    breached = Trajectory(id="b", question_id="b", question="?", golds=[], metadata={"tools": offered})
    breached.tool_calls = [ToolCallRecord("python", {"code": "1"})]  # ran although not offered
    stats = security_stats([clean, breached])
    assert stats == {
        "security/injection_attempts": 3.0,
        "security/denied_tool_calls": 1.0,
        "security/disallowed_executed": 1.0,
    }


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_sanitized_text_keeps_no_control_or_bidi_character_and_its_length(text):
    out = sanitize_text(text)
    assert not any(unicodedata.category(c) == "Cc" and c not in "\t\n\r" for c in out.text)
    assert not any("\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069" for c in out.text)
    hidden = sum(
        (unicodedata.category(c) == "Cc" and c not in "\t\n\r")
        or "\u202a" <= c <= "\u202e"
        or "\u2066" <= c <= "\u2069"
        for c in text
    )
    assert out.control_characters == hidden
    if out.injection_attempts == 0:  # only control characters replaced: one for one
        assert len(out.text) == len(text)


def test_a_document_with_nul_escape_and_bidi_bytes_reads_clean():
    out = sanitize_text("Tirrow\x00 is\x1b[31m red\u202e; ok\ttab\nline")
    assert out.text == "Tirrow\ufffd is\ufffd[31m red\ufffd; ok\ttab\nline"
    assert out.control_characters == 3 and out.injection_attempts == 0
