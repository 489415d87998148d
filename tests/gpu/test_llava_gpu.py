"""LLaVA with images on the GPU: the CPU path's greedy tokens with CUDA
graphs on (steps holding image rows run eagerly, decode steps replay
graphs) and in eager mode, float32, whole prompts and 8-token chunks."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from tests.multimodal.test_llava_images import NEW_TOKENS, _prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytest.importorskip("PIL.Image")


def test_image_prompts_on_gpu_match_the_cpu_path(llava, make_llm):
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [{"prompt_token_ids": ids, "multi_modal_data": {"image": images}} for ids, images in _prompts(llava[2])]
    expected = [list(o.outputs[0].token_ids) for o in make_llm(llava[0], platform="cpu").generate(requests, params)]
    for options in ({}, {"enforce_eager": True}, {"max_num_batched_tokens": 8}):
        llm = make_llm(llava[0], platform="cuda", **options)
        assert [list(o.outputs[0].token_ids) for o in llm.generate(requests, params)] == expected, options
