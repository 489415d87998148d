"""Input preparation for graph steps: the fixed-shape block table graphs read
gets exactly the columns the step's requests use; nothing wider is gathered."""

from __future__ import annotations

import torch

from octavo import SamplingParams
from octavo.core.scheduler_output import NewRequestData, SchedulerOutput
from octavo.runtime.input_batch import InputPreparer
from octavo.runtime.input_buffers import InputBuffers
from octavo.runtime.request_state import RequestStates

BLOCK_SIZE, MAX_REQS, MAX_BLOCKS = 4, 4, 64


def preparer_with(requests: dict[str, tuple[int, list[int]]]):
    """``{id: (num_prompt_tokens, block_ids)}``, all prompts scheduled whole."""
    states = RequestStates(MAX_REQS, MAX_BLOCKS)
    preparer = InputPreparer(states, InputBuffers(64, MAX_REQS, MAX_BLOCKS, torch.device("cpu")), BLOCK_SIZE, torch.device("cpu"))
    new = [
        NewRequestData(rid, list(range(10, 10 + n)), [], SamplingParams(), block_ids, 0)
        for rid, (n, block_ids) in requests.items()
    ]
    output = SchedulerOutput(new_requests=new, num_scheduled_tokens={rid: n for rid, (n, _) in requests.items()})
    states.apply(output)
    return preparer, output


def test_graph_step_block_table_holds_the_used_columns():
    preparer, output = preparer_with({"a": (9, [7, 3, 5]), "b": (4, [11])})
    preparer.buffers.graph_block_table.fill_(-5)  # stale values from earlier steps
    batch = preparer.prepare(output, padded_num_reqs=4, padded_num_tokens=16)
    table = batch.attn_batch.block_table
    assert table.shape == (4, MAX_BLOCKS)
    assert table.data_ptr() == preparer.buffers.graph_block_table.data_ptr()  # the address graphs captured
    # 9 tokens need 3 blocks: 3 columns are refreshed for every real request.
    assert table[0, :3].tolist() == [7, 3, 5] and table[1, :1].tolist() == [11]
    assert table[0, 3:].eq(-5).all() and table[2:].eq(-5).all()  # never read: not touched
    assert batch.attn_batch.seq_lens.tolist() == [9, 4, 0, 0]
    assert batch.attn_batch.query_start_loc.tolist() == [0, 9, 13, 13, 13]
    assert batch.attn_batch.slot_mapping[13:].eq(-1).all()


def test_eager_step_block_table_is_as_wide_as_the_longest_request():
    preparer, output = preparer_with({"a": (9, [7, 3, 5]), "b": (4, [11])})
    table = preparer.prepare(output).attn_batch.block_table
    assert table.shape == (2, 3)
    assert table[0].tolist() == [7, 3, 5] and table[1, 0] == 11
