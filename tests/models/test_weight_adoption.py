"""CPU parameters keep the checkpoint's tensors (copy-on-write views of the
mapped safetensors file) where the layout matches, instead of copying them:
the adoption rule, and that writing to an adopted parameter changes neither
the file nor another model loaded from it."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from octavo.models.loader import iterate_safetensors, safetensors_files
from octavo.models.weight_loading import fill_parameter, mark_adoptable


def test_adopts_only_whole_cpu_parameters_of_the_same_layout():
    loaded = mark_adoptable(torch.randn(4, 6))
    param = nn.Parameter(torch.empty(4, 6), requires_grad=False)
    fill_parameter(param, loaded)
    assert param.data_ptr() == loaded.data_ptr()

    for target, tensor in [
        (nn.Parameter(torch.empty(4, 6), requires_grad=False), torch.randn(4, 6)),  # not marked
        (nn.Parameter(torch.empty(4, 6, dtype=torch.float64), requires_grad=False), mark_adoptable(torch.randn(4, 6))),
        (nn.Parameter(torch.empty(6, 4), requires_grad=False), mark_adoptable(torch.randn(6, 4).t().contiguous().t())),
        (torch.empty(8, 6)[:4], mark_adoptable(torch.randn(4, 6))),  # a view of a fused parameter
    ]:
        before = target.data_ptr()
        fill_parameter(target, tensor)
        assert target.data_ptr() == before
        torch.testing.assert_close(target.data, tensor.to(target.dtype), rtol=0, atol=0)


def _mapped_from(path, address: int) -> bool:
    """Whether ``address`` lies in a mapping of the file ``path`` (Linux)."""
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return True
    return False


def test_writes_to_adopted_parameters_stay_private(llama_dir):
    from octavo.engine_args import EngineArgs, build_engine

    weights = safetensors_files(llama_dir)
    digest = [hashlib.sha256(f.read_bytes()).hexdigest() for f in weights]
    reference = dict(iterate_safetensors(weights))

    def o_proj(engine):
        model = engine.executor.worker.runner.model
        return next(p for n, p in model.named_parameters() if n.endswith("layers.0.self_attn.o_proj.weight"))

    args = EngineArgs(model=str(llama_dir), dtype="float32", max_num_seqs=2, max_model_len=64, skip_tokenizer_init=True)
    first = build_engine(args)
    try:
        weight = o_proj(first)
        assert _mapped_from(weights[0].resolve(), weight.data_ptr())  # adopted, not copied
        weight.data.add_(1.0)  # copy-on-write: the file and the page cache are untouched
        second = build_engine(args)
        try:
            name = next(n for n in reference if n.endswith("layers.0.self_attn.o_proj.weight"))
            torch.testing.assert_close(o_proj(second).data, reference[name], rtol=0, atol=0)
            torch.testing.assert_close(weight.data, reference[name] + 1.0, rtol=0, atol=0)
        finally:
            second.shutdown()
    finally:
        first.shutdown()
    assert [hashlib.sha256(f.read_bytes()).hexdigest() for f in weights] == digest
