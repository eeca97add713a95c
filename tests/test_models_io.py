"""Model directories on disk (`searchrl.models.io`): a save is atomic, a failed one leaves the old model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from worlds import TINY_ONE_LAYER

from searchrl.models.io import STAGING_MARK, load_policy, load_tokenizer, save_model_dir, staged_model_dir
from searchrl.models.tiny import build_policy, train_tokenizer


class _Writes:
    """Stands in for a model: `save_pretrained` writes `files` (name -> text), then raises if `fail`."""

    def __init__(self, files: dict[str, str], fail: bool = False) -> None:
        self.files, self.fail = files, fail

    def save_pretrained(self, folder: str) -> None:
        for name, text in self.files.items():
            (Path(folder) / name).write_text(text)
            if self.fail:
                raise OSError("disk full")  # killed after the first file: a half model


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def test_a_saved_model_loads_back_with_the_same_weights(tmp_path: Path) -> None:
    tok = train_tokenizer(["a tiny corpus for the tokenizer"] * 4, vocab_size=300)
    policy = build_policy(tok, TINY_ONE_LAYER)
    out = save_model_dir(policy, tok, tmp_path / "nested" / "policy")
    assert out == tmp_path / "nested" / "policy"
    loaded, tok2 = load_policy(out), load_tokenizer(out)
    for (name, a), (_, b) in zip(policy.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert tok2.encode("a tiny corpus") == tok.encode("a tiny corpus")
    assert _siblings(out) == []  # the staging folder was renamed, nothing left beside it


def test_a_failed_save_leaves_no_folder_and_no_staging(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with pytest.raises(OSError, match="disk full"):
        save_model_dir(_Writes({"config.json": "{}", "model.safetensors": "x"}, fail=True), None, target)
    assert not target.exists() and _siblings(target) == []


def test_a_failed_save_over_a_model_keeps_the_old_one_whole(tmp_path: Path) -> None:
    target = tmp_path / "model"
    save_model_dir(_Writes({"config.json": "old", "model.safetensors": "old weights"}), None, target)
    with pytest.raises(OSError):
        save_model_dir(_Writes({"config.json": "new", "model.safetensors": "new"}, fail=True), None, target)
    assert (target / "config.json").read_text() == "old"
    assert (target / "model.safetensors").read_text() == "old weights"
    assert _siblings(target) == []


def test_a_save_replaces_the_folder_instead_of_merging_into_it(tmp_path: Path) -> None:
    target = tmp_path / "model"
    save_model_dir(_Writes({"config.json": "old", "adapter_model.safetensors": "stale"}), None, target)
    save_model_dir(_Writes({"config.json": "new", "model.safetensors": "w"}), None, target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert (target / "config.json").read_text() == "new" and _siblings(target) == []


def test_a_staged_folder_appears_only_when_its_block_succeeds(tmp_path: Path) -> None:
    target = tmp_path / "export"
    with pytest.raises(ValueError), staged_model_dir(target) as staging:
        assert staging.parent == tmp_path and STAGING_MARK in staging.name
        (staging / "config.json").write_text("{}")
        assert not target.exists()  # nothing is published while the writer is still writing
        raise ValueError("verification failed")
    assert not target.exists() and _siblings(target) == []
    with staged_model_dir(target) as staging:
        (staging / "manifest.json").write_text("{}")
    assert (target / "manifest.json").is_file() and _siblings(target) == []
