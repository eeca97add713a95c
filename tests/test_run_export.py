"""`searchrl export RUN --checkpoint N --out DIR`: a plain HF model folder from a real tiny PPO run, with and
without LoRA; `AutoModelForCausalLM.from_pretrained` loads it and answers as the trained policy does.

The runs are real `PPOTrainer` steps (tiny Qwen2 policy saved to disk first, so the run records where its
base model is, as a real run from a local Qwen folder does), with the learnable `LikedTokens` reward so the
weights (or the adapter) really move.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel
from test_ppo_trainer import QA, TINY, LikedTokens, env_factory
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.models.io import load_policy
from searchrl.models.tiny import build_policy
from searchrl.ppo.config import PPOConfig
from searchrl.ppo.trainer import PPOTrainer
from searchrl.run.adapter import adapter_base_dir
from searchrl.run.export import MANIFEST_NAME, ExportError, export_checkpoint

runner = CliRunner()
PROBE = "In which province is Varnholt? Search first."


def logits(model, tok) -> torch.Tensor:
    ids = tok(PROBE, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        return model(input_ids=ids).logits


def train_one_step(world, root, name: str, lora: bool):
    base = root / f"{name}-base"
    build_policy(world["tok"], TINY).save_pretrained(base)
    world["tok"].save_pretrained(base)
    args = PPOConfig(
        output_dir=str(root / name),
        policy_model_path=str(base),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        total_episodes=4,
        num_ppo_epochs=1,
        max_new_tokens_per_turn=8,
        max_episode_tokens=40,
        learning_rate=5e-2 if lora else 1e-3,
        temperature=1.0,
        save_steps=1,
        eval_steps=1000,
        progress_bar=False,
        save_trajectories=False,
        seed=3,
    )
    peft_config = (
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0) if lora else None
    )
    trainer = PPOTrainer(
        args,
        world["tok"],
        load_policy(base),
        None,
        None,
        QA,
        reward_funcs=LikedTokens(),
        environment=env_factory(world),
        peft_config=peft_config,
    )
    trainer.train()
    return root / name, base, world["tok"]


@pytest.fixture(scope="module")
def runs(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    torch.set_num_threads(1)
    return {
        "full": train_one_step(world, root, "full", lora=False),
        "lora": train_one_step(world, root, "lora", lora=True),
    }


def test_full_checkpoint_exports_to_a_folder_from_pretrained_loads(runs, tmp_path):
    run, base, _ = runs["full"]
    result = runner.invoke(app, ["export", str(run), "--checkpoint", "1", "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "step-1" in result.output
    out = tmp_path / "hf"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    trained = load_policy(run / "checkpoints" / "step-1" / "policy")
    assert torch.equal(logits(model, tok), logits(trained, tok))
    assert not torch.allclose(
        logits(model, tok), logits(load_policy(base), tok)
    )  # the step changed the policy
    assert tok.chat_template and tok.pad_token_id != tok.eos_token_id
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["checkpoint"] == "step-1" and manifest["lora_merged"] is False
    assert manifest["check"]["verified"] and manifest["check"]["max_abs_logit_diff"] == 0.0


def test_lora_checkpoint_is_merged_into_its_base(runs, tmp_path):
    run, base, tok = runs["lora"]
    adapter = run / "checkpoints" / "step-1" / "policy"
    assert (adapter / "adapter_config.json").is_file()  # the checkpoint holds only the adapter
    result = export_checkpoint(run, tmp_path / "merged")
    out = result.out
    assert result.manifest["lora_merged"] is True and result.manifest["base_model"] == str(base)
    assert not (out / "adapter_config.json").exists() and not (out / "adapter_model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    # The reference: the base model with the adapter applied by PEFT, unmerged.
    with_adapter = PeftModel.from_pretrained(load_policy(base), adapter).eval()
    expected = logits(with_adapter, tok)
    assert torch.allclose(logits(merged, tok), expected, atol=1e-5)
    assert not torch.allclose(logits(load_policy(base), tok), expected, atol=1e-4)  # the adapter matters


def test_bfloat16_export_and_a_missing_base_model(runs, tmp_path):
    run, base, tok = runs["lora"]
    result = export_checkpoint(run, tmp_path / "bf16", dtype="bfloat16")
    assert result.manifest["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", local_files_only=True)
    assert next(model.parameters()).dtype == torch.bfloat16
    # An adapter whose base is gone: the run's base recorded nowhere usable, so --base-model is asked for.
    copy = tmp_path / "moved-run"
    import shutil

    shutil.copytree(run, copy)
    config = copy / "config.yaml"
    config.write_text(config.read_text().replace(str(base), str(tmp_path / "gone")))
    adapter_config = copy / "checkpoints" / "step-1" / "policy" / "adapter_config.json"
    data = json.loads(adapter_config.read_text())
    data["base_model_name_or_path"] = str(tmp_path / "gone")
    adapter_config.write_text(json.dumps(data))
    with pytest.raises(ExportError, match="pass --base-model DIR"):
        export_checkpoint(copy, tmp_path / "x")
    ok = export_checkpoint(copy, tmp_path / "y", base_model=base)
    assert ok.manifest["base_model"] == str(base)


def test_a_relative_base_path_is_found_from_any_working_directory(runs, tmp_path, monkeypatch):
    from searchrl.evaluation.targets import load_policy_for_eval
    from searchrl.run.reader import RunReader

    run, base, tok = runs["lora"]
    # As if training had run inside `project/` with policy_model_path "models/base": the adapter and the
    # run config record the base relative to that folder, which is nowhere from another working directory.
    project = tmp_path / "project"
    shutil.copytree(base, project / "models" / "base")
    shutil.copytree(run, project / "runs" / "lora")
    moved = project / "runs" / "lora"
    adapter = moved / "checkpoints" / "step-1" / "policy"
    recorded = json.loads((adapter / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == str(base)  # what the trainer wrote: the path it loaded
    (adapter / "adapter_config.json").write_text(
        json.dumps({**recorded, "base_model_name_or_path": "models/base"})
    )
    config = moved / "config.yaml"
    config.write_text(config.read_text().replace(str(base), "models/base"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert adapter_base_dir(adapter) == project / "models" / "base"  # found above the adapter
    with_adapter = PeftModel.from_pretrained(
        load_policy(base), run / "checkpoints" / "step-1" / "policy"
    ).eval()
    expected = logits(with_adapter, tok)
    # `searchrl eval`'s loader and `searchrl export` both merge the adapter into that base.
    reader = RunReader(moved)
    policy, tokenizer = load_policy_for_eval(reader, reader.config, adapter)
    assert torch.allclose(logits(policy, tokenizer), expected, atol=1e-5)
    result = export_checkpoint(moved, tmp_path / "merged")
    assert result.manifest["lora_merged"] is True and result.manifest["base_model"] == str(
        project / "models" / "base"
    )
    merged = AutoModelForCausalLM.from_pretrained(result.out, local_files_only=True).eval()
    assert torch.allclose(logits(merged, tok), expected, atol=1e-5)
    # From the folder training ran in, the recorded path as it is.
    monkeypatch.chdir(project)
    assert adapter_base_dir(adapter) == Path.cwd() / "models" / "base"
    # A recorded path that names nothing anywhere: the error says what was recorded and what to do; the
    # caller's fallback (the run's starting policy) is used when given.
    (adapter / "adapter_config.json").write_text(
        json.dumps({**recorded, "base_model_name_or_path": "models/gone"})
    )
    with pytest.raises(FileNotFoundError, match="'models/gone'.*searchrl export --base-model"):
        adapter_base_dir(adapter)
    assert adapter_base_dir(adapter, [None, str(base)]) == base


def test_export_refuses_what_it_cannot_do(runs, tmp_path):
    run, _, _ = runs["full"]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["export", str(run), "--out", str(tmp_path / "busy")])
    assert result.exit_code == 2 and "exists and is not empty" in result.output
    result = runner.invoke(app, ["export", str(run), "--out", str(tmp_path / "busy"), "--overwrite"])
    assert result.exit_code == 2 and "not an earlier export" in result.output
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    result = runner.invoke(app, ["export", str(run), "--checkpoint", "7", "--out", str(tmp_path / "z")])
    assert result.exit_code == 2 and "checkpoints here: ['step-1']" in " ".join(result.output.split())
    # An earlier export is replaced with --overwrite.
    export_checkpoint(run, tmp_path / "again")
    assert export_checkpoint(run, tmp_path / "again", overwrite=True).out == tmp_path / "again"
