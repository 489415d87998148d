"""The floor's arithmetic: what a step reads and computes, per quantization
method, GGUF type, KV-cache dtype, MoE routing and attention length.

The model is built on the meta device from a config alone (no weights), as
``octavo bench`` does. Shape: hidden 128, intermediate 256, 4 heads of 32,
2 KV heads, 2 layers, vocabulary 512. Per layer the linear layers have
qkv 128 x 256, o 128 x 128, gate_up 128 x 512, down 256 x 128:
147,456 weights and 1,024 output rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from octavo.benchmarks import floor
from octavo.benchmarks.ceilings import DeviceCeilings, measure_ceilings
from octavo.benchmarks.inventory import attention_shape, measure_inventory, weight_inventory

LAYERS, HIDDEN, VOCAB = 2, 128, 512
WEIGHTS = LAYERS * 147_456
ROWS = LAYERS * 1_024
# (inputs, outputs) of each linear layer, per layer.
LINEARS = [(128, 256), (128, 128), (128, 512), (256, 128)]
CPU = torch.device("cpu")


def write_config(directory: Path, **extra) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=VOCAB, hidden_size=HIDDEN,
        intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, **extra,
    )
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def int4_bytes(group_size: int) -> int:
    """Packed 4-bit weights, a bf16 scale and a uint8 zero point per (group, output)."""
    per_layer = sum(k * n // 2 + (k // group_size) * n * (2 + 1) for k, n in LINEARS)
    return LAYERS * per_layer


CASES = {
    # name: (--quantization, quantization_config, linear bytes, matmul kind on the CPU)
    "bf16": (None, None, 2 * WEIGHTS, "bfloat16"),
    # 1-byte weights plus a float32 scale per output row.
    "fp8": ("fp8", None, WEIGHTS + 4 * ROWS, "bfloat16"),  # no fp8 matmul on the CPU: weight-only there
    "int8": ("int8", None, WEIGHTS + 4 * ROWS, "int8"),  # W8A8 through torch._int_mm
    "int8_weight_only": ("int8_weight_only", None, WEIGHTS + 4 * ROWS, "bfloat16"),
    "int4": ("int4", None, int4_bytes(128), "bfloat16"),
    "gptq": (None, {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False}, int4_bytes(64), "bfloat16"),
    "awq": (None, {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}, int4_bytes(32), "bfloat16"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_linear_bytes_per_quantization_method(name, tmp_path):
    quantization, quant_config, expected, kind = CASES[name]
    extra = {"quantization_config": quant_config} if quant_config else {}
    inventory = measure_inventory(str(write_config(tmp_path, **extra)), quantization, torch.bfloat16, torch.bfloat16, CPU)
    assert dict(inventory.linear_bytes) == {kind: expected}
    assert dict(inventory.linear_params) == {kind: WEIGHTS}
    # The LM head stays bf16 and is read whole; the embedding only by the rows looked up.
    assert (inventory.lm_head_bytes, inventory.lm_head_params) == (2 * VOCAB * HIDDEN, VOCAB * HIDDEN)
    assert inventory.embedding_row_bytes == 2 * HIDDEN
    assert inventory.other_bytes == 2 * (2 * LAYERS + 1) * HIDDEN  # the RMSNorm weights
    # A decode step at batch 1 with no context reads exactly that, plus one embedding row.
    work = floor.decode_step_work(inventory, batch=1, context=0)
    assert work.bytes == expected + 2 * VOCAB * HIDDEN + inventory.other_bytes + 2 * HIDDEN


def test_tied_embeddings_are_the_lm_head(tmp_path):
    path = write_config(tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    inventory = measure_inventory(str(path), None, torch.bfloat16, torch.bfloat16, CPU)
    assert inventory.lm_head_bytes == 2 * VOCAB * HIDDEN and inventory.other_bytes == 2 * (2 * LAYERS + 1) * HIDDEN


def test_gguf_types(tmp_path, tokenizer_dir):
    """Q8_0: 34 bytes per 32 weights; Q4_K: 144 per 256 (the K-quants need rows of 256)."""
    pytest.importorskip("gguf")
    from tests.checkpoints import build_checkpoint
    from tests.quantization.gguf_writer import GGUFVariant, write_gguf

    shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    source = build_checkpoint(tmp_path / "src", "llama", tokenizer_dir, **shape)
    types = {"attn_q.weight": "Q8_0", "attn_k.weight": "Q8_0", "attn_v.weight": "Q8_0", "attn_output.weight": "Q8_0"}
    path = write_gguf(source, tmp_path / "mixed.gguf", "llama", types, GGUFVariant(default_type="Q4_K"))
    inventory = measure_inventory(str(path), None, torch.bfloat16, torch.bfloat16, CPU)
    attention_weights = 256 * (256 + 2 * 128) + 256 * 256  # q, k, v, o (2 KV heads of 64)
    mlp_weights = 3 * 256 * 512
    expected = LAYERS * (attention_weights * 34 // 32 + mlp_weights * 144 // 256)
    assert sum(inventory.linear_bytes.values()) == expected


@pytest.mark.parametrize("kv_dtype,element", [(torch.bfloat16, 2), (torch.float32, 4), (torch.float8_e4m3fn, 1)])
def test_kv_cache_bytes_follow_its_dtype(kv_dtype, element, tmp_path):
    inventory = measure_inventory(str(write_config(tmp_path)), None, torch.bfloat16, kv_dtype, CPU)
    per_token = LAYERS * 2 * 2 * 32 * element  # layers x (K, V) x KV heads x head_dim
    assert inventory.attention.num_layers * inventory.attention.kv_bytes_per_token_layer == per_token
    weights_only = floor.decode_step_work(inventory, batch=3, context=0).bytes
    assert floor.decode_step_work(inventory, batch=3, context=100).bytes - weights_only == 3 * 100 * per_token


def test_prefill_flops_count_causal_attention_and_logit_rows(tmp_path):
    inventory = measure_inventory(str(write_config(tmp_path)), None, torch.bfloat16, torch.bfloat16, CPU)
    num_seqs, length = 3, 40
    work = floor.prefill_work(inventory, num_seqs, length)
    linear = 2 * WEIGHTS * num_seqs * length
    lm_head = 2 * VOCAB * HIDDEN * num_seqs  # one logit row per sequence
    attention = num_seqs * LAYERS * 2 * length**2 * HIDDEN  # 2 x L^2 x hidden per layer
    assert dict(work.flops) == {"bfloat16": linear + lm_head + attention}


def test_sliding_window_caps_keys_per_query():
    assert floor.causal_pairs(100, None) == 5000
    assert floor.causal_pairs(100, 200) == 5000
    assert floor.causal_pairs(100, 10) == 50 + 90 * 10


def test_llama_8b_prefill_attention_at_32k():
    """The design brief's figure: causal attention at 32k tokens on Llama-3.1-8B is 281 TFLOP."""
    config = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "llama-3.1-8b"
    inventory = measure_inventory(str(config), None, torch.bfloat16, torch.bfloat16, CPU)
    without_attention = 2 * sum(inventory.linear_params.values()) * 32768 + 2 * inventory.lm_head_params
    attention = floor.prefill_work(inventory, 1, 32768).flops["bfloat16"] - without_attention
    assert attention == pytest.approx(281e12, rel=2e-3)


