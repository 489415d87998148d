#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== conformance: layer ops on cuda"; s=$SECONDS
timeout 150 python -c "
import tempfile, pathlib
from octavo.platforms.cuda import CudaPlatform
from octavo.testing.conformance.checks import make_context
from octavo.testing.conformance.ops import check_ops
print(check_ops(make_context(CudaPlatform(), pathlib.Path(tempfile.mkdtemp()))))" > $OUT/conformance_ops.log 2>&1; echo "rc=$? $((SECONDS-s))s"; tail -c 1500 $OUT/conformance_ops.log
echo "=== embed minilm"; s=$SECONDS
TOKENIZERS_PARALLELISM=true timeout 120 python benchmarks/embed_gpu.py --configs minilm --batch-size 256 --num-batches 32 --repeats 3 > $OUT/embed_minilm.log 2>&1; echo "$((SECONDS-s))s"; grep "^|\|floor" $OUT/embed_minilm.log
