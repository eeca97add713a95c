"""`SearchConfig` + `open_backend`: the one place anything (PPO, GRPO, SFT, eval, the TRL adapter, the CLI)
turns its settings into a backend stack."""

from __future__ import annotations

import dataclasses

import pytest
from support.search import ServerProcess, write_corpus

from searchrl.common.config import config_from_dict
from searchrl.search.bm25 import BM25Backend, BM25Params
from searchrl.search.cache import CachedBackend
from searchrl.search.client import HTTPBackend
from searchrl.search.faults import FaultInjectingBackend
from searchrl.search.index import SearchConfig, open_backend
from searchrl.search.server import ServerLimits


def test_every_config_field_has_help():
    for cls in (SearchConfig, BM25Params, ServerLimits):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_stack_order_index_faults_cache(toy_index_dir, tmp_path):
    assert isinstance(open_backend(SearchConfig(index=str(toy_index_dir))), BM25Backend)
    cfg = SearchConfig(index=str(toy_index_dir), fault_drop_rate=0.5, cache=str(tmp_path / "c.sqlite"))
    stack = open_backend(cfg)
    assert isinstance(stack, CachedBackend) and isinstance(stack.backend, FaultInjectingBackend)
    recorded = stack.search(["rivers", "Tirrow"], 3)
    stack.close()
    replay = open_backend(
        config_from_dict(SearchConfig, {"cache": str(tmp_path / "c.sqlite"), "cache_mode": "replay"})
    )
    assert replay.search(["rivers", "Tirrow"], 3) == recorded


def test_url_config_and_errors(toy_index_dir):
    with ServerProcess(toy_index_dir) as server:
        backend = open_backend(SearchConfig(url=server.url, read_timeout=5))
        assert isinstance(backend, HTTPBackend)
        assert backend.search(["capital of Veland"], 1)[0][0].doc_id == "c1"
    with pytest.raises(ValueError, match="exactly one of 'index'"):
        open_backend(SearchConfig())
    with pytest.raises(ValueError, match="exactly one of 'index'"):
        open_backend(SearchConfig(index=str(toy_index_dir), url="http://127.0.0.1:1"))
    with pytest.raises(ValueError, match="needs 'cache'"):
        open_backend(SearchConfig(cache_mode="replay"))


def test_run_configs_open_through_the_one_opener(toy_index_dir, tmp_path, monkeypatch):
    from searchrl.common.config import ConfigError
    from searchrl.grpo.config import GRPORunConfig
    from searchrl.ppo.config import PPOConfig

    ppo = PPOConfig(search_backend="http", search_url="http://127.0.0.1:9", output_dir="unused")
    monkeypatch.setenv("SEARCHRL_SERVE_TOKEN", "s3cret")
    backend = ppo.open_backend(read_timeout=ppo.search_timeout_s)
    assert backend._client.headers["Authorization"] == "Bearer s3cret"  # the server's token variable
    assert backend.read_timeout == ppo.search_timeout_s  # the run's search deadline
    assert (
        open_backend(SearchConfig(url="http://127.0.0.1:9", token="mine"))._client.headers["Authorization"]
        == "Bearer mine"
    )  # an explicit token wins
    monkeypatch.delenv("SEARCHRL_SERVE_TOKEN")
    assert "Authorization" not in ppo.open_backend()._client.headers
    grpo = GRPORunConfig(search_backend="http", search_url="http://127.0.0.1:9")
    assert isinstance(grpo.open_backend(), HTTPBackend)  # both trainers read the same search section
    assert isinstance(GRPORunConfig(index_dir=str(toy_index_dir)).open_backend(), BM25Backend)
    with pytest.raises(ConfigError, match="index_dir is not set"):
        GRPORunConfig().open_backend()


def test_a_missing_index_is_built_from_the_runs_corpus(tmp_path):
    from searchrl.ppo.config import PPOConfig

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    cfg = PPOConfig(index_dir=str(tmp_path / "new"), corpus_path=str(corpus), output_dir="unused")
    backend = cfg.open_backend()
    assert isinstance(backend, BM25Backend) and (tmp_path / "new" / "meta.json").is_file()
    assert backend.search(["capital of Veland"], 1)[0][0].doc_id == "c1"
    again = cfg.open_backend()  # now it exists: opened, not rebuilt
    assert again.fingerprint == backend.fingerprint
    missing = PPOConfig(
        index_dir=str(tmp_path / "other"), corpus_path=str(tmp_path / "no.jsonl"), output_dir="u"
    )
    with pytest.raises(FileNotFoundError, match="does not exist"):
        missing.open_backend()
    assert not (tmp_path / "other").exists()