class FakeExperts(nn.Module):
    """What an MoE layer shows the inventory: its routed experts and how many a token uses."""

    num_experts = 8
    num_experts_per_tok = 2

    def __init__(self) -> None:
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(8, 64, 32, dtype=torch.bfloat16, device="meta"), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(8, 32, 32, dtype=torch.bfloat16, device="meta"), requires_grad=False)


def test_moe_reads_the_experts_it_touches(tmp_path):
    from octavo.quantization.memory import build_meta_model

    model, arch = build_meta_model(str(write_config(tmp_path)), None, "bfloat16")
    model.model.layers[0].experts = FakeExperts()
    inventory = weight_inventory(model, lambda layer: "bfloat16", "bfloat16")
    inventory.attention = attention_shape(arch, torch.bfloat16)
    [group] = inventory.experts
    expert_params = 8 * (64 * 32 + 32 * 32)
    assert (group.num_experts, group.experts_per_token, group.bytes, group.matmul_params) == (8, 2, 2 * expert_params, expert_params)
    assert floor.expected_experts_touched(8, 2, 1) == pytest.approx(2)
    assert floor.expected_experts_touched(8, 2, 4) == pytest.approx(8 * (1 - 0.75**4))
    assert floor.expected_experts_touched(8, 2, 10_000) == pytest.approx(8)
    dense = floor.decode_step_work(inventory, 4, 0).bytes - 4 * inventory.embedding_row_bytes
    assert dense == pytest.approx(inventory.dense_bytes + group.bytes * (1 - 0.75**4))
    # Each token multiplies 2 of the 8 experts.
    flops = floor.prefill_work(inventory, 1, 10).flops["bfloat16"] - floor.prefill_work(inventory, 1, 0).flops["bfloat16"]
    assert flops - 2 * WEIGHTS * 10 - 2 * LAYERS * 100 * HIDDEN == pytest.approx(2 * expert_params * 2 / 8 * 10)


def test_floor_is_the_larger_of_memory_and_compute(tmp_path):
    inventory = measure_inventory(str(write_config(tmp_path)), None, torch.bfloat16, torch.bfloat16, CPU)
    ceilings = DeviceCeilings(1e9, {"bfloat16": 1e11})
    small = floor.decode_step_floor(inventory, ceilings, 1, 10)
    assert small.bound == "memory" and small.seconds == pytest.approx(small.work.bytes / 1e9)
    large = floor.prefill_floor(inventory, ceilings, 8, 1000)
    assert large.bound == "compute" and large.seconds == pytest.approx(large.work.flops["bfloat16"] / 1e11)
    text = floor.describe(inventory, ceilings)
    assert "KV cache bfloat16" in text and "only the rows looked up" in text and "2 x L^2 x 128 per layer" in text


def test_ceilings_measure_each_matmul_kind():
    ceilings = measure_ceilings(CPU, ["float32", "int8", "float32"])
    assert list(ceilings.matmul_flops_per_s) == ["float32", "int8"]
    assert ceilings.copy_bytes_per_s > 0 and min(ceilings.matmul_flops_per_s.values()) > 0


def test_bench_latency_ttft_floor_counts_linear_layers_and_attention():
    """What ``octavo bench latency`` prints as the TTFT floor of one 32k
    prompt on Llama-3.1-8B at the H200's ceilings: 2 x linear params x L
    (no embedding table) plus 281 TFLOP of causal attention over 780
    TFLOP/s, 946 ms; not the 682 ms of 2 x all params x L."""
    from octavo.benchmarks.latency import LatencyWorkload, floors

    config = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "llama-3.1-8b"
    inventory = measure_inventory(str(config), None, torch.bfloat16, torch.bfloat16, CPU)
    h200 = DeviceCeilings(4.12e12, {"bfloat16": 780e12})
    assert floors(inventory, h200, LatencyWorkload(1, 32768, 1)).ttft_s == pytest.approx(0.946, rel=5e-3)
    assert floors(inventory, h200, LatencyWorkload(1, 8192, 1)).ttft_s == pytest.approx(0.169, rel=1e-2)
