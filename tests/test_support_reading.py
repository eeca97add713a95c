"""The support expert's reading examples: an order id out of a search result, labels on the id only."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from searchrl.demo.stages import StageRunner
from searchrl.demo.support import prepare_support_world
from searchrl.demo.support_config import support_smoke_config
from searchrl.sft.examples import IGNORE_INDEX, action_turns
from searchrl.sft.support_expert import reading_examples


def test_every_where_demonstration_lazy_or_not_reads_the_id_its_search_result_shows() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        world = prepare_support_world(support_smoke_config(out_dir=tmp), Path(tmp), StageRunner(False))
    tok, demos = world.tokenizer, world.demos
    where = [d for d in demos if d.metadata.get("hops") == 2]
    lazy = [d for d in where if d.metadata["expert_kind"] == "skip_lookup"]
    assert lazy and len(lazy) < len(where)  # both kinds are there to read from
    examples = reading_examples(tok, demos)
    assert len(examples) == len(where)  # every `where` demonstration, and no other question's
    for demo, example in zip(where, examples, strict=True):
        shown = re.search(r"^\[\d+\] Order o-(\d+)$", demo.observations[0], re.MULTILINE).group(1)
        labelled = [t for t in example["labels"] if t != IGNORE_INDEX]
        assert tok.decode(labelled) == shown  # the digits, nothing else
        start = action_turns(demo.action_mask)[1][0]
        assert example["input_ids"][:start] == [int(i) for i in demo.input_ids[:start]]
        call = example["input_ids"][start:]
        assert tok.decode(call).startswith("<tool_call>") and f'"o-{shown}"' in tok.decode(call)
        if demo.metadata["expert_kind"] == "expert" and not demo.metadata.get("followed_injection"):
            # the expert's own call, token for token
            end = action_turns(demo.action_mask)[1][1]
            assert call == [int(i) for i in demo.input_ids[start:end]]
