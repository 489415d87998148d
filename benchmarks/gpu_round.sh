#!/usr/bin/env bash
# One round of GPU checks and timings on the H200 (through the device tool).
# Usage: bash benchmarks/gpu_round.sh STEP...   (steps below; logs in $OUT)
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
O=${OUT:-/tmp/octavo-gpu}; mkdir -p "$O"
CLI="python -m octavo.entrypoints.cli.main"
M8B="--model benchmarks/configs/llama-3.1-8b --load-format dummy --dtype bfloat16"
# Model families (issue 16): MoE at bf16 (Mixtral-8x7B is ~87 GiB: its KV cache
# gets what is left of the 141 GB) and Gemma 2 (soft-capping, head size 256).
MQ3="--model benchmarks/configs/qwen3-30b-a3b --load-format dummy --dtype bfloat16"
MMX="--model benchmarks/configs/mixtral-8x7b --load-format dummy --dtype bfloat16"
MG2="--model benchmarks/configs/gemma-2-9b --load-format dummy --dtype bfloat16"
# The gate-up tiles tried at one token (narrower column tiles: more programs).
MOE_DECODE_SWEEP="16,64,128,4,4;16,32,128,4,4;16,32,256,4,4;16,16,128,4,4;16,16,256,2,4;16,32,128,2,6;16,64,256,4,3;16,32,64,4,6;16,16,512,4,3"
# HF_MODE=eager (or static) if HF's compiled mode fails on a MoE model's expert loop.
# One figure of a family: lat1 (batch-1 decode), ttft512, ttft2048, tput (512 x (256 in, 256 out)).
# Each fits one 10-minute device command; "$1" alone runs all four.
family_step() {  # $1 step prefix, $2 model flags, $3 which figure
  local hf="--compare-hf ${HF_MODE:+--hf-mode $HF_MODE}"
  case $3 in
    lat1) TAIL=20 run_step "${1}_latency_b1" 580 $CLI bench latency $2 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 $hf --output-json "$O/${1}_latency_b1.json";;
    ttft512) TAIL=20 run_step "${1}_ttft_512" 500 $CLI bench latency $2 --batch-size 1 --input-len 512 --output-len 2 --num-iters 5 $hf --output-json "$O/${1}_ttft_512.json";;
    ttft2048) TAIL=20 run_step "${1}_ttft_2048" 500 $CLI bench latency $2 --batch-size 1 --input-len 2048 --output-len 2 --num-iters 5 $hf --output-json "$O/${1}_ttft_2048.json";;
    tput) run_step "${1}_throughput" 580 $CLI bench throughput $2 --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 8192 --compare-hf --output-json "$O/${1}_throughput.json";;
    all) for which in lat1 ttft512 ttft2048 tput; do family_step "$1" "$2" "$which"; done;;
    *) echo "unknown figure $3 (lat1, ttft512, ttft2048, tput)";;
  esac
}
# A step's engine process can outlive its command by seconds while it frees
# its memory (seen after a compiled-HF run: the next step ran out of memory):
# wait until no process holds the GPU, for at most a minute.
wait_gpu_idle() {
  command -v nvidia-smi > /dev/null || return 0
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && return 0; sleep 1
  done
  echo "GPU still in use by: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
}
# Other libraries' wheels (.whl_libs/: fbgemm-gpu-genai, gemlite) into /tmp/site_libs.
install_libs() {
  python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_libs .whl_libs/*.whl > /dev/null 2>&1
}
# sentence-transformers and what it imports, from .whl_st/ (or .whl/): the embeddings' baseline.
install_sentence_transformers() {
  python -c "import sentence_transformers" 2>/dev/null && return 0  # already on the path (PYTHONPATH=/tmp/site)
  pip install -q --no-deps --no-index --find-links .whl --find-links .whl_st sentence-transformers scikit-learn scipy \
    joblib threadpoolctl narwhals >/dev/null 2>&1 || echo "no sentence-transformers wheels: the baseline is hf-automodel"
}
# A number per run of a step's A/B loop (1, 2, ...), so that each run keeps its own log and JSON.
TURN_FILE=$(mktemp)
turn() {
  local n=$(( $(cat "$TURN_FILE" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$TURN_FILE"; echo "$n"
}
# Batch-1 decode (128 in / 128 out, bench latency) in turns, A B A B on one machine: $1 a label, $2 the
# model's flags, $3 and $4 the two arms' environment (VAR=VALUE, or "" for the defaults); each run keeps
# its own log and JSON, named by the label, the arm and the turn.
b1_turns() {
  local label=$1 model=$2 arm tag n
  for arm in "$3" "$4" "$3" "$4"; do
    tag=${arm:-default}; tag=${tag//[=,]/_}; n=$(turn)
    TAIL=6 run_step "${label}_b1_${tag}_$n" 300 env $arm $CLI bench latency $model \
      --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/${label}_b1_${tag}_$n.json"
  done
}
run_step() {
  local name=$1 limit=$2; shift 2
  wait_gpu_idle; echo "=== $name"; local start=$SECONDS
  timeout "$limit" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "rc=$rc $((SECONDS - start))s"; grep -v -E "it/s\]|run/s\]|prompt/s\]|request/s\]|s/it\]|s/run\]" "$O/$name.log" | tail -n "${TAIL:-14}"
}
for step in "$@"; do
  case $step in
    info) nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)";;
    env) run_step env 60 $CLI env;;
    conformance) run_step conformance 300 $CLI plugins check cuda;;
    # The layer ops alone: every CUDA implementation against its reference on the kit's grid.
    conformance_ops) TAIL=6 run_step conformance_ops 200 $CLI plugins check cuda --only ops;;
    parity) run_step gpu_parity 400 python -m pytest -q -x -p no:cacheprovider tests/gpu --ignore tests/gpu/test_async_scheduling_gpu.py --ignore tests/gpu/test_long_context_gpu.py;;  # those two: step async_parity
    kernels) run_step kernel_tests 400 python -m pytest -q --maxfail=10 -p no:cacheprovider tests/kernels -m gpu
             run_step gemv_tests 300 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_gemv.py;;
    gemv) TAIL=60 run_step gemv_sweep 400 python benchmarks/gemv_gpu_sweep.py --env-file /tmp/octavo-gemv.env;;
    # Batch-1 decode with gemv's winners beside the defaults, same run (and HF compiled beside both).
    lat1_gemv_tuned) echo "tuned: $(cat /tmp/octavo-gemv.env 2>/dev/null | tr '\n' ' ')"
                     TAIL=20 run_step latency_b1_gemv_tuned 400 env $(cat /tmp/octavo-gemv.env 2>/dev/null) $CLI bench latency $M8B --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/latency_b1_gemv_tuned.json";;
    sweep) TAIL=60 run_step kernels_sweep 300 python benchmarks/kernels_gpu.py --only sweep;;
    kernels_bench) run_step kernels_bench 400 python benchmarks/kernels_gpu.py;;
    # --compare-hf: HF's default mode here is "compiled" (static cache + torch.compile,
    # warmed up; the run fails if HF compiles inside the timed region).
    lat1) TAIL=20 run_step latency_b1 560 $CLI bench latency $M8B --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --compare-hf --output-json "$O/latency_b1.json";;
    lat1_hf_eager) TAIL=20 run_step latency_b1_hf_eager 400 $CLI bench latency $M8B --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --compare-hf --hf-mode eager --output-json "$O/latency_b1_hf_eager.json";;
    # The cross-check: a hand-written HF static-cache + torch.compile decode loop (ms/token).
    hf_compiled_check) run_step hf_compiled_check 500 python benchmarks/hf_compiled_loop.py --batch-size 1 --input-len 128 --output-len 128 --output-json "$O/hf_compiled_check.json";;
    # Programmatic dependent launch (octavo/kernels/pdl.py; on by default since round 29): its GPU
    # parity test, then batch-1 decode without (OCTAVO_PDL=0) and with it, back to back
    # (Llama-3.1-8B shapes, and decode at 8k context).
    pdl) run_step pdl_parity 300 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu_parity.py -k dependent_launch
         for v in 0 1; do
           OCTAVO_PDL=$v TAIL=8 run_step latency_b1_pdl$v 400 $CLI bench latency $M8B --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/latency_b1_pdl$v.json"
           OCTAVO_PDL=$v TAIL=8 run_step latency_8k_pdl$v 400 $CLI bench latency $M8B --batch-size 1 --input-len 8192 --output-len 64 --num-iters 2 --output-json "$O/latency_8k_pdl$v.json"
         done;;
    # The same A/B for the families with the most kernels a step: Qwen3-30B-A3B (48 MoE layers), Gemma-2-9B.
    pdl_families) for v in 0 1; do
           OCTAVO_PDL=$v TAIL=8 run_step qwen3moe_b1_pdl$v 500 $CLI bench latency $MQ3 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/qwen3moe_b1_pdl$v.json"
           OCTAVO_PDL=$v TAIL=8 run_step gemma2_b1_pdl$v 400 $CLI bench latency $MG2 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/gemma2_b1_pdl$v.json"
         done;;
    lat1_cublas) OCTAVO_GEMV_MAX_TOKENS=0 run_step latency_b1_cublas 400 $CLI bench latency $M8B --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/latency_b1_cublas.json";;
    lat1_env) run_step "latency_b1_${LABEL:-env}" 400 $CLI bench latency $M8B --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/latency_b1_${LABEL:-env}.json";;
    lat1_direct) OCTAVO_SPLIT_MIN_SEQ_LEN=1000000 run_step latency_b1_direct 400 $CLI bench latency $M8B --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/latency_b1_direct.json";;
    ttft512) TAIL=20 run_step ttft_512 500 $CLI bench latency $M8B --batch-size 1 --input-len 512 --output-len 2 --num-iters 5 --compare-hf --output-json "$O/ttft_512.json";;
    ttft2048) TAIL=20 run_step ttft_2048 500 $CLI bench latency $M8B --batch-size 1 --input-len 2048 --output-len 2 --num-iters 5 --compare-hf --output-json "$O/ttft_2048.json";;
    tput) run_step throughput 500 $CLI bench throughput $M8B --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 8192 --output-json "$O/throughput.json";;
    tput_hf) run_step throughput_hf 580 $CLI bench throughput $M8B --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 8192 --compare-hf --output-json "$O/throughput_hf.json";;
    profile) TAIL=40 run_step profile_graphs 300 python benchmarks/profile_step.py $M8B --batch-size 1 --input-len 512 --decode-steps 32;;
    profile_eager) TAIL=80 run_step profile_eager 300 python benchmarks/profile_step.py $M8B --batch-size 1 --input-len 512 --decode-steps 8 --enforce-eager --kernels;;
    profile512) TAIL=40 run_step profile_b512 300 python benchmarks/profile_step.py $M8B --batch-size 512 --input-len 256 --decode-steps 16;;
    # Issue 26: what is left of the host's work per 512-stream decode step with overlap and with async scheduling.
    profile512_host) TAIL=30 run_step profile_b512_overlap 300 python benchmarks/profile_step.py $M8B --batch-size 512 --input-len 256 --decode-steps 16 --overlap-decode
                     TAIL=30 run_step profile_b512_async 300 python benchmarks/profile_step.py $M8B --batch-size 512 --input-len 256 --decode-steps 16 --async-scheduling;;
    profile512_eager) TAIL=70 run_step profile_b512_eager 300 python benchmarks/profile_step.py $M8B --batch-size 512 --input-len 256 --decode-steps 4 --enforce-eager --kernels;;
    # Qwen3-30B-A3B's decode step kernel by kernel (48 MoE layers): where its 2x of the floor goes (issue 16).
    # The norms inside the decode GEMVs (kernels/norm_gemv.py): the kernel tests on the GPU, then
    # batch-1 decode with the fused ops on and forced to their composition, in turns, same machine.
    norm_gemv_check) TAIL=4 run_step norm_gemv_tests 300 python -m pytest -q -p no:cacheprovider \
                       tests/kernels/test_norm_gemv.py tests/kernels/test_norm_gemv_path.py;;
    norm_gemv_ab) b1_turns qwen3moe "$MQ3" OCTAVO_NORM_GEMV=1 OCTAVO_NORM_GEMV=0;;
    norm_gemv_profile) for on in 1 0; do
                         TAIL=40 run_step "profile_qwen3moe_norm$on" 300 env OCTAVO_NORM_GEMV=$on python benchmarks/profile_step.py \
                           $MQ3 --batch-size 1 --input-len 128 --decode-steps 8 --enforce-eager --kernels
                       done;;
    norm_gemv_ab_8b) b1_turns llama8b "$M8B" OCTAVO_NORM_GEMV=1 OCTAVO_NORM_GEMV=0;;
    profile_qwen3moe) TAIL=60 run_step profile_qwen3moe_eager 300 python benchmarks/profile_step.py $MQ3 --batch-size 1 --input-len 128 --decode-steps 8 --enforce-eager --kernels;;
    # One layer's kernels in the order the captured decode graph runs them, with the gaps between them.
    # A 512-stream Qwen3-MoE decode step's kernels (issue 16's throughput: the grouped MoE GEMMs, the
    # alignment, the sum, attention), graphs as the throughput run takes them; PROFILE_BATCH=256 on an
    # H100 (its 80 GB hold the weights and fewer sequences' KV).
    profile_qwen3moe_tput) TAIL=40 run_step profile_qwen3moe_tput 400 python benchmarks/profile_step.py $MQ3 \
                             --batch-size ${PROFILE_BATCH:-512} --input-len 256 --decode-steps 4 --kernels;;
    profile_qwen3moe_graphs) TAIL=40 run_step profile_qwen3moe_graphs 300 python benchmarks/profile_step.py $MQ3 --batch-size 1 --input-len 128 --decode-steps 8 --kernels --kernel-sequence 24;;
    # The same with split-KV attention and its merge, as bench latency's graphs (captured for a long max_model_len) run it.
    profile_qwen3moe_graphs_split) OCTAVO_SPLIT_MIN_SEQ_LEN=1 TAIL=28 run_step profile_qwen3moe_graphs_split 300 python benchmarks/profile_step.py \
                                     $MQ3 --batch-size 1 --input-len 128 --decode-steps 8 --kernels --kernel-sequence 26;;
    profile2048) TAIL=40 run_step profile_2048 300 python benchmarks/profile_step.py $M8B --batch-size 1 --input-len 2048 --decode-steps 4;;
    profile2048_eager) TAIL=40 run_step profile_2048_eager 300 python benchmarks/profile_step.py $M8B --batch-size 1 --input-len 2048 --decode-steps 2 --enforce-eager --kernels;;
    # TTFT at 8k/32k/128k and batch-1 decode at 8k/32k beside the floor (attention FLOPs
    # included) and torch SDPA flash on the same attention shapes (benchmarks/long_context.py).
    longctx) TAIL=24 run_step long_context 600 python benchmarks/long_context.py $M8B --ttft-lens ${LONG_TTFT:-8192,32768,131072} --output-json "$O/long_context.json";;
    # Attention tiles at long context (8k prompt, the last 16k chunk of 32k, decode at 32k), then
    # the long-context table with the winners (issue 26); the env file carries them between the two.
    # LONG_TTFT=8192,32768 leaves out the 128k prompt (two minutes of a ten-minute call).
    sweep_long) TAIL=30 run_step kernels_sweep_long 450 python benchmarks/kernels_gpu.py --only sweep_long --env-file /tmp/octavo-long.env;;
    longctx_tuned) echo "tuned: $(cat /tmp/octavo-long.env /tmp/octavo-gemv.env 2>/dev/null | tr '\n' ' ')"
                   TAIL=24 run_step long_context_tuned 600 env $(cat /tmp/octavo-long.env /tmp/octavo-gemv.env 2>/dev/null) python benchmarks/long_context.py $M8B --ttft-lens ${LONG_TTFT:-8192,32768,131072} --output-json "$O/long_context_tuned.json";;
    # The long-context table with sweep_long's winners, the prompt's own K/V read through the
    # block table (0) and contiguously (1: OCTAVO_PREFILL_FRESH_KV), 8k and 32k only.
    longctx_fresh_ab) for fresh in 0 1; do
                        TAIL=10 run_step "long_context_fresh$fresh" 300 env $(cat /tmp/octavo-long.env 2>/dev/null) OCTAVO_PREFILL_FRESH_KV=$fresh \
                          python benchmarks/long_context.py $M8B --ttft-lens 8192,32768 --output-json "$O/long_context_fresh$fresh.json"
                      done;;
    # Long-prompt attention: the paged kernel (block table, contiguous) beside torch SDPA's flash, cuDNN
    # and memory-efficient backends on the same causal shapes (measure what exists first).
    prefill_backends) TAIL=30 run_step prefill_backends 300 python benchmarks/prefill_backends.py;;
    # One long prompt's attention through torch's fused kernels (cuDNN first): the backend's GPU test,
    # then the long-context table with triton_paged and with triton_sdpa_prefill (same run, same floors).
    sdpa_prefill) run_step sdpa_prefill_test 200 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_sdpa_prefill_gpu.py
                  for backend in triton_paged triton_sdpa_prefill; do
                    TAIL=10 run_step "long_context_$backend" 300 env OCTAVO_ATTENTION_BACKEND=cuda:$backend \
                      python benchmarks/long_context.py $M8B --ttft-lens ${LONG_TTFT:-8192,32768} --output-json "$O/long_context_$backend.json"
                  done;;
    longctx_async) TAIL=24 run_step long_context_async 600 python benchmarks/long_context.py $M8B --async-scheduling --output-json "$O/long_context_async.json";;
    # Async scheduling on the throughput workload (the issue's 512 x 256/256) and a long-context GPU parity test.
    # LoRA: the base model, LoRA on with no adapter, 4 rank-16 adapters round robin (8B shapes).
    lora) TAIL=24 run_step lora_overhead 560 python benchmarks/lora_gpu.py --model benchmarks/configs/llama-3.1-8b;;
    spec) TAIL=24 run_step spec_decode 560 python benchmarks/spec_decode_gpu.py --model benchmarks/configs/llama-3.1-8b;;
    spec_parity) run_step spec_parity 300 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_speculative_gpu.py;;
    tput_async) run_step throughput_async 500 $CLI bench throughput $M8B --async-scheduling --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 8192 --output-json "$O/throughput_async.json";;
    lat1_async) TAIL=20 run_step latency_b1_async 400 $CLI bench latency $M8B --async-scheduling --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/latency_b1_async.json";;
    async_parity) run_step async_parity 400 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_async_scheduling_gpu.py tests/gpu/test_long_context_gpu.py;;
    tput16k) run_step throughput_16k 500 $CLI bench throughput $M8B --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$O/throughput_16k.json";;
    fp8) run_step fp8_latency 300 $CLI bench latency $M8B --quantization fp8 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/fp8_latency.json"
         run_step fp8_throughput 400 $CLI bench throughput $M8B --quantization fp8 --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$O/fp8_throughput.json";;
    int4) run_step int4_latency 300 $CLI bench latency $M8B --quantization int4 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --output-json "$O/int4_latency.json"
          run_step int4_throughput 400 $CLI bench throughput $M8B --quantization int4 --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$O/int4_throughput.json";;
    # Issue 17. quant: every quantized GEMM path at 8B layer shapes beside bf16 cuBLAS and its
    # floor (checks first); quant_sweep: tile sweeps; quant_lat / quant_tput: bf16, fp8, int4
    # end to end in one run with each one's floor; gguf: writes a Q4_K file (needs the gguf
    # wheel) and times it beside bf16; kvfp8: bf16 vs fp8 KV cache at 32k context.
    quant) TAIL=150 run_step quant_gpu 500 python benchmarks/quant_gpu.py --quick;;
    quant_full) TAIL=250 run_step quant_gpu_full 590 python benchmarks/quant_gpu.py;;
    quant_sweep) TAIL=80 run_step quant_sweep 450 python benchmarks/quant_sweep_gpu.py;;
    quant_lat) TAIL=12 run_step quant_latency 560 python benchmarks/quant_e2e.py latency --output-json "$O/quant_latency.json";;
    # quant_tuned: the one-token GEMVs of int4, fp8 and GGUF Q4_K / Q6_K swept; the winners go to
    # /tmp/octavo-tuned.env (kept while the machine stays warm; also printed, for a later call).
    # quant_tuned_lat / gguf_tuned: batch-1 decode end to end (bf16, fp8, int4 or the Q4_K file, with
    # their floors, in the same run) with them set (OCTAVO_INT4_GEMV_TILES, OCTAVO_GEMV_8BIT,
    # OCTAVO_GGUF_GEMV_TILES_<TYPE>).
    # The one-token int4 GEMV (int4_gemv_rows): its tiles at 1 token, then int4 batch-1 decode with it off and on.
    # Round 34's one-token GEMVs (int4 rows in bfloat16 pairs, fp8 with shared activations, Q4_K in
    # pairs) swept against the forms they replace, then batch-1 decode with the winners beside bf16.
    # The alternatives end to end after, same machine (round 35 made fp8's rows form opt-in: fp8 rows on,
    # int4 rows in float32).
    one_token) bash "$0" one_token_sweep one_token_lat;;
    one_token_sweep) TAIL=40 run_step one_token_sweep 300 python benchmarks/quant_sweep_gpu.py --tokens 1 --env-file /tmp/octavo-one-token.env \
                 --only int4:gemv_rows,int4:torch_int4pack_mm,fp8:gemv_rows,gguf_Q4_K:gemv_pairs
               cp /tmp/octavo-one-token.env "$O/" 2>/dev/null;;
    # Round 40: the one-token GEMVs with their loads pipelined (Triton's tl.range stages, or the int4
    # kernel's own prefetch) and the new Q6_K pairs GEMV (the Q4_K file's LM head) ranked beside the
    # current tiles, then batch-1 decode with the winners
    # and with the defaults (bf16 and the floors in the same runs), and the Q4_K file with the winner.
    # Round 41: each one-token GEMV shape by shape (16 launches a graph, own weights each), beside an empty launch.
    gemv_shapes) TAIL=40 run_step gemv_shapes 300 python benchmarks/gemv_shapes_gpu.py;;
    # Round 41: the int4 tensor-core kernel with its tile in bfloat16 pairs: checked against the reference on
    # the GPU (tc_mm_pairs among quant_gpu's int4 paths), then swept beside the float32 tile at 1-256 tokens.
    int4_pairs) TAIL=12 run_step int4_pairs_check 300 python benchmarks/quant_gpu.py --quick --skip-timings --families int4
                TAIL=30 run_step int4_pairs_sweep 420 python benchmarks/quant_sweep_gpu.py --only int4:tc_mm --tokens 1,16,64,256;;
    gemv_shapes_int4) TAIL=8 run_step gemv_shapes_int4 300 python benchmarks/gemv_shapes_gpu.py --sweep-int4 --copies 8;;
    pipelined) TAIL=45 run_step pipelined_sweep 420 python benchmarks/quant_sweep_gpu.py --tokens 1 \
                 --env-file /tmp/octavo-pipelined.env --only int4:gemv_rows,fp8:gemv,gguf_Q4_K:gemv_pairs,gguf_Q6_K:gemv_pairs
               cp /tmp/octavo-pipelined.env "$O/" 2>/dev/null;;
    pipelined_lat) echo "tuned: $(cat /tmp/octavo-pipelined.env 2>/dev/null | tr '\n' ' ')"
                   TAIL=6 run_step pipelined_latency 400 env $(cat /tmp/octavo-pipelined.env 2>/dev/null) \
                     python benchmarks/quant_e2e.py latency --methods bf16,fp8,int4 --output-json "$O/pipelined_latency.json"
                   TAIL=6 run_step default_latency 400 python benchmarks/quant_e2e.py latency --methods bf16,fp8,int4 \
                     --output-json "$O/default_latency.json";;
    pipelined_gguf) GG=${GGUF_DIR:-/tmp/octavo-gguf}/llama-3.1-8b-q4k.gguf
                    [ -f "$GG" ] || run_step gguf_write 400 python benchmarks/make_gguf_8b.py "$GG"
                    TAIL=6 run_step gguf_pipelined_latency 400 env $(cat /tmp/octavo-pipelined.env 2>/dev/null) \
                      python benchmarks/quant_e2e.py latency --methods bf16 --gguf "$GG" --output-json "$O/gguf_pipelined.json";;
    # Where the Q4_K file's decode step goes, kernel by kernel (its LM head is Q6_K: 431 MB a token).
    profile_gguf) GG=${GGUF_DIR:-/tmp/octavo-gguf}/llama-3.1-8b-q4k.gguf
                  [ -f "$GG" ] || run_step gguf_write 400 python benchmarks/make_gguf_8b.py "$GG"
                  TAIL=40 run_step profile_gguf 300 python benchmarks/profile_step.py --model "$GG" --load-format gguf \
                    --batch-size 1 --input-len 128 --decode-steps 8 --kernels;;
    one_token_lat) echo "tuned: $(cat /tmp/octavo-one-token.env 2>/dev/null | tr '\n' ' ')"
               TAIL=6 run_step one_token_latency 400 env $(cat /tmp/octavo-one-token.env 2>/dev/null) \
                 python benchmarks/quant_e2e.py latency --methods bf16,fp8,int4 --output-json "$O/one_token_latency.json"
               TAIL=4 run_step one_token_latency_alt 300 env OCTAVO_FP8_GEMV_ROWS=1 OCTAVO_INT4_GEMV_ROWS_TILES=8,8,8,0 \
                 python benchmarks/quant_e2e.py latency --methods fp8,int4 --output-json "$O/one_token_latency_old.json";;
    # The checks of quant_gpu.py (every path against its dequantized reference at 1, 7, 300 tokens) and
    # its per-layer table for the formats with round 34's kernels (inline PTX: first run on a GPU).
    quant_new) TAIL=90 run_step quant_gpu_new 240 python benchmarks/quant_gpu.py --quick --families int4,fp8,gguf_Q4_K;;
    # Both W4A8 GEMVs at once: checked against their dequantized weights, then shape by shape in a
    # decode graph beside the GEMVs they would replace and the copy bandwidth.
    dp4a_check) TAIL=24 run_step dp4a_check 240 python benchmarks/quant_gpu.py --quick --skip-timings --families int4,gguf_Q4_K;;
    dp4a_shapes) TAIL=16 run_step dp4a_shapes 300 python benchmarks/gemv_shapes_gpu.py --copies 8 \
                   --paths bf16:gemv,int4:gemv_rows,int4:gemv_dp4a,gguf_Q4_K:gemv_pairs,gguf_Q4_K:gemv_dp4a;;
    # The int4 words read alone at the GEMVs' tiles and others (read_probe.py), beside the GEMVs:
    # whether the one-token int4 GEMV loses its time in its reads' tiling or in its arithmetic.
    read_probe) TAIL=40 run_step read_probe 300 python benchmarks/gemv_shapes_gpu.py --copies 8 \
                  --paths bf16:gemv,int4:gemv_rows,int4:gemv_dp4a,probe:read_4_16_4,probe:read_8_16_8,probe:read_2_16_4,probe:read_4_32_8,probe:read_16_16_8,probe:read_8_8_4,probe:read_32_4_4;;
    # The W4A8 GEMVs' tiles swept (after dp4a_check), the best of both into /tmp/octavo-dp4a.env; then
    # batch-1 decode with each (beside bf16 and the floor) and without: int4, and the Q4_K file.
    dp4a_sweep) TAIL=16 run_step dp4a_sweep 400 python benchmarks/quant_sweep_gpu.py --only int4:gemv_dp4a,gguf_Q4_K:gemv_dp4a \
                  --tokens 1 --env-file /tmp/octavo-dp4a.env;;
    int4_dp4a_b1) DP4A_ENV=$(cat /tmp/octavo-dp4a.env 2>/dev/null); echo "tuned: $DP4A_ENV"
                  TAIL=8 run_step int4_dp4a_latency 500 env OCTAVO_INT4_GEMV_DP4A=1 $DP4A_ENV \
                    python benchmarks/quant_e2e.py latency --methods bf16,int4 --output-json "$O/int4_dp4a_latency.json"
                  TAIL=6 run_step int4_rows_latency 400 env OCTAVO_INT4_GEMV_DP4A=0 \
                    python benchmarks/quant_e2e.py latency --methods int4 --output-json "$O/int4_rows_latency.json";;
    gguf_dp4a_b1) GG=${GGUF_DIR:-/tmp/octavo-gguf}/llama-3.1-8b-q4k.gguf
                  [ -f "$GG" ] || run_step gguf_write 400 python benchmarks/make_gguf_8b.py "$GG"
                  DP4A_ENV=$(cat /tmp/octavo-dp4a.env 2>/dev/null); echo "tuned: $DP4A_ENV"
                  TAIL=8 run_step gguf_dp4a_latency 500 env OCTAVO_GGUF_Q4K_DP4A=1 $DP4A_ENV python benchmarks/quant_e2e.py \
                    latency --methods bf16 --gguf "$GG" --output-json "$O/gguf_dp4a_latency.json"
                  TAIL=6 run_step gguf_pairs_latency 400 env OCTAVO_GGUF_Q4K_DP4A=0 python benchmarks/quant_e2e.py \
                    latency --methods "" --gguf "$GG" --output-json "$O/gguf_pairs_latency.json";;
    int4_rows) TAIL=12 run_step int4_rows_sweep 300 python benchmarks/quant_sweep_gpu.py --only int4:gemv_rows --tokens 1
               for rows in 0 1; do
                 OCTAVO_INT4_GEMV_ROWS=$rows TAIL=3 run_step "int4_latency_rows$rows" 300 python benchmarks/quant_e2e.py latency --methods int4
               done;;
    quant_tuned) TAIL=40 run_step quant_tuned_sweep 450 python benchmarks/quant_sweep_gpu.py --only int4:gemv,fp8:gemv,gguf_Q4_K:gemv,gguf_Q6_K:gemv --tokens 1 --env-file /tmp/octavo-tuned.env
                 cp /tmp/octavo-tuned.env "$O/" 2>/dev/null;;
    quant_tuned_lat) echo "tuned: $(cat /tmp/octavo-tuned.env 2>/dev/null | tr '\n' ' ')"
                     TAIL=12 run_step quant_tuned_latency 560 env $(cat /tmp/octavo-tuned.env 2>/dev/null) python benchmarks/quant_e2e.py latency --output-json "$O/quant_tuned_latency.json";;
    quant_tput) TAIL=12 run_step quant_throughput 590 python benchmarks/quant_e2e.py throughput --output-json "$O/quant_throughput.json";;
    gguf) GG=${GGUF_DIR:-/tmp/octavo-gguf}/llama-3.1-8b-q4k.gguf
          [ -f "$GG" ] || run_step gguf_write 400 python benchmarks/make_gguf_8b.py "$GG"
          TAIL=10 run_step gguf_latency 500 python benchmarks/quant_e2e.py latency --methods bf16 --gguf "$GG" --output-json "$O/gguf_latency.json";;
    gguf_tuned) GG=${GGUF_DIR:-/tmp/octavo-gguf}/llama-3.1-8b-q4k.gguf  # with quant_tuned's GEMV tiles
          [ -f "$GG" ] || run_step gguf_write 400 python benchmarks/make_gguf_8b.py "$GG"
          TAIL=10 run_step gguf_tuned_latency 500 env $(cat /tmp/octavo-tuned.env 2>/dev/null) python benchmarks/quant_e2e.py latency --methods bf16 --gguf "$GG" --output-json "$O/gguf_tuned_latency.json";;
    # Other libraries' quantized GEMMs beside Octavo's on the same weights, same run
    # (benchmarks/quant_libraries.py: fbgemm-gpu-genai, gemlite), their wheels carried in .whl_libs/.
    libs) install_libs
          TAIL=150 PYTHONPATH=/tmp/site_libs:$PYTHONPATH run_step quant_libs 560 python benchmarks/quant_gpu.py --quick --families int4,fp8;;
    # int4 through fbgemm-gpu-genai's layout (octavo[fbgemm], wheel in .whl_libs/): its GPU test, then
    # int4 end to end (throughput, batch-1 decode) beside bf16, with and without it, same run.
    int4_fbgemm) install_libs
          PYTHONPATH=/tmp/site_libs:$PYTHONPATH run_step int4_fbgemm_parity 200 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu_parity.py -k fbgemm
          TAIL=6 PYTHONPATH=/tmp/site_libs:$PYTHONPATH run_step int4_fbgemm_tput 580 python benchmarks/quant_e2e.py throughput --methods bf16,int4 --output-json "$O/int4_fbgemm_tput.json"
          TAIL=6 run_step int4_triton_tput 300 python benchmarks/quant_e2e.py throughput --methods int4 --output-json "$O/int4_triton_tput.json";;
    # skinny: the 8-bit tensor-core skinny kernel (skinny_8bit.py) swept at 1 and 16 tokens beside the
    # fp8 GEMV and int4's tensor-core kernel; then fp8 batch-1 decode with the GEMV (default) and with
    # every fp8 matmul W8A8, decode on the skinny kernel with the swept tiles (same warm machine).
    skinny) TAIL=60 run_step skinny_sweep 450 python benchmarks/quant_sweep_gpu.py --only ${SKINNY_ONLY:-fp8:gemv,fp8:skinny,fp8:skinny_w8a8,int4:tc_mm} --tokens ${SKINNY_TOKENS:-1,16} --env-file /tmp/octavo-skinny.env
            cp /tmp/octavo-skinny.env "$O/" 2>/dev/null
            TAIL=6 run_step fp8_latency_gemv 200 python benchmarks/quant_e2e.py latency --methods bf16,fp8 --output-json "$O/fp8_latency_gemv.json"
            TAIL=6 run_step fp8_latency_skinny 200 env $(grep SKINNY /tmp/octavo-skinny.env 2>/dev/null) OCTAVO_QUANT_GEMV_MAX_TOKENS=0 OCTAVO_FP8_SKINNY_MAX_TOKENS=16 \
              python benchmarks/quant_e2e.py latency --methods bf16,fp8 --output-json "$O/fp8_latency_skinny.json"
            TAIL=6 run_step int4_latency_tc 200 env $(grep INT4_MM /tmp/octavo-skinny.env 2>/dev/null) OCTAVO_INT4_GEMV_MAX_TOKENS=0 \
              python benchmarks/quant_e2e.py latency --methods int4 --output-json "$O/int4_latency_tc.json";;
    kvfp8) TAIL=10 run_step kv_fp8 560 python benchmarks/quant_e2e.py kv --context 32768 --num-iters 2 --output-json "$O/kv_fp8.json";;
    # kvfp8_sweep: batch-1 split-KV decode at 8k and 32k over bf16 and fp8 caches, tiles and split
    # counts swept (benchmarks/kv_decode_sweep.py); the best tiles at 32k go to /tmp/octavo-kvfp8.env,
    # which kvfp8_tuned runs the kvfp8 figures under (same warm machine). kvfp8_tests: the fp8 KV
    # kernel and backend tests (fresh K/V prefill, fp8 decode tiles) on the GPU.
    kvfp8_tests) run_step kvfp8_tests 400 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_fp8_kv_kernels.py tests/kernels/test_triton_backend.py;;
    kvfp8_sweep) TAIL=40 run_step kv_decode_sweep 580 python benchmarks/kv_decode_sweep.py --env-file /tmp/octavo-kvfp8.env;;
    kvfp8_tuned) TAIL=10 run_step kv_fp8_tuned 560 env $(cat /tmp/octavo-kvfp8.env 2>/dev/null) python benchmarks/quant_e2e.py kv --context 32768 --num-iters 2 --output-json "$O/kv_fp8_tuned.json";;
    startup) mkdir -p "$O/byte-tokenizer"  # the config directory has no tokenizer; the weights are random anyway
             python -c "from pathlib import Path; from octavo.default_model import build_byte_bpe_tokenizer as b; b(Path('$O/byte-tokenizer'))"
             TAIL=24 run_step startup_serve 600 python benchmarks/startup.py serve benchmarks/configs/llama-3.1-8b --tokenizer "$O/byte-tokenizer" --load-format dummy --dtype bfloat16 --baseline --log "$O/startup_server.log" --output-json "$O/startup.json";;
    structured) run_step structured 500 python benchmarks/structured_gpu.py ${TOKENIZER:+--tokenizer "$TOKENIZER"} --json-out "$O/structured.json";;
    # CPU compiled decode (issue 23) on this host's CPU, pinned to 2 cores as on the dev machine:
    # a 135M Llama in float32, eager vs OCTAVO_CPU_COMPILE=1 (inductor), HF eager, and the floor.
    # CPU_LEN="IN OUT ITERS" shrinks it; CPU_COMPILE_BACKEND=eager traces without inductor (the smoke run:
    # CPU_LEN="16 8 1" CPU_COMPILE_BACKEND=eager). Batch 1 only, so one graph is compiled at start.
    cpu_compile) set -- ${CPU_LEN:-128 128 3}
                 CPU135="--model benchmarks/configs/llama-135m --load-format dummy --dtype float32 --platform cpu --batch-size 1 --input-len $1 --output-len $2 --num-iters $3 --num-iters-warmup 1"
                 CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 TAIL=12 run_step cpu_eager 580 taskset -c 0,1 $CLI bench latency $CPU135 --compare-hf --hf-mode eager --output-json "$O/cpu_eager.json"
                 CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 OCTAVO_CPU_COMPILE=${CPU_COMPILE_BACKEND:-1} OCTAVO_CPU_COMPILE_MAX_BATCH=1 TAIL=12 run_step cpu_compiled 580 taskset -c 0,1 $CLI bench latency $CPU135 --output-json "$O/cpu_compiled.json";;
    dist) run_step dist_smoke 400 python benchmarks/dist_gpu_smoke.py --batch 32 --prompt-len 128 --new-tokens 128;;
    # sentence-transformers is the baseline when its wheels are carried in .whl/ (it needs scipy and
    # scikit-learn); without them the script times the same pipeline in transformers (hf-automodel).
    embed) install_sentence_transformers
           # The tokenizers library's threads on (its default, for Octavo and sentence-transformers alike):
           # the round-wide TOKENIZERS_PARALLELISM=false kept both single-threaded on 16 cores (round 25).
           # Headline: the corpus mode (8,192 sentences in one call a side, best of 3); also a call per batch.
           TOKENIZERS_PARALLELISM=true TAIL=24 run_step embed_gpu 580 python benchmarks/embed_gpu.py --batch-size 256 --num-batches 32 --repeats 3;;
    # MiniLM alone, twice back to back on one machine: how far the host moves the ratio (round 32: +-15% between machines).
    embed_minilm) for pass in 1 2; do
                    TOKENIZERS_PARALLELISM=true TAIL=10 run_step embed_minilm_$pass 300 python benchmarks/embed_gpu.py --configs minilm --batch-size 256 --num-batches 32 --repeats 3
                  done;;
    # Round 37: an idle engine's pooling lane (core/pooling_lane.py), MiniLM with it on and off in turns,
    # then the host's phases per batch (embed_host.py) each way, same machine.
    embed_lane_ab) install_sentence_transformers
                   for lane in 1 0 1 0; do
                     OCTAVO_POOLING_LANE=$lane TOKENIZERS_PARALLELISM=true TAIL=10 run_step "embed_minilm_lane${lane}_$(turn)" 300 \
                       python benchmarks/embed_gpu.py --configs minilm --batch-size 256 --num-batches 32 --repeats 3
                   done
                   for lane in 1 0; do
                     OCTAVO_POOLING_LANE=$lane TAIL=6 run_step embed_host_lane$lane 200 \
                       python benchmarks/embed_host.py --device cuda --minilm-layers --rounds 3 --num-batches 20
                   done;;
    # Round 35: an encoder's pooling steps overlapped (two in flight), MiniLM off then on, same machine.
    embed_overlap_ab) for overlap in 0 1; do
                        OCTAVO_POOLING_OVERLAP=$overlap TOKENIZERS_PARALLELISM=true TAIL=10 run_step embed_minilm_overlap$overlap 300 \
                          python benchmarks/embed_gpu.py --configs minilm --batch-size 256 --num-batches 32 --repeats 3
                      done;;
    # Corpus mode's tokenizing (round 33: BERT chunks in the engine's thread, not yet timed on a GPU):
    # in the engine's thread (default), on the background thread, and all at once, same machine.
    embed_corpus_ab) for mode in inline --tokenize-thread --no-stream; do
                       TOKENIZERS_PARALLELISM=true TAIL=1 run_step "embed_corpus_${mode#--}" 120 python benchmarks/embed_host.py \
                         --device cuda --minilm-layers --corpus --rounds 3 --num-batches 16 --corpus-calls 3 \
                         $([ "$mode" = inline ] || echo "$mode")
                     done;;
    # Issue 19: octavo bench serve against octavo serve beside the offline engine, same workload, same round.
    serve_bench) TAIL=40 run_step serve_bench 600 python benchmarks/serve_bench_gpu.py --out "$O" --label serve_bench;;
    serve_budget) TAIL=30 run_step serve_budget_2048 600 python benchmarks/serve_bench_gpu.py --out "$O" --label serve_budget_2048 \
                    --engine-args "--max-num-batched-tokens 2048" --concurrencies 256 1024;;
    # The 256-stream level with the offline run's 1,024 prompts, both engines logging their steps
    # (OCTAVO_STEP_LOG), then the two side by side: where the server's 11% goes (round 25).
    serve_steplog) mkdir -p "$O/steps"
                   OCTAVO_STEP_LOG="$O/steps/s" TAIL=12 run_step serve_steplog 500 python benchmarks/serve_bench_gpu.py --out "$O" \
                     --label serve_steplog --concurrencies 256 --prompts-per-stream 4
                   python benchmarks/step_log_summary.py "$O"/steps/s.*;;
    serve_api2) TAIL=30 run_step serve_api2 500 python benchmarks/serve_bench_gpu.py --out "$O" --label serve_api2 \
                  --server-args "--api-server-count 2" --no-offline --concurrencies 256 1024;;
    # The fused MoE kernel alone, one layer of each MoE model at 1..4096 tokens: kernel, torch reference, floor
    # (routed experts' bytes / copy bandwidth, or FLOPs / matmul rate); moe_sweep adds the best tile shapes.
    moe_bench) TAIL=16 run_step moe_bench 400 python benchmarks/moe_gpu.py;;
    moe_sweep) TAIL=50 run_step moe_sweep 580 python benchmarks/moe_gpu.py --sweep;;
    # Round 39's MoE work in one step: one Qwen3-MoE layer at 512 tokens, the alignment forms timed alone
    # (each checked equal to torch's sort) and the grouped down kernel's tiles swept, then the fused-MoE
    # GPU tests (the chunked alignment at 64, 512 and 2,048 tokens and in a CUDA graph).
    moe_check) TAIL=16 run_step moe_align_down 250 python benchmarks/moe_gpu.py --models qwen3-30b-a3b --tokens 512 --skip-gemv --down-sweep
               TAIL=4 run_step moe_gpu_tests 200 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_fused_moe.py;;
    # Round 40's lead: in a Qwen3-MoE prefill the down GEMM ran at ~295 TFLOP/s (K = 768, the expert
    # width), the gate-up at ~470: both kernels' tiles at 8,192 tokens (a bench throughput chunk).
    moe_prefill_sweep) TAIL=24 run_step moe_down_8192 400 python benchmarks/moe_gpu.py --models qwen3-30b-a3b --tokens 8192 \
                         --skip-gemv --down-sweep
                       TAIL=24 run_step moe_sweep_8192 500 python benchmarks/moe_gpu.py --models qwen3-30b-a3b --tokens 8192 \
                         --skip-gemv --sweep;;
    # The grouped down kernel's own tiles (OCTAVO_MOE_GROUPED_DOWN_TILES) at a 512-stream decode step
    # and a 2,048-token batch of Qwen3-MoE, the gate-up's at their default.
    moe_down_sweep) TAIL=24 run_step moe_down_sweep 500 python benchmarks/moe_gpu.py --models qwen3-30b-a3b --tokens 512,2048 --down-sweep --skip-gemv;;
    # Round 39: the alignment in one launch (a program per 64 slots) where a 512-stream decode step's
    # 4,096 slots took torch's sort: each form alone and one layer at 64 / 512 tokens, then Qwen3-MoE
    # throughput with it on and off (OCTAVO_MOE_CHUNKED_ALIGN; ALIGN_TURNS="1 0 1 0" for more turns), same machine.
    moe_align_ab) TAIL=24 run_step moe_align 300 python benchmarks/moe_gpu.py --models qwen3-30b-a3b --tokens 64,512 --skip-gemv
                  for on in ${ALIGN_TURNS:-1 0}; do
                    OCTAVO_MOE_CHUNKED_ALIGN=$on TAIL=8 run_step "qwen3moe_tput_align${on}_$(turn)" 400 $CLI bench throughput $MQ3 \
                      --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 8192 \
                      --output-json "$O/qwen3moe_tput_align${on}_$(cat "$TURN_FILE").json"
                  done;;
    # Round 41: Qwen3-MoE throughput with the grouped down kernel's wide prefill tiles (the default since
    # round 41) and with the gate-up's (the default before), in turns (DOWN_TURNS="new old new old").
    # (moe_down_ab, below, is the decode form's down kernel.)
    moe_wide_down_ab) for arm in ${DOWN_TURNS:-new old}; do
                   env_arm=""; [ "$arm" = old ] && env_arm="OCTAVO_MOE_GROUPED_DOWN_TILES=128,64,8,3"
                   TAIL=8 run_step "qwen3moe_tput_down_${arm}_$(turn)" 400 env $env_arm $CLI bench throughput $MQ3 \
                     --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 8192 \
                     --output-json "$O/qwen3moe_tput_down_${arm}_$(cat "$TURN_FILE").json"
                 done;;
    # Decode sizes only: the two-GEMV path's tiles (each GEMV's swept, the down's from block_n 1) and the grouped path's.
    moe_gemv_sweep) TAIL=40 run_step moe_gemv_sweep 580 python benchmarks/moe_gpu.py --sweep --tokens 1,8;;
    # Issue 16's decode form: one layer at 1 and 8 tokens, the decode form against the grouped path, its down
    # kernel's tiles swept, and the MoE block at 1 token before (cuBLAS router, grouped) and after (GEMV, decode form).
    # Qwen3-30B-A3B batch-1 decode, the grouped MoE path (the baseline) then the decode form, same call.
    qwen3moe_ab) b1_turns qwen3moe "$MQ3" OCTAVO_MOE_DECODE_MAX_TOKENS=0 OCTAVO_MOE_DECODE_MAX_TOKENS=1;;
    moe_decode) TAIL=40 run_step moe_decode 400 python benchmarks/moe_gpu.py --tokens 1,8 --decode-tiles --skip-gemv;;
    # The decode form's gate-up tiles at one token (SWEEP's block_n starts at 64: 96 programs at Qwen3-MoE's
    # widths, fewer than the H200's 132 SMs): narrower column tiles, more programs.
    # The decode form's down kernel (never swept before round 38): its tiles at one token, then
    # Qwen3-30B-A3B batch-1 decode with the fastest against the default, in turns, same machine.
    moe_down_ab) TAIL=12 run_step moe_down_sweep 300 python benchmarks/moe_gpu.py --tokens 1 --models qwen3-30b-a3b \
                   --decode-tiles --skip-gemv
                 best=$(python -c "import json; rows=[json.loads(l) for l in open('$O/moe_gpu.jsonl') if 'down_us' in l]; \
                   b=min(rows, key=lambda r: r['down_us']); print(*b['down_tiles'], sep=',')")
                 echo "fastest down tiles: $best"
                 b1_turns qwen3moe "$MQ3" "OCTAVO_MOE_DOWN_TILES=$best" "";;
    # The decode form's gate-up tiles at one token (96 programs at Qwen3-30B-A3B's widths with the
    # default 64 columns), then batch-1 decode with the fastest against the default, in turns.
    moe_gate_up_ab) TAIL=14 run_step moe_gate_up_sweep 300 python benchmarks/moe_gpu.py --tokens 1 --models qwen3-30b-a3b \
                      --sweep --skip-gemv --tiles "$MOE_DECODE_SWEEP"
                    best=$(python -c "import json; rows=[json.loads(l) for l in open('$O/moe_gpu.jsonl') if 'sweep_tiles' in l]; \
                      t=min(rows, key=lambda r: r['us'])['sweep_tiles']; print(*t.values(), sep=',')")
                    echo "fastest gate-up tiles: $best"
                    b1_turns qwen3moe "$MQ3" "OCTAVO_MOE_TILES=$best" "";;
    moe_decode_tiles) TAIL=40 run_step moe_decode_tiles 400 python benchmarks/moe_gpu.py --tokens 1 --sweep --skip-gemv \
                        --tiles "$MOE_DECODE_SWEEP";;
    # The three MoE paths at 1 and 8 tokens (grouped, decode form, two GEMVs: the last barrier-free since round 28).
    moe_paths) TAIL=40 run_step moe_paths 400 python benchmarks/moe_gpu.py --tokens 1,8;;
    moe_kernels) run_step moe_kernel_tests 400 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_fused_moe.py \
                   tests/kernels/test_moe_decode.py tests/kernels/test_moe_routed.py tests/kernels/test_layer_ops.py \
                   tests/kernels/test_attention_options.py;;
    # Round 35: Qwen3-30B-A3B batch-1 decode with the top-k launch (OCTAVO_MOE_ROUTED=0), then routed in the
    # experts' kernels (the default), back to back on one machine (both with the one-launch q/k head norms).
    # Qwen3-30B-A3B's decode attention (4 KV heads, ~130-256 tokens of context): split-KV with its merge, as
    # the captured graphs take it (they plan for max_model_len), against one program per KV head walking it all.
    qwen3moe_split_ab) b1_turns qwen3moe "$MQ3" "" OCTAVO_SPLIT_MIN_SEQ_LEN=1000000;;  # split-KV (default) against direct
    qwen3moe_routed_ab) b1_turns qwen3moe "$MQ3" OCTAVO_MOE_ROUTED=0 OCTAVO_MOE_ROUTED=1;;
    qwen3moe) family_step qwen3moe "$MQ3" all;;
    qwen3moe_*) family_step qwen3moe "$MQ3" "${step#qwen3moe_}";;
    mixtral) family_step mixtral "$MMX" all;;
    mixtral_*) family_step mixtral "$MMX" "${step#mixtral_}";;
    # Gemma-2-9B's GEMVs (5.15 of 6.16 ms in round 24; K = 3,584 is not a multiple of the 2,048-wide
    # default tile) swept on its own shapes, then its batch-1 decode with the winners, HF eager beside it.
    gemv_gemma2) TAIL=40 run_step gemv_sweep_gemma2 450 python benchmarks/gemv_gpu_sweep.py --model benchmarks/configs/gemma-2-9b --env-file /tmp/octavo-gemv-gemma2.env;;
    gemma2_lat1_tuned) echo "tuned: $(cat /tmp/octavo-gemv-gemma2.env 2>/dev/null | tr '\n' ' ')"
                       TAIL=20 run_step gemma2_latency_b1_tuned 580 env $(cat /tmp/octavo-gemv-gemma2.env 2>/dev/null) $CLI bench latency $MG2 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --compare-hf --hf-mode eager --output-json "$O/gemma2_latency_b1_tuned.json";;
    gemma2_lat1) TAIL=20 run_step gemma2_latency_b1 580 $CLI bench latency $MG2 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --compare-hf --output-json "$O/gemma2_latency_b1.json";;
    *) echo "unknown step $step";;
  esac
done
