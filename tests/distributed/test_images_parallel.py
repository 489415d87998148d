"""Prompts with images under tensor and pipeline parallelism (two CPU
processes): the image features reach the workers as msgpack bytes, every
rank of the first stage embeds them, and the greedy tokens equal one
device's, which equal transformers' (``tests/multimodal``)."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from tests.distributed.common import engine_options
from tests.multimodal.test_llava_images import NEW_TOKENS, _hf_greedy, _prompts

pytest.importorskip("PIL.Image")


@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_images_under_parallelism_match_one_device(llava, layout):
    llm = LLM(str(llava[0]), **engine_options(**layout, max_num_batched_tokens=8, enable_prefix_caching=False))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        requests = [{"prompt_token_ids": ids, "multi_modal_data": {"image": images}} for ids, images in _prompts(llava[2])]
        expected = [_hf_greedy(llava, ids, images) for ids, images in _prompts(llava[2])]
        assert [list(o.outputs[0].token_ids) for o in llm.generate(requests, params)] == expected
    finally:
        llm.engine.shutdown()
