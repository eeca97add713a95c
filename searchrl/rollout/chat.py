"""Token glue around tool results, computed from the chat template by token difference (as TRL does).

Why: the policy is trained on exactly the tokens it saw. When a tool result goes back into the
conversation, the tokens inserted after the policy's EOS must be exactly what the chat template would
render for the tool messages (no hand-written markup, no re-tokenising the history). We render a small
dummy conversation with and without the tool messages and keep the difference after the dummy's last
EOS; that works for any prefix-preserving template (Qwen2.5, the tiny model's, a real Qwen's).

The same ids are the token budget's measure: `observation_ids` is what the rollout inserts and what it
tells the environment an observation costs, and `ChatTokenMeter` counts for TRL's tool loop, which
inserts tool results the same way. Nothing else measures template glue.
"""

from __future__ import annotations

import json
from typing import Any

from transformers import PreTrainedTokenizerBase

# The dummy conversation the tool glue is measured against: its own content never reaches a trajectory.
_DUMMY_USER = {"role": "user", "content": "dummy"}


def _as_ids(rendered: Any) -> list[int]:
    # apply_chat_template(tokenize=True) returns a list, a BatchEncoding or a dict depending on the version.
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    if rendered and isinstance(rendered[0], list):
        rendered = rendered[0]
    return [int(i) for i in rendered]


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: list[dict] | None = None
) -> list[int]:
    """Token ids of the prompt: the messages rendered with the generation prompt (`<|im_start|>assistant\\n`)."""
    rendered = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return _as_ids(rendered)


def render_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """The chat template's text for `messages` (what a trajectory's token ids must decode to)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False
    )


def _eos_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; set tokenizer.eos_token (Qwen2.5: <|im_end|>)")
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


class ToolGlue:
    """Computes and caches the token glue for one tokenizer (and tool list).

    `suffix_ids(tool_messages)` is what follows the policy's EOS when the environment answers with tool
    messages: for Qwen2.5 `\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n`. The dummy prefix is rendered once and cached.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: list[dict] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self._eos = _eos_ids(tokenizer)
        self._prefix_cache: dict[str, list[int]] = {}

    def _dummy_assistant(self, name: str) -> dict[str, Any]:
        call = {"type": "function", "function": {"name": name, "arguments": {}}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    def _prefix(self, name: str) -> list[int]:
        if name not in self._prefix_cache:
            ids = _as_ids(
                self.tokenizer.apply_chat_template(
                    [_DUMMY_USER, self._dummy_assistant(name)],
                    tools=self.tools,
                    add_generation_prompt=False,
                    tokenize=True,
                    return_dict=False,
                )
            )
            # Templates render "...<|im_end|>\n" after the assistant turn; the policy stops at the EOS, so the
            # glue starts right after the last EOS (the "\n" belongs to the glue).
            last_eos = max((i for i, t in enumerate(ids) if t in self._eos), default=None)
            if last_eos is None:
                raise ValueError("the chat template rendered an assistant turn without an EOS token")
            self._prefix_cache[name] = ids[: last_eos + 1]
        return self._prefix_cache[name]

    def suffix_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """Exactly the tokens the template renders after the assistant's EOS for these tool messages."""
        if not tool_messages:
            raise ValueError("suffix_ids needs at least one tool message")
        name = str(tool_messages[0].get("name", "search"))
        prefix = self._prefix(name)
        full = _as_ids(
            self.tokenizer.apply_chat_template(
                [_DUMMY_USER, self._dummy_assistant(name), *tool_messages],
                tools=self.tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "the chat template is not prefix-preserving (adding a tool message changed earlier tokens); "
                "use a prefix-preserving template such as trl's qwen2_5.jinja / qwen2_5_training.jinja"
            )
        return full[len(prefix) :]


def tool_suffix_ids(
    tokenizer: PreTrainedTokenizerBase, tool_messages: list[dict[str, Any]], tools: list[dict] | None = None
) -> list[int]:
    """One-shot form of `ToolGlue(tokenizer, tools).suffix_ids(tool_messages)`."""
    return ToolGlue(tokenizer, tools).suffix_ids(tool_messages)


def inline_observation_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Search-R1 protocol: the observation goes into the same assistant turn as plain text tokens."""
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def observation_ids(
    tokenizer: PreTrainedTokenizerBase, glue: ToolGlue | None, result: Any
) -> tuple[list[int], str]:
    """The ids an environment step's observation puts into the sequence, and its text.

    Chat (`glue` given): the tool messages with exactly the template's glue. Search-R1 (`glue` None): the
    inline `<information>` text as plain tokens. `result` is a `StepResult`.
    """
    if glue is not None:
        messages = list(result.tool_messages)
        return glue.suffix_ids(messages), "\n\n".join(str(m.get("content", "")) for m in messages)
    text = str(result.inline_observation or "")
    return inline_observation_ids(tokenizer, text), text


class ChatTokenMeter:
    """The environment's `TokenMeter` for TRL's tool loop: a turn is its text's tokens plus EOS; an
    observation is exactly the ids TRL inserts for it (the template's glue by difference, as here)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: list[dict] | None = None) -> None:
        self.tokenizer = tokenizer
        self.glue = ToolGlue(tokenizer, tools)

    def turn_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) + 1

    def observation_tokens(self, result: Any) -> int:
        glue = self.glue if result.inline_observation is None else None
        return len(observation_ids(self.tokenizer, glue, result)[0])


def tools_key(tools: list[dict] | None) -> str:
    """A hashable key of a tool list (to share one ToolGlue between environments with the same tools)."""
    return json.dumps(tools or [], sort_keys=True)
