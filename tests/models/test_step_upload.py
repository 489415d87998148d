"""A step's arrays sent to the device in one copy (``runtime/step_upload.py``)
come back as themselves (dtypes, shapes, values), and an encoder's pooling
step gives the same vectors bit for bit through it."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from octavo.runtime.step_upload import upload_together

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_packed_arrays_come_back_as_themselves():
    arrays = {
        "ids": np.arange(7, dtype=np.int64),
        "bias": np.where(np.arange(12).reshape(3, 1, 1, 4) % 3 == 0, np.float32(0), np.float32(-np.inf)),
        "empty": np.zeros(0, dtype=np.int64),
        "odd": np.array([1.5, -2.0, 3.25], dtype=np.float32),
        "strided": np.arange(20, dtype=np.int64)[::3],
    }
    for device in DEVICES:
        for pack in (True, False):
            sent = upload_together(arrays, torch.device(device), pack=pack)
            assert list(sent) == list(arrays)
            for name, array in arrays.items():
                got = sent[name].cpu()
                assert got.dtype == torch.from_numpy(array[:0]).dtype and tuple(got.shape) == array.shape
                assert np.array_equal(got.numpy(), array)


@pytest.mark.parametrize("name", ["bert", "bert_cross"])  # the cross-encoder's pairs carry segment ids
def test_an_encoder_step_gives_the_same_vectors_through_one_copy(name, pooling_dirs, make_llm, monkeypatch):
    import octavo.runtime.pooling_runner as pooling_runner

    llm = make_llm(pooling_dirs(name), max_model_len=32)
    texts = ["the cat sits on the mat", "a dog", "Hello, World!", "x y z w v u t"]
    run = (lambda: llm.embed(texts)) if name == "bert" else (lambda: llm.score(texts[0], texts[1:]))
    expected = [o.outputs.raw for o in run()]
    monkeypatch.setattr(pooling_runner, "upload_together", lambda arrays, device, pack: upload_together(arrays, device, True))
    assert [o.outputs.raw for o in run()] == expected


def test_platforms_that_pack_their_uploads():
    # Real transfers into persistent device tensors pack; the CPU (no copy)
    # and XLA (fresh tensors, traced) send each array as it is.
    from octavo.platforms.cpu import CpuPlatform
    from octavo.platforms.cuda import CudaPlatform
    from octavo.platforms.tpu import TpuPlatform
    from octavo.runtime.step_upload import packs_uploads

    assert packs_uploads(CudaPlatform) and not packs_uploads(CpuPlatform) and not packs_uploads(TpuPlatform)


def test_uploads_into_a_buffer_land_at_fixed_offsets():
    # A captured graph reads its inputs at fixed addresses: the same shapes in
    # the same order land at the same offsets, whatever follows them.
    from octavo.runtime.step_upload import packed_size

    first = {"ids": np.arange(5, dtype=np.int64), "bias": np.zeros((2, 3), dtype=np.float32)}
    second = {"ids": np.arange(5, 10, dtype=np.int64), "bias": np.ones((2, 3), dtype=np.float32),
              "extra": np.arange(3, dtype=np.int64)}
    assert packed_size(first) == 40 + 24
    for device in DEVICES:
        buffer = torch.zeros(packed_size(second), dtype=torch.uint8, device=device)
        one = upload_together(first, torch.device(device), pack=True, into=buffer)
        two = upload_together(second, torch.device(device), pack=True, into=buffer)
        for name in first:
            assert one[name].data_ptr() == two[name].data_ptr()
            assert np.array_equal(one[name].cpu().numpy(), second[name])  # the views see the buffer's new contents
        assert np.array_equal(two["extra"].cpu().numpy(), second["extra"])
        with pytest.raises(ValueError, match="needs a uint8 buffer"):
            upload_together(second, torch.device(device), pack=True, into=buffer[:10])
