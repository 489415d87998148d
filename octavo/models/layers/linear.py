"""Linear layers that know how tensor parallelism splits them.

The math is delegated to a ``LinearMethod`` (unquantized or a quantization
plugin), so every format gets fused QKV / gate-up layers and tensor
parallelism for free; methods compute through the layer ops the layer was
built with (``layer.ops``: ``linear``, ``fp8_linear``, ``int4_linear``, ...). ``weight_loader`` copies a checkpoint tensor into the
right slice of a parameter: the shard of a fused layer (``shard_id``) and
this rank's part of the split dimension, found from the parameter's
``output_dim`` / ``input_dim`` / ``packed_dim`` hints.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.distributed.parallel_state import get_tp_group, tensor_model_parallel_all_reduce
from octavo.errors import ModelLoadError
from octavo.lora.layer import ALL_SHARDS, LinearLoRA, LoRATarget, current_lora_scope
from octavo.models.weight_loading import fill_parameter, place_shard
from octavo.ops import LayerOps, current_layer_ops
from octavo.quantization.base import QuantizationConfig, UnquantizedLinearMethod


def _copy_checked(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    if param.shape != loaded.shape:
        raise ModelLoadError(f"{name}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}")
    fill_parameter(param, loaded)


def _packed(param: torch.Tensor, dim: int, size: int) -> int:
    """A logical size along ``dim`` in the parameter's storage units."""
    if getattr(param, "packed_dim", None) == dim:
        return size // param.pack_factor
    return size


