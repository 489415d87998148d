#!/usr/bin/env bash
# Serving load on the GPU machine: start `octavo serve` on random weights at a real
# model's shapes, run benchmarks/serve_load.py at several concurrencies, print one
# table per run, and leave the JSON summaries and the server log under $OUT.
#
#   OUT=/tmp/out bash benchmarks/serve_load_gpu.sh [CONFIG_JSON] [TOKENIZER_DIR]
#
# SERVE_ARGS adds server options, e.g. SERVE_ARGS="--data-parallel-size 2" on two GPUs;
# CONCURRENCIES="64 256" picks the load levels (default 1 16 64 256).
# CONFIG_JSON defaults to benchmarks/configs/llama-3.1-8b.json. Without TOKENIZER_DIR a
# small byte-level tokenizer is built (the weights are random, so the text is noise anyway;
# only shapes and token counts matter here).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/serve-load-out}
CONFIG=${1:-benchmarks/configs/llama-3.1-8b.json}
TOKENIZER=${2:-}
PORT=${PORT:-8765}
PY=${PYTHON:-python}
mkdir -p "$OUT"
MODEL_DIR=$(mktemp -d)
cp "$CONFIG" "$MODEL_DIR/config.json"
if [ -n "$TOKENIZER" ]; then
  cp "$TOKENIZER"/* "$MODEL_DIR/"
else
  "$PY" -c "from pathlib import Path; from octavo.default_model import build_byte_bpe_tokenizer as b; b(Path('$MODEL_DIR'))"
fi
"$PY" -m octavo.entrypoints.cli.main serve "$MODEL_DIR" --load-format dummy --dtype bfloat16 \
  --max-model-len 4096 --port "$PORT" --served-model-name bench --disable-uvicorn-access-log ${SERVE_ARGS:-} \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 600); do
  if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then tail -40 "$OUT/server.log"; exit 1; fi
  sleep 1
done
for CONCURRENCY in ${CONCURRENCIES:-1 16 64 256}; do
  NUM=$(( CONCURRENCY * 4 > 32 ? CONCURRENCY * 4 : 32 ))
  "$PY" benchmarks/serve_load.py --url "http://127.0.0.1:$PORT" --concurrency "$CONCURRENCY" \
    --num-requests "$NUM" --prompt-words 256 --max-tokens 128 --json-out "$OUT/serve_load_c$CONCURRENCY.json" \
    2> "$OUT/progress_c$CONCURRENCY.log" | tee -a "$OUT/table.txt"
done
curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics.txt" || true
kill -TERM $SERVER
wait $SERVER
echo "server exit status: $?" | tee -a "$OUT/table.txt"
