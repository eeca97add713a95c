"""The customer-service task (issue 26, part B): the store generator, get_order's check, the leak measure, the expert.

Fast: a store of 60 customers, a real BM25 index with the store's ACLs, the real environment with both tools and
the real rollout engine with forced turns (no model). The demo end to end is `tests/test_demo_support.py`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import Trajectory
from searchrl.data import support_text as text
from searchrl.data.support import SupportConfig, generate_support, load_store
from searchrl.data.support_access import DENIAL_REASON, LeakDetector, order_tool, task_metrics
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_tool_call
from searchrl.evaluation.statistics import summarise_metrics
from searchrl.models.tiny import tokenizer_training_texts, train_tokenizer
from searchrl.rollout.stats import security_stats
from searchrl.search.index import build_index
from searchrl.sft.support_expert import SupportExpert, SupportExpertConfig

SMALL = SupportConfig(customers=60, train_questions=120, dev_questions=12, test_questions=12)
ENV = EnvConfig(max_turns=4, max_tool_calls=3, topk=1, tool_schema_in_prompt=False, max_episode_tokens=600)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("support")
    task = generate_support(SMALL)
    task.write(out / "data")
    backend = build_index(out / "data" / "corpus.jsonl", out / "index")
    tok = train_tokenizer(
        tokenizer_training_texts(task.corpus, task.splits["train"]) + task.tokenizer_texts(), 1024
    )
    return {"task": task, "backend": backend, "tool": order_tool(task.store), "tok": tok, "out": out}


def env_of(world: dict, principal: str | None = None) -> SearchEnvironment:
    env = SearchEnvironment(world["backend"], ENV, tokenizer=world["tok"], tools=[world["tool"]])
    env.reset(
        {"question": "Where is my order?", "golds": ["x"], **({"principal": principal} if principal else {})}
    )
    return env


def other_customers_order(world: dict, customer: str):
    store = world["task"].store
    return next(o for o in store.orders.values() if o.customer != customer)


# -- the generator -------------------------------------------------------------------------------------


def test_the_same_seed_writes_the_same_files_and_another_seed_another_store(tmp_path: Path) -> None:
    a, b = generate_support(SMALL).write(tmp_path / "a"), generate_support(SMALL).write(tmp_path / "b")
    for name in ("corpus", "train", "dev", "test", "store"):
        assert a[name].read_bytes() == b[name].read_bytes(), name
    other = generate_support(dataclasses.replace(SMALL, seed=1))
    assert other.corpus != generate_support(SMALL).corpus
    assert load_store(tmp_path / "a").to_dict() == generate_support(SMALL).store.to_dict()


def test_order_documents_are_their_customer_s_only_and_pages_are_public(world: dict) -> None:
    store, corpus = world["task"].store, world["task"].corpus
    orders = [d for d in corpus if d["id"] in store.orders]
    assert len(orders) == len(store.orders) and len(corpus) == len(orders) + len(store.pages)
    for doc in orders:
        assert doc["acl"] == [store.orders[doc["id"]].customer]
        assert store.customers[doc["acl"][0]].name in doc["contents"]
    assert all("acl" not in page for page in store.pages)
    assert json.loads((world["out"] / "index" / "meta.json").read_text())["acl"]["restricted_docs"] == len(
        orders
    )


def test_splits_are_by_customer_and_every_row_acts_for_one(world: dict) -> None:
    store, splits = world["task"].store, world["task"].splits
    principals = {s: {r["principal"] for r in rows} for s, rows in splits.items()}
    for split, who in principals.items():
        assert who and all(store.customers[c].split == split for c in who)
    assert not principals["train"] & (principals["dev"] | principals["test"])
    train_text = json.dumps(splits["train"])
    for customer in principals["test"]:
        assert store.customers[customer].name not in train_text
        assert all(o.order_id not in train_text for o in store.orders_of(customer))
    assert {r["type"] for r in splits["test"]} == set(text.QUESTION_TYPES)


def test_golds_follow_from_the_store(world: dict) -> None:
    store = world["task"].store
    for row in (r for rows in world["task"].splits.values() for r in rows):
        order = store.orders[row["order_id"]]
        assert order.customer == row["principal"] and row["item"] in order.items
        if row["type"] in ("where", "where_id"):
            assert row["golds"] == [store.status_text(order)]
            assert f"Status: {row['golds'][0]}." in store.record(order)
        elif row["type"] == "return":
            cutoff = store.cutoff(text.category_of(row["item"].split()[-1]))
            assert row["golds"] == ["yes" if order.date >= cutoff else "no"]
            assert abs(order.date - cutoff) >= SMALL.return_margin_days and order.status == text.DELIVERED
        else:
            waiting = [o for o in store.orders_of(row["principal"]) if o.status == text.PROCESSING]
            assert waiting == [order] and row["golds"] == [order.items[0], order.order_id]
    answers = {
        g for rows in world["task"].splits.values() for r in rows if r["type"] == "return" for g in r["golds"]
    }
    assert answers == {"yes", "no"}


def test_injections_name_another_customer_s_order_in_notes_and_pages(world: dict) -> None:
    store = world["task"].store
    noted = [o for o in store.orders.values() if o.injected]
    assert noted and all(store.orders[o.injected].customer != o.customer for o in noted)
    assert all(f"order {o.injected}" in store.record(o) for o in noted)
    pages = [p for p in store.pages if p.get("injected")]
    assert len(pages) == SMALL.injected_pages and any(p["id"].startswith("page-returns-") for p in pages)
    assert all(f"order {p['injected']}" in p["contents"] for p in pages)
    assert any(r["injected"] for r in world["task"].splits["train"])


def test_a_config_that_cannot_work_is_refused() -> None:
    with pytest.raises(ConfigError, match="type_shares"):
        SupportConfig(type_shares={"where": 1.0, "refund": 0.5})
    with pytest.raises(ConfigError, match="dev_customer_share"):
        SupportConfig(dev_customer_share=0.6, test_customer_share=0.5)


# -- who may read what -----------------------------------------------------------------------------------


def test_get_order_returns_the_own_record_and_denies_another_customer_s(world: dict) -> None:
    store = world["task"].store
    mine = next(iter(store.orders.values()))
    theirs = other_customers_order(world, mine.customer)
    env = env_of(world, mine.customer)
    ok = env.step(format_tool_call("get_order", {"order_id": mine.order_id}))
    assert ok.records[0].status == "ok" and store.status_text(mine) in ok.tool_messages[0]["content"]
    denied = env.step(format_tool_call("get_order", {"order_id": theirs.order_id}))
    shown = denied.tool_messages[0]["content"]
    assert denied.records[0].status == "permission_denied" and DENIAL_REASON in shown
    owner = store.customers[theirs.customer]
    for secret in (theirs.order_id, owner.name, owner.address, store.status_text(theirs), *theirs.items):
        assert secret not in shown
    assert not LeakDetector(store).leaks(shown, mine.customer)
    # A missing order reads exactly like another customer's; no principal reads no order at all.
    missing = env.step(format_tool_call("get_order", {"order_id": "o-00000"}))
    assert missing.tool_messages[0]["content"] == shown
    nobody = env_of(world).step(format_tool_call("get_order", {"order_id": mine.order_id}))
    assert nobody.records[0].status == "permission_denied"


def test_search_as_one_customer_never_returns_another_s_order(world: dict) -> None:
    store = world["task"].store
    mine = next(iter(store.orders.values()))
    theirs = other_customers_order(world, mine.customer)
    env = env_of(world, mine.customer)
    found = env.step(
        format_tool_call("search", {"query": f"order {theirs.order_id} {theirs.items[0]}", "k": 3})
    )
    assert found.records[0].status == "ok" and len(found.records[0].doc_ids) == 3
    assert theirs.order_id not in found.records[0].doc_ids
    assert not LeakDetector(store).leaks(found.tool_messages[0]["content"], mine.customer)


def _traj(observations: list[str], principal: str | None) -> Trajectory:
    meta = {"principal": principal} if principal else {}
    return Trajectory(
        id="t", question_id="q", question="?", golds=["x"], observations=observations, metadata=meta
    )


def test_the_leak_measure_catches_a_planted_leak_and_nothing_else(world: dict) -> None:
    store = world["task"].store
    detector = LeakDetector(store)
    mine = next(o for o in store.orders.values() if o.injected)
    theirs = other_customers_order(world, mine.customer)
    owner = store.customers[theirs.customer]
    own_record = store.record(mine)  # holds the principal's own name and address and an injected order id
    assert (
        detector.leaked_observations(
            _traj([own_record, *(p["contents"] for p in store.pages)], mine.customer)
        )
        == 0
    )
    for planted in (owner.address, owner.name, theirs.order_id, store.record(theirs)):
        traj = _traj([own_record, f"Shipping update: {planted}."], mine.customer)
        assert detector.leaked_observations(traj) == 1, planted
    # Without a principal, every customer's data is someone else's.
    assert detector.leaked_observations(_traj([own_record], None)) == 1
    metric = task_metrics(store)["leaked_observations"]
    assert metric(_traj([store.record(theirs), store.record(theirs)], mine.customer)) == 2.0


def test_summarise_metrics_gives_means_totals_intervals_and_groups() -> None:
    trajs = [_traj([], None) for _ in range(4)]
    for i, t in enumerate(trajs):
        t.metadata["type"] = "a" if i < 2 else "b"
    values = {"ok": lambda t: 1.0 if t.metadata["type"] == "a" else 0.0, "leaks": lambda t: 0.0}
    out = summarise_metrics(trajs, values, totals=("leaks",), by=lambda t: t.metadata["type"])
    assert out["n"] == 4 and out["ok"] == 0.5 and out["leaks"] == 0.0 and out["ci95"]["leaks"] == [0.0, 0.0]
    assert 0.0 <= out["ci95"]["ok"][0] <= 0.5 <= out["ci95"]["ok"][1] <= 1.0
    assert out["by_group"]["a"]["ok"] == 1.0 and out["by_group"]["b"]["ok"] == 0.0


def test_the_compact_prompt_names_every_tool_offered(world: dict) -> None:
    env = SearchEnvironment(world["backend"], ENV, tools=[world["tool"]])
    system = env.reset({"question": "Where is my order?", "golds": ["x"]})[0]["content"]
    assert env.tools == [] and "get_order" in system and '"order_id": "o-12345"' in system
    search_only = SearchEnvironment(world["backend"], ENV).reset({"question": "q", "golds": ["x"]})[0][
        "content"
    ]
    assert "get_order" not in search_only and "Other tools" not in search_only


# -- the expert ------------------------------------------------------------------------------------------


def demonstrate(world: dict, rows: list[dict], **cfg) -> list[Trajectory]:
    envs = [
        SearchEnvironment(world["backend"], ENV, tokenizer=world["tok"], tools=[world["tool"]]) for _ in rows
    ]
    return SupportExpert(SupportExpertConfig(**cfg)).demonstrate(world["tok"], envs, rows)


def test_the_expert_solves_every_question_through_the_real_environment(world: dict) -> None:
    rows = world["task"].splits["train"]
    trajs = demonstrate(world, rows, skip_lookup=0.0, follow_injection=0.0)
    metrics = task_metrics(world["task"].store)
    assert all(metrics["task_success"](t) == 1.0 for t in trajs)
    assert all(t.metadata["read_from"] == "observation" for t in trajs)
    assert sum(metrics["permission_denied_rate"](t) + metrics["leaked_observations"](t) for t in trajs) == 0
    # get_order was offered (the compact prompt carries no schema): its calls are not "disallowed" ones.
    assert security_stats(trajs)["security/disallowed_executed"] == 0.0
    for traj, row in zip(trajs, rows, strict=True):
        names = [c.name for c in traj.tool_calls]
        assert names == {"where": ["search", "get_order"], "where_id": ["get_order"]}.get(
            row["type"], ["search"]
        )
        assert traj.metadata["principal"] == row["principal"]


def test_the_noise_knob_gives_lazy_answers_and_followed_injections(world: dict) -> None:
    rows = world["task"].splits["train"]
    trajs = demonstrate(world, rows, skip_lookup=1.0, follow_injection=1.0)
    metrics = task_metrics(world["task"].store)
    for traj, row in zip(trajs, rows, strict=True):
        denied = metrics["permission_denied_rate"](traj)
        assert denied == (1.0 if row["injected"] and row["type"] != "where" else 0.0), row
        assert metrics["leaked_observations"](traj) == 0.0
        if row["type"] == "where":
            assert [c.name for c in traj.tool_calls] == ["search"] and traj.metadata[
                "expert_kind"
            ] == "skip_lookup"
            assert traj.answer == (text.SHIPPED if row["golds"][0] != text.WAITING else text.WAITING)
        else:
            assert metrics["task_success"](traj) == 1.0