class LinearBase(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        quant_config: QuantizationConfig | None,
        prefix: str,
        params_dtype: torch.dtype,
        ops: LayerOps | None = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = sum(output_sizes)
        self.prefix = prefix
        # The model's resolved layer ops; the linear method computes through them.
        self.ops = ops or current_layer_ops()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.quant_method = (
            quant_config.get_linear_method(self, prefix) if quant_config is not None else UnquantizedLinearMethod()
        )
        # Built inside a LoRA scope (``--enable-lora``): room for adapters' updates (set by ``_create``).
        self.lora: LinearLoRA | None = None

    def _create(self, input_size: int, output_partition_sizes: list[int], bias: bool, dtype: torch.dtype) -> None:
        self.output_partition_sizes = output_partition_sizes
        self.quant_method.create_weights(self, input_size, output_partition_sizes, dtype, bias)
        for param in self.parameters(recurse=False):
            # A quantization method may give a parameter its own loader (which
            # reshapes the checkpoint tensor, then usually calls this layer's).
            if getattr(param, "weight_loader", None) is None:
                param.weight_loader = self.weight_loader
        scope = current_lora_scope()
        if scope is not None:
            self.lora = scope.attach(self, self._make_lora(scope))

    def _make_lora(self, scope) -> LinearLoRA:
        """One shard, the whole layer: the module a PEFT adapter names by this layer's own name."""
        target = LoRATarget(0, self.input_size, self.output_size)
        return LinearLoRA(self, scope.inputs, [(0, 0, self.output_size)], (0, self.input_size), False, {self.prefix: target})

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """This layer's output for ``x`` (this rank's part), LoRA updates included."""
        out = self.quant_method.apply(self, x)
        if self.lora is not None:
            out = self.lora.add_update(x, out)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        _copy_checked(param, loaded, self.prefix)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size, output_size, bias=False, quant_config=None, prefix="", params_dtype=torch.float32):
        super().__init__(input_size, [output_size], bias, quant_config, prefix, params_dtype)
        self._create(input_size, [output_size], bias, params_dtype)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank keeps its slice."""

    def __init__(
        self, input_size, output_sizes: list[int], bias=False, quant_config=None, prefix="", params_dtype=torch.float32
    ):
        super().__init__(input_size, output_sizes, bias, quant_config, prefix, params_dtype)
        self.shard_sizes = self._rank_shard_sizes(output_sizes)
        self._create(input_size, self.shard_sizes, bias, params_dtype)

    def _rank_shard_sizes(self, output_sizes: list[int]) -> list[int]:
        for size in output_sizes:
            if size % self.tp_size:
                raise ModelLoadError(f"{self.prefix}: {size} output features do not split over {self.tp_size} ranks")
        return [size // self.tp_size for size in output_sizes]

    def _shard_offset_and_rank_slice(self, shard_id) -> tuple[int, int, int]:
        """(offset in this rank's param, start in the checkpoint shard, size)."""
        index = 0 if shard_id is None else int(shard_id)
        offset = sum(self.shard_sizes[:index])
        size = self.shard_sizes[index]
        return offset, self.tp_rank * size, size

    def weight_loader(self, param, loaded, shard_id=None):
        output_dim = getattr(param, "output_dim", None)
        if getattr(param, "shard_scalar", False):
            param.data[0 if shard_id is None else self._shard_index(shard_id)].copy_(loaded.reshape(()))
            return
        if output_dim is None:
            _copy_checked(param, loaded, self.prefix)
            return
        offset, start, size = self._shard_offset_and_rank_slice(shard_id)
        offset, start, size = (_packed(param, output_dim, v) for v in (offset, start, size))
        if (offset, start, size) == (0, 0, param.shape[output_dim]) and loaded.shape[output_dim] == size:
            _copy_checked(param, loaded, self.prefix)  # the whole parameter from the whole tensor
            return
        if output_dim == 0 and start == 0 and loaded.shape[0] == size and place_shard(param, loaded, offset):
            return  # the mapped file holds this shard where the fused parameter views it
        target = param.data.narrow(output_dim, offset, size)
        if loaded.shape[output_dim] < start + size:
            raise ModelLoadError(
                f"{self.prefix}: checkpoint tensor of shape {tuple(loaded.shape)} is too small along dim {output_dim}"
            )
        _copy_checked(target, loaded.narrow(output_dim, start, size), self.prefix)

    def _shard_index(self, shard_id) -> int:
        return int(shard_id)

    # The modules a PEFT adapter names for each shard of a fused layer, by the
    # fused layer's own name (None: one shard, named as the layer).
    _LORA_SHARD_NAMES = {"qkv_proj": (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")),
                         "gate_up_proj": (("gate_proj", 0), ("up_proj", 1))}

    def _make_lora(self, scope) -> LinearLoRA:
        parent, _, own = self.prefix.rpartition(".")
        shards = self._LORA_SHARD_NAMES.get(own, ((own, None),))
        out_slices, targets, wholes = [], {}, []
        for index, (name, shard_id) in enumerate(shards):
            offset, start, size = self._shard_offset_and_rank_slice(shard_id)
            out_slices.append((offset, start, size))
            wholes.append(self._whole_shard_size(shard_id))
            targets[f"{parent}.{name}" if parent else name] = LoRATarget(index, self.input_size, wholes[-1])
        if len(shards) > 1:  # checkpoints with the projections fused (Phi-3) name the fused module
            targets[self.prefix] = LoRATarget(ALL_SHARDS, self.input_size, sum(wholes), tuple(wholes))
        return LinearLoRA(self, scope.inputs, out_slices, (0, self.input_size), False, targets)

    def _whole_shard_size(self, shard_id) -> int:
        return self.shard_sizes[0 if shard_id is None else self._shard_index(shard_id)] * self.tp_size


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column layers fused along the output (gate and up projections)."""


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q, k and v projections; KV heads are replicated when there are
    fewer of them than ranks."""

    _SHARDS = {"q": 0, "k": 1, "v": 2}

    def __init__(
        self, hidden_size, head_size, num_heads, num_kv_heads, bias=False, quant_config=None, prefix="",
        params_dtype=torch.float32,
    ):
        tp_size = get_tp_group().world_size
        if num_heads % tp_size:
            raise ModelLoadError(f"{num_heads} attention heads do not split over {tp_size} ranks")
        if num_kv_heads >= tp_size and num_kv_heads % tp_size:
            raise ModelLoadError(f"{num_kv_heads} KV heads do not split over {tp_size} ranks")
        if num_kv_heads < tp_size and tp_size % num_kv_heads:
            raise ModelLoadError(
                f"{num_kv_heads} KV heads cannot be replicated evenly over {tp_size} ranks"
            )
        self.head_size = head_size
        self.total_num_kv_heads = num_kv_heads
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_replicas = max(1, tp_size // num_kv_heads)
        # Global sizes, as a rank-0 of a TP=1 run would see them.
        output_sizes = [num_heads * head_size, self.num_kv_heads * tp_size * head_size, self.num_kv_heads * tp_size * head_size]
        super().__init__(hidden_size, output_sizes, bias, quant_config, prefix, params_dtype)

    def _shard_index(self, shard_id) -> int:
        return self._SHARDS[shard_id]

    def _shard_offset_and_rank_slice(self, shard_id):
        index = self._SHARDS[shard_id]
        offset = sum(self.shard_sizes[:index])
        size = self.shard_sizes[index]
        rank = self.tp_rank if index == 0 else self.tp_rank // self.kv_replicas
        return offset, rank * size, size

    def _whole_shard_size(self, shard_id) -> int:
        if self._SHARDS[shard_id] == 0:
            return self.num_heads * self.head_size * self.tp_size
        return self.total_num_kv_heads * self.head_size


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed."""

    def __init__(
        self, input_size, output_size, bias=False, quant_config=None, prefix="", params_dtype=torch.float32,
        reduce_results: bool = True,
    ):
        super().__init__(input_size, [output_size], bias, quant_config, prefix, params_dtype)
        if input_size % self.tp_size:
            raise ModelLoadError(f"{prefix}: {input_size} input features do not split over {self.tp_size} ranks")
        self.input_size_per_partition = input_size // self.tp_size
        self.reduce_results = reduce_results
        self._create(self.input_size_per_partition, [output_size], bias, params_dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        input_dim = getattr(param, "input_dim", None)
        if input_dim is not None and self.tp_size > 1:
            size = param.shape[input_dim]
            loaded = loaded.narrow(input_dim, self.tp_rank * size, size)
        _copy_checked(param, loaded, self.prefix)

    def _make_lora(self, scope) -> LinearLoRA:
        size = self.input_size_per_partition
        target = LoRATarget(0, self.input_size, self.output_size)
        return LinearLoRA(
            self, scope.inputs, [(0, 0, self.output_size)], (self.tp_rank * size, size), True, {self.prefix: target}
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The LoRA update joins this rank's partial output before the sum over ranks.
        return self.reduced(lambda: self.product(x))

    def reduced(self, product) -> torch.Tensor:
        """``product()``, this rank's partial output (computed from this
        layer's parameters, its bias read as ``self.bias``), summed over the
        ranks with the bias added once: the layer's output. ``forward`` is
        ``reduced`` of the quantization method's product; a fused op that
        ends in this layer's matmul (``silu_and_mul_fp8_linear``) passes its own."""
        if self.tp_size == 1:
            return product()
        bias = self.bias
        # The bias is added once, after the partial sums are reduced.
        self.bias = None
        try:
            out = product()
        finally:
            self.bias = bias
        if self.reduce_results:
            out = tensor_model_parallel_all_reduce(out)
        if bias is not None:
            out = out + bias
        return out
