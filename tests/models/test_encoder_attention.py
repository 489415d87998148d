"""Encoder attention over the flat batch: each token attends to its own
sequence only, and the key mask SDPA gets once per step in additive form
(``key_bias``) gives bit for bit what SDPA makes of the bool mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from octavo.models.layers.encoder_attention import EncoderAttentionMetadata, encoder_attention
from octavo.ops import reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_additive_mask_gives_what_the_bool_mask_gives(device, dtype):
    torch.manual_seed(0)
    seq_lens = np.array([5, 1, 7, 3, 7])
    heads, head_size = 2, 8
    meta = EncoderAttentionMetadata.build(seq_lens, torch.device(device))
    qkv = torch.randn(int(seq_lens.sum()), 3 * heads * head_size, dtype=dtype, device=device)
    out = encoder_attention(reference.encoder_attention, qkv, heads, meta, head_size**-0.5)
    assert meta.key_bias_in(dtype) is meta.key_bias_in(dtype)  # converted once per step
    key_mask = meta.key_bias == 0  # the bool mask it stands for
    grid = qkv.index_select(0, meta.grid_index).view(len(seq_lens), seq_lens.max(), 3, heads, head_size)
    query, key, value = (grid[:, :, i].transpose(1, 2) for i in range(3))
    with_bool = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, scale=head_size**-0.5)
    cells = with_bool.transpose(1, 2).reshape(-1, heads, head_size).index_select(0, meta.token_cells)
    assert torch.equal(out, cells.reshape(out.shape))
    start = 0
    for n in seq_lens.tolist():  # and each sequence alone gives the same
        q, k, v = (qkv[start : start + n].view(n, 3, heads, head_size)[:, i].transpose(0, 1)[None] for i in range(3))
        alone = F.scaled_dot_product_attention(q, k, v, scale=head_size**-0.5)[0].transpose(0, 1).reshape(n, -1)
        torch.testing.assert_close(out[start : start + n], alone)
        start += n


def test_a_full_grid_has_no_mask():
    meta = EncoderAttentionMetadata.build(np.array([4, 4]), torch.device("cpu"))
    assert meta.key_bias is None and meta.key_bias_in(torch.bfloat16) is None


def test_padded_sequences_are_empty_in_cu_seqlens():
    # A captured step's padding sequences hold no token: a varlen kernel skips them.
    seq_lens = np.array([3, 1, 4])
    plain = EncoderAttentionMetadata.host_arrays(seq_lens)
    padded = EncoderAttentionMetadata.padded_host_arrays(seq_lens, num_seqs=5, max_seqlen=6, num_tokens=11)
    assert plain["attn_cu_seqlens"].dtype == np.int32 and list(plain["attn_cu_seqlens"]) == [0, 3, 4, 8]
    assert list(padded["attn_cu_seqlens"]) == [0, 3, 4, 8, 8, 8]
