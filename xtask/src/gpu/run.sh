#!/usr/bin/env bash
# solder's device check: `cargo xtask gpu-check` copies this file (xtask/src/gpu/run.sh) into
# target/gpu-check/ beside the bundle it builds: the `solder` binary, the device test binaries
# (`cuda_device`, `checked_cuda`) and the cubins.
# Run on the GPU machine from the repository root, one device call per part:
#   bash target/gpu-check/run.sh 1     (or PART=1; the default)
#   bash target/gpu-check/run.sh 2     (or PART=2; 3 likewise; `all` runs every part)
#
# A lease is 15 minutes of device time, each machine start (a minute or two) included: part 1
# alone is what a lease must return, part 2 what a second call adds while the machine is
# warm, part 3 the rest. Each part runs its stages in the order of their value, so that a cut
# loses the least.
# Part 1: facts and the JIT warm-up; decode at width 1, graph against eager (Llama-3.2-1B's
# shape); parity on the built-ins whose launches split k and heads; the tensor cores
# (`tensor_cores`: parity on two built-ins; a 2,048-token prefill in chunks of 512, gemv
# against the tensor cores, and the tensor cores' 128 x 64 tiles (`mma_large`) whose logits
# digest must be theirs; timed against gemv at 32 and 128 rows); ncu per kernel over one
# decode, one 16-wide step, one 128-wide step with the lever and a 1,024-token prefill with
# it; the device tests
# (`cuda_device`, `checked_cuda`: the tests `cargo test` lists as ignored, run with
# `--ignored`); memcheck on a model that splits (tiny-llama-wide past 256 tokens: gemv's
# split-K and split heads, attention in two chunks); the goldens.
# Part 2: parity on every built-in; a long context step against the CPU twin; the lever A/B
# at widths 1 and 8; racecheck on the splitting model; the width sweep with the serving loop
# (next_tokens against a pipeline); decode timed at
# contexts 1,024 and 8,192; memcheck and racecheck on an MoE with the tensor cores; memcheck
# on an MoE and a hybrid checkpoint; a stress stage
# replaying the split steps 1,000 times, comparing the logits bytes every time.
# Part 3: Gated DeltaNet's recurrence over a prompt's chunk at Qwen3-Next-80B's shape, row by
# row against its chunked form (`gdn_chunked`) on the CUDA cores and on the tensor cores
# (`gdn::gates_chunked_mma`, TF32), each launch timed alone (gpu-kernels); the
# tensor-core projections at Llama-3.1-8B's shapes against their roofline, gemv and their
# _large, _pipe (cp.async stages) and (at decode widths) _narrow entries (gpu-kernels); the qk-norm q/k/v launch at
# Qwen3-8B's, Qwen3-32B's and (gated) Qwen3-Next-80B's shapes through the 64 x 32 tile and the
# _large one, whose stage opts in past 48 KB of shared memory, bytes compared, then timed
# (gpu-kernels); the 1B shape with fp8 weights (block 128 x 128): a 2,048-token prefill, gemv
# against the tensor cores' quantized entries and those with `mma_narrow` (decode through the quantized
# _narrow entries), and ncu per kernel over a 1,024-token prefill with them;
# every module JIT-compiled from its PTX; Llama-3.2-1B's shape past 4,096 tokens,
# eager == graph == a second run; initcheck and synccheck on the splitting model; memcheck and
# racecheck with `pdl` on; racecheck over the tensor-core tiles (the _pipe entries' cp.async
# stages) at cut shapes; decode timed at context 131,069 (the 1B's 131,072 positions less
# the timed step's own).
#
# Each stage runs under `timeout` (limits in seconds below, each overridable by its variable)
# and, as soon as it ends, appends its row to $LOG/summary.txt and prints it, so a cut of the
# whole call keeps every finished row. A tool that is missing is a SKIP row naming it. Results
# go to $OUT (the device tool's folder) or /tmp/solder-gpu-check, in six files (the device tool
# brings back eight at most): summary.txt facts.log parity.log checks.log bench.log, and
# data.tar, which holds the machine-readable results (parity.json goldens.json bench.json
# ab.json ncu.csv parity-tc.json ab-tc.json ncu-tc.csv ncu-prefill.csv ncu-prefill-fp8.csv),
# packed again with each summary row. The summary of the part is printed again last.
set -u
cd "$(dirname "$0")/../.." || exit 2
PART=${1:-${PART:-1}}
case $PART in
    1 | 2 | 3 | all) ;;
    *)
        echo "run.sh: part \`$PART\`: want 1, 2, 3 or all" >&2
        exit 2
        ;;
esac

# Part 1: 395 s in all (gpu-check's first device call gives 435). The limits are about twice
# what the first device run took (2026-12-04, H200, in the comments: part 1 ran in 126 s and
# the goldens in 66 s, part 2 in about 200 s, part 3's stages as noted; a machine started in
# about 35 s).
LIMIT_FACTS=${LIMIT_FACTS:-15}          # each part starts with it (0.6 s)
LIMIT_BENCH_W1=${LIMIT_BENCH_W1:-20}    # 1B shape: the build, decode timed (8 s)
LIMIT_PARITY_SPLIT=${LIMIT_PARITY_SPLIT:-15}  # (6 s)
LIMIT_TC_PARITY=${LIMIT_TC_PARITY:-15}  # the tensor_cores lever: parity on two built-ins (4 s)
LIMIT_PREFILL=${LIMIT_PREFILL:-17}      # per run, three runs: 1B shape, 2,048 tokens (8-10 s)
LIMIT_TC_AB=${LIMIT_TC_AB:-49}          # 1B shape, gemv vs tensor cores (and mma_narrow) at 1, 32 and 128 rows (25 s for two variants at 32 and 128; not yet timed since)
LIMIT_NCU=${LIMIT_NCU:-35}              # builds the 1B shape, profiles two steps (16 s)
LIMIT_NCU_TABLE=${LIMIT_NCU_TABLE:-10}
LIMIT_TC_NCU=${LIMIT_TC_NCU:-35}        # ncu over one 128-wide step with the lever (20 s)
LIMIT_NCU_PREFILL=${LIMIT_NCU_PREFILL:-40}  # ncu over a 1,024-token prefill with the lever
LIMIT_CUDA_DEVICE=${LIMIT_CUDA_DEVICE:-8}   # the CudaBackend device tests (8; the first 7 took 1.5 s)
LIMIT_CHECKED=${LIMIT_CHECKED:-7}      # the Checked<CudaBackend> device test (0.3 s)
LIMIT_MEMCHECK=${LIMIT_MEMCHECK:-10}    # (1.2 s)
LIMIT_GOLDENS=${LIMIT_GOLDENS:-85}      # 23 checkpoints (66 s)
# Part 2: 365 s in all (the second device call gives 400).
LIMIT_FACTS_2=${LIMIT_FACTS_2:-15}
LIMIT_PARITY=${LIMIT_PARITY:-60}        # every built-in (32 s)
LIMIT_STEP_TWIN=${LIMIT_STEP_TWIN:-15}  # tiny-llama, 4,200 tokens, against the CPU twin (3 s)
LIMIT_AB=${LIMIT_AB:-50}                # 1B shape, one build per variant, widths 1 and 8 (28 s)
LIMIT_RACECHECK=${LIMIT_RACECHECK:-60}  # (39 s)
LIMIT_SWEEP=${LIMIT_SWEEP:-35}          # every ladder width for 0.3 s (20 s), then the serving loop (a few s; not yet timed)
LIMIT_CTX_1K=${LIMIT_CTX_1K:-20}        # (9 s)
LIMIT_CTX_8K=${LIMIT_CTX_8K:-30}        # (15 s)
LIMIT_MEMCHECK_MODEL=${LIMIT_MEMCHECK_MODEL:-10}   # per checkpoint, two of them (1 s)
LIMIT_STRESS=${LIMIT_STRESS:-10}        # (1 s)
LIMIT_TC_SANITIZE=${LIMIT_TC_SANITIZE:-25}  # per run: memcheck, racecheck, MoE with the lever (4 s at context 40; now 300, not yet timed)
# Part 3: 500 s in all (the third device call gives 540; the JIT and long-step limits cut to
# 1.4 and 1.7 times their first runs to make room for a third fp8 prefill).
LIMIT_FACTS_3=${LIMIT_FACTS_3:-5}    # (0.6 s in part 1)
LIMIT_GDN_KERNELS=${LIMIT_GDN_KERNELS:-20}  # gdn recurrence, its chunked forms, 80B shape (not yet timed)
LIMIT_GEMM_KERNELS=${LIMIT_GEMM_KERNELS:-35}  # tensor-core projections, 8B shapes, 5 widths, five entries (not yet timed)
LIMIT_QKV_KERNELS=${LIMIT_QKV_KERNELS:-10}  # qk-norm q/k/v, wide and large tiles, 3 shapes, 3 widths (not yet timed)
LIMIT_PREFILL_FP8=${LIMIT_PREFILL_FP8:-25}  # per run, three runs: LIMIT_PREFILL's, fp8 weights (not yet timed)
LIMIT_NCU_PREFILL_FP8=${LIMIT_NCU_PREFILL_FP8:-40}  # LIMIT_NCU_PREFILL's, fp8 weights (not yet timed)
LIMIT_FACTS_JIT=${LIMIT_FACTS_JIT:-35}  # every module JIT-compiled from its PTX (25 s)
LIMIT_STEP_LONG=${LIMIT_STEP_LONG:-35}  # Llama-3.2-1B's shape, 4,200 tokens, compared (21 s)
LIMIT_INITCHECK=${LIMIT_INITCHECK:-10}  # (1 s)
LIMIT_SYNCCHECK=${LIMIT_SYNCCHECK:-10}  # (1 s)
LIMIT_MEMCHECK_PDL=${LIMIT_MEMCHECK_PDL:-10}  # (1 s)
LIMIT_RACECHECK_PDL=${LIMIT_RACECHECK_PDL:-55}  # (more than 20 s; racecheck alone took 39)
LIMIT_RACECHECK_TILES=${LIMIT_RACECHECK_TILES:-15}  # 12 projection launches at cut shapes, 3 times each (not yet timed)
LIMIT_CTX_128K=${LIMIT_CTX_128K:-145}   # 131,069 tokens prefilled 8 at a time (past 75 s)
# The levers the A/B stage compares (comma-separated; an unknown name fails the stage, naming
# it): programmatic launch and the three batch-1 levers (split_two_waves: splits sized to 528
# blocks, the sizing before one wave became the default, to see the default still pays;
# qkv_norm_ahead: weight loads in flight before qkv_rope_kv's norm, now timed on top of the
# one-wave default; attn_prefetch: decode attention's loads issued ahead of their use), all four
# byte-identical, then the o projection folded into attention (its logits differ within its
# rule's tolerance, not byte for byte). split_rope_kv, gemv_classic and gemv_unsplit are left out of the default
# to keep five levers in the stage's limit (set AB_LEVERS to time them).
AB_LEVERS=${AB_LEVERS:-pdl,split_two_waves,qkv_norm_ahead,attn_prefetch,fold_o_proj}
# The model whose launches split: gemv's split-K and split heads (hidden 1056), attention's
# chunks (300 tokens: two), at 8 rows.
SPLIT_MODEL=(--builtin tiny-llama-wide --context 300 --width 8)
STRESS_REPLAYS=${STRESS_REPLAYS:-1000}

LOG=${OUT:-/tmp/solder-gpu-check}
mkdir -p "$LOG"
SCRATCH=$(mktemp -d /tmp/solder-gpu-check.XXXXXX)
# The JSON and CSV results, packed into $LOG/data.tar by `pack`.
DATA=$SCRATCH/data
mkdir -p "$DATA"
# The executables and the sm_90 cubins travel packed (bundle.tgz); unpacked here in a second.
# BIN set by the caller skips the archive (a stand-in binary, or one built on the machine).
if [ -z "${BIN:-}" ]; then
    if ! tar -xzf target/gpu-check/bundle.tgz -C "$SCRATCH"; then
        echo "cannot unpack target/gpu-check/bundle.tgz: build it with \`cargo xtask gpu-check\` and carry target/gpu-check"
        exit 2
    fi
    BIN=$SCRATCH/solder
    # Modules load from the cubins where they match the embedded PTX (no JIT); an empty
    # SOLDER_CUBINS given by the caller JIT-compiles the PTX instead.
    export SOLDER_CUBINS=${SOLDER_CUBINS-$SCRATCH/cubin}
fi
chmod +x "$BIN" 2>/dev/null
# One JIT of the PTX per machine, reused by every later process (the default cache is small).
export CUDA_CACHE_MAXSIZE=2147483648
export SOLDER_LOG=${SOLDER_LOG:-warn}
START=$(date +%s)
SUMMARY=()
FAILED=0
STAGE_OUT=$SCRATCH/stage.out

# stage NAME LIMIT LOGFILE COMMAND...: runs COMMAND under timeout, appends its output to LOGFILE
# (and to STAGE_OUT alone, where `record` finds the stage's key figure).
stage() {
    local name=$1 limit=$2 log=$3
    shift 3
    echo
    echo "=== $name (limit ${limit} s): $*" | tee -a "$log"
    local t0 rc ms
    : >"$STAGE_OUT"
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$log" "$STAGE_OUT"
    rc=${PIPESTATUS[0]}
    ms=$((($(date +%s%N) - t0) / 1000000))
    STAGE_SECONDS="$((ms / 1000)).$((ms % 1000 / 100))"
    case $rc in
        0) STAGE_STATUS=ok ;;
        124 | 137) STAGE_STATUS=TIMEOUT; FAILED=1 ;;
        *) STAGE_STATUS="FAIL($rc)"; FAILED=1 ;;
    esac
}

# record NAME KEY [LOG]: one row of the summary for the stage just run (KEY, else the stage's
# last error line, else its last line), appended to summary.txt and printed at once.
record() {
    local key=$2 row
    if [ -z "${key// /}" ] && [ -n "${3:-}" ]; then
        key=$(last_line "$STAGE_OUT" 'error|Error|ERROR|panicked')
        [ -z "$key" ] && key="last output: $(last_line "$STAGE_OUT" '.')"
    fi
    row=$(printf '%-24s %-9s %7s  %s' "$1" "$STAGE_STATUS" "${STAGE_SECONDS}s" "${key:0:110}")
    SUMMARY+=("$row")
    echo "$row" >>"$LOG/summary.txt"
    echo "--- summary row: $row"
    pack
}

# key PATTERN: the stage's last output line matching PATTERN.
key() { last_line "$STAGE_OUT" "$1"; }

# skip NAME WHY: a summary row for a stage that could not run.
skip() {
    STAGE_STATUS=SKIP STAGE_SECONDS=0
    record "$1" "$2"
}

# pack: $DATA into $LOG/data.tar, whole or not at all (written aside, then renamed).
pack() {
    tar -cf "$LOG/data.tar.part" -C "$SCRATCH" data && mv -f "$LOG/data.tar.part" "$LOG/data.tar"
}

last_line() { grep -E "$2" "$1" 2>/dev/null | tail -n 1; }

# find_tool NAME: NAME on the PATH, else in the usual CUDA and Nsight folders; empty if none.
find_tool() {
    local found candidate
    found=$(command -v "$1")
    for candidate in /usr/local/cuda*/bin/"$1" /usr/local/cuda*/"$1"/"$1" \
        /opt/nvidia/*/"$1" /opt/nvidia/*/*/"$1" /opt/nvidia/nsight-compute/*/"$1"; do
        [ -z "$found" ] && [ -f "$candidate" ] && [ -x "$candidate" ] && found=$candidate
    done
    echo "$found"
}

# clocks WHEN: SM and memory clocks, their maxima, power, temperature and the throttle
# reasons, into facts.log; the summary row's key is the first line of values.
CLOCK_FIELDS=clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,power.limit,temperature.gpu
REASONS=clocks_throttle_reasons.active,clocks_throttle_reasons.sw_power_cap,clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.hw_thermal_slowdown,clocks_throttle_reasons.sw_thermal_slowdown
clocks() {
    local out
    if ! command -v nvidia-smi >/dev/null; then
        skip "clocks $1" "nvidia-smi not found"
        return
    fi
    echo "--- clocks $1" >>"$LOG/facts.log"
    : >"$STAGE_OUT"
    out=$(nvidia-smi --query-gpu="$CLOCK_FIELDS,$REASONS" --format=csv 2>&1) ||
        out=$(nvidia-smi --query-gpu="$CLOCK_FIELDS" --format=csv 2>&1)
    echo "$out" | tee -a "$LOG/facts.log"
    STAGE_STATUS=ok STAGE_SECONDS=0
    record "clocks $1" "$(echo "$out" | sed -n 2p)"
}


SANITIZER=$(find_tool compute-sanitizer)
NCU=$(find_tool ncu)

# sanitize NAME TOOL LIMIT ARGS...: one compute-sanitizer run of gpu-step ARGS, two decode steps.
sanitize() {
    local name=$1 tool=$2 limit=$3
    shift 3
    sanitize_run "$name" "$tool" "$limit" gpu-step "$@" --steps 2
}

# sanitize_run NAME TOOL LIMIT COMMAND...: compute-sanitizer's TOOL over `$BIN COMMAND...`.
sanitize_run() {
    local name=$1 tool=$2 limit=$3
    shift 3
    if [ -z "$SANITIZER" ]; then
        skip "$name" "compute-sanitizer not found"
        return
    fi
    stage "$name" "$limit" "$LOG/checks.log" \
        "$SANITIZER" --tool "$tool" --error-exitcode 3 "$BIN" "$@"
    record "$name" "$(key 'ERROR SUMMARY|RACECHECK SUMMARY' | sed 's/^=* *//')" "$LOG/checks.log"
}

# device_tests NAME LIMIT: the bundle's test binary NAME (beside BIN), its tests that need a
# device (`#[ignore]`d, so `cargo test` elsewhere lists them as not run) run with `--ignored`:
# here a driver that does not load fails them.
device_tests() {
    local exe
    exe=$(dirname "$BIN")/$1
    if [ ! -x "$exe" ]; then
        skip "$1 tests" "$exe is not there (not in the bundle?)"
        return
    fi
    stage "$1 tests" "$2" "$LOG/checks.log" "$exe" --ignored --test-threads 1
    record "$1 tests" "$(key '^test result:')" "$LOG/checks.log"
}

# ncu_by_kernel CSV PREFIX: per kernel name, from ncu's CSV: launches, summed time, DRAM bytes
# read and (where measured) the tensor pipe's mean busy share, the costliest first; also into
# bench.log.
ncu_by_kernel() {
    awk -F'","' -v prefix="$2" 'NR > 1 && $0 ~ /^"[0-9]/ {
            name = $5; sub(/\(.*/, "", name); v = $NF; gsub(/[",]/, "", v)
            if ($(NF-2) ~ /gpu__time_duration/) { t[name] += v; n[name]++ }
            if ($(NF-2) ~ /dram__bytes_read/) { b[name] += v }
            if ($(NF-2) ~ /hmma/) { h[name] += v; hn[name]++ }
        } END { for (k in t) printf "%s %-32s %4d launches %12.1f us %10.2f MB tensor %s\n", prefix, k, n[k], t[k] / 1000, b[k] / 1e6, (hn[k] ? sprintf("%.1f%%", h[k] / hn[k]) : "-") }' \
        "$1" | sort -k5 -g -r | tee -a "$LOG/bench.log"
}

# decode_row NAME: the summary row of a gpu-bench stage from its table's `decode 1` line
# (mode rows launches MB/step floor_us eager_us graph_us fl/eager fl/graph tok/s).
decode_row() {
    record "$1" "$(key '^decode +1 ' | awk \
        '{printf "decode: graph %s us, eager %s us, floor %s us = %s of graph, %s launches", $7, $6, $5, $9, $3}')" \
        "$LOG/bench.log"
}

# bench_context NAME LIMIT CONTEXT: decode alone, timed after CONTEXT tokens (1B shape).
bench_context() {
    stage "$1" "$2" "$LOG/bench.log" \
        "$BIN" gpu-bench --synth llama-3.2-1b --widths 1 --context "$3" --runs 100 --max-seconds 1
    decode_row "$1"
}

facts() {
    echo "=== solder device check part $PART, $(date -u +%FT%TZ), $(uname -m)" |
        tee -a "$LOG/facts.log" "$LOG/summary.txt"
    tee -a "$LOG/facts.log" 2>/dev/null <target/gpu-check/BUILD
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L 2>&1 | tee -a "$LOG/facts.log"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
            tee -a "$LOG/facts.log"
    fi
    clocks before
    # Loads every module: the JIT of the PTX, cached for every later process.
    stage facts "$1" "$LOG/facts.log" "$BIN" gpu-facts
    local line
    line=$(key '^cuda backend:' | cut -d: -f2-)
    [ -n "$line" ] && line="$line; $(key '^modules loaded' |
        sed -E 's/^modules loaded \(([0-9]+ of [0-9]+) from cubins.*in ([0-9.]+ s)$/\1 modules from cubins, loaded in \2/')"
    record facts "$line" "$LOG/facts.log"
}

# prefill NAME LEVERS LIMIT [QUANT]: a 2,048-token prompt of the 1B shape in chunks of 512
# (prefill programs, then the last chunk's logits), then 16 decode steps, eager and graph
# (`bench --backend cuda`); LEVERS empty for the gemv routing; QUANT (`bench --quant`) stores
# the weights quantized.
prefill() {
    local levers=() quant=()
    [ -n "$2" ] && levers=(--levers "$2")
    [ -n "${4:-}" ] && quant=(--quant "$4")
    stage "$1" "$3" "$LOG/bench.log" \
        "$BIN" bench --backend cuda --synth llama-3.2-1b --prompt-len 2048 --chunk 512 --gen 16 \
        "${levers[@]}" "${quant[@]}"
    record "$1" "$(key '^solder decode:' | tr ' ' '\n' |
        grep -E '^(prefill_ms|prefill_tok_per_s|eager_ms|graph_ms)=' | paste -sd ' ')" "$LOG/bench.log"
    # The digest of the run's logits (its prefill's last row and every decode step's).
    PREFILL_FNV=$(key '^solder logits:' | sed -n 's/.*logits_fnv=\([0-9a-f]*\).*/\1/p')
}

# same_bytes NAME A B: a summary row saying whether two prefill runs' logits digests agree
# (levers that promise the same bytes, on the device's own mma.sync).
same_bytes() {
    STAGE_STATUS=ok STAGE_SECONDS=0
    if [ -z "$2" ] || [ -z "$3" ]; then
        STAGE_STATUS=SKIP
        record "$1" "a run printed no logits digest"
    elif [ "$2" = "$3" ]; then
        record "$1" "the same logits bytes (fnv $2)"
    else
        STAGE_STATUS=FAIL FAILED=1
        record "$1" "logits differ: fnv $2 vs $3"
    fi
}

part1() {
    # The headline: one decode step of the 1B shape, graph replay against eager.
    stage "decode w1 graph/eager" "$LIMIT_BENCH_W1" "$LOG/bench.log" \
        "$BIN" gpu-bench --synth llama-3.2-1b --widths 1 --runs 200 --max-seconds 1
    decode_row "decode w1 graph/eager"

    stage "parity split k/heads" "$LIMIT_PARITY_SPLIT" "$LOG/parity.log" \
        "$BIN" parity --backend cuda --only tiny-llama-wide,tiny-llama-long \
        --json "$DATA/parity.json"
    record "parity split k/heads" "$(key '^(PASS|FAIL)')" "$LOG/parity.log"

    # The tensor cores (`tensor_cores` lever, gemm::*_mma): their logits within the rules'
    # tolerance of the CUDA-core reference and every sequence byte-identical at every width
    # (batch invariance, on the device's own mma.sync); a long prefill gemv against them;
    # then timed against gemv at 32 and 128 rows.
    stage "parity tensor cores" "$LIMIT_TC_PARITY" "$LOG/parity.log" \
        "$BIN" parity --backend cuda --levers tensor_cores --only tiny-llama,tiny-qwen3-moe \
        --json "$DATA/parity-tc.json"
    record "parity tensor cores" "$(key '^(PASS|FAIL)')" "$LOG/parity.log"
    prefill "prefill 2048 gemv" "" "$LIMIT_PREFILL"
    prefill "prefill 2048 tensor cores" tensor_cores "$LIMIT_PREFILL"
    local tc_fnv=$PREFILL_FNV
    # With mma_large too: the chunks' q/k/v, o, gate/up, down and LM head through the 128 x 64
    # tiles where they fit: the same bytes, so the same digest.
    prefill "prefill 2048 tensor cores large" tensor_cores,mma_large "$LIMIT_PREFILL"
    same_bytes "large tiles: bytes" "$tc_fnv" "$PREFILL_FNV"
    # With mma_narrow too: the tensor cores' decode widths through the _narrow entries.
    stage "gpu-bench tensor cores" "$LIMIT_TC_AB" "$LOG/bench.log" \
        "$BIN" gpu-bench --synth llama-3.2-1b --ab tensor_cores,tensor_cores+mma_narrow \
        --widths 1,32,128 --rounds 3 --runs 10 --max-seconds 3 --json "$DATA/ab-tc.json"
    local rows program
    for rows in 1 32 128; do
        record "tensor cores rows $rows" "$(key "^ab rows $rows graph:" | cut -d: -f2-)" "$LOG/bench.log"
    done

    # ncu: per-kernel time and DRAM bytes over one decode and one 16-wide multi-seq step, then
    # one 128-wide step with the tensor cores.
    echo "ncu: ${NCU:-not found}" | tee -a "$LOG/bench.log"
    if [ -z "$NCU" ]; then
        skip "ncu" "ncu not found"
    else
        stage "ncu profile" "$LIMIT_NCU" "$LOG/bench.log" \
            "$NCU" --profile-from-start off --clock-control none --csv --print-units base \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
            --log-file "$DATA/ncu.csv" \
            "$BIN" gpu-step --synth llama-3.2-1b --context 32 --width 16 --profile
        record "ncu profile" "$(grep -c '^"[0-9]' "$DATA/ncu.csv" 2>/dev/null) CSV lines" "$LOG/bench.log"
        stage "ncu table" "$LIMIT_NCU_TABLE" "$LOG/bench.log" \
            "$BIN" gpu-ncu-table --csv "$DATA/ncu.csv" --programs decode:1,multi_seq:16 \
            --synth llama-3.2-1b --context 32 --launches
        # n, time_us, dram_MB, floor_MB, TB/s, %peak, floor_us, floor/time
        for program in decode:1 multi_seq:16; do
            record "ncu $program" "$(key "^ncu $program total" |
                awk '{printf "%s kernels %s us, %s MB DRAM = %s TB/s (%s of peak); floor %s us = %s of it", $4, $5, $6, $8, $9, $10, $11}')" "$LOG/bench.log"
        done
        stage "ncu tensor cores" "$LIMIT_TC_NCU" "$LOG/bench.log" \
            "$NCU" --profile-from-start off --clock-control none --csv --print-units base \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum \
            --log-file "$DATA/ncu-tc.csv" \
            "$BIN" gpu-step --synth llama-3.2-1b --context 32 --width 128 --profile \
            --levers tensor_cores
        ncu_by_kernel "$DATA/ncu-tc.csv" ncu-tc >"$SCRATCH/ncu-tc.txt"
        record "ncu tensor cores" "$(grep -m 2 -E '_mma' "$SCRATCH/ncu-tc.txt" | tr -s ' ' | paste -sd ';')" "$LOG/bench.log"
        # Every launch of a 1,024-token prefill in chunks of 512 with the lever (a prefill
        # program, then the last chunk's verify program and one decode step).
        stage "ncu prefill" "$LIMIT_NCU_PREFILL" "$LOG/bench.log" \
            "$NCU" --clock-control none --csv --print-units base \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
            --log-file "$DATA/ncu-prefill.csv" \
            "$BIN" bench --backend cuda --synth llama-3.2-1b --prompt-len 1024 --chunk 512 --gen 1 \
            --graphs eager --levers tensor_cores
        ncu_by_kernel "$DATA/ncu-prefill.csv" ncu-prefill >"$SCRATCH/ncu-prefill.txt"
        record "ncu prefill" "$(head -n 3 "$SCRATCH/ncu-prefill.txt" | tr -s ' ' | paste -sd ';')" "$LOG/bench.log"
    fi

    device_tests cuda_device "$LIMIT_CUDA_DEVICE"
    device_tests checked_cuda "$LIMIT_CHECKED"

    echo "compute-sanitizer: ${SANITIZER:-not found}" | tee -a "$LOG/checks.log"
    sanitize "memcheck split" memcheck "$LIMIT_MEMCHECK" "${SPLIT_MODEL[@]}"

    stage goldens "$LIMIT_GOLDENS" "$LOG/parity.log" \
        "$BIN" parity --backend cuda --goldens tests/fixtures/golden --json "$DATA/goldens.json"
    record "parity (goldens)" "$(key '^(PASS|FAIL)')" "$LOG/parity.log"
}

part2() {
    stage "parity (built-in)" "$LIMIT_PARITY" "$LOG/parity.log" \
        "$BIN" parity --backend cuda --json "$DATA/parity.json"
    record "parity (built-in)" "$(key '^(PASS|FAIL)')" "$LOG/parity.log"

    stage "step twin ctx 4200" "$LIMIT_STEP_TWIN" "$LOG/checks.log" \
        "$BIN" gpu-step --builtin tiny-llama --context 4200 --compare --cpu-twin
    record "step twin ctx 4200" "$(key '^cpu twin:')" "$LOG/checks.log"

    # The same model per lever set (baseline, each of AB_LEVERS, all together), timed
    # interleaved, graph and eager, at 1 and 8 rows.
    stage "gpu-bench A/B" "$LIMIT_AB" "$LOG/bench.log" \
        "$BIN" gpu-bench --synth llama-3.2-1b --ab "$AB_LEVERS" --widths 1,8 --rounds 4 \
        --runs 10 --max-seconds 3 --json "$DATA/ab.json"
    local rows
    for rows in 1 8; do
        record "A/B rows $rows" "$(key "^ab rows $rows graph:" | cut -d: -f2-)" "$LOG/bench.log"
    done

    echo "compute-sanitizer: ${SANITIZER:-not found}" | tee -a "$LOG/checks.log"
    sanitize "racecheck split" racecheck "$LIMIT_RACECHECK" "${SPLIT_MODEL[@]}"

    # Every width of the default ladder, 0.3 s each; then at each width 32 greedy steps with
    # the host waiting for each step's ids against a pipeline (2 steps queued ahead).
    stage "width sweep" "$LIMIT_SWEEP" "$LOG/bench.log" \
        "$BIN" gpu-bench --synth llama-3.2-1b --runs 100 --max-seconds 0.3 --loop 32 --json "$DATA/bench.json"
    decode_row "width sweep"
    record "width sweep rows 8" "$(key '^multi_seq +8 ' | awk '{printf "graph %s us, eager %s us, floor %s us = %s of graph", $7, $6, $5, $9}')"
    for rows in 1 32 128; do
        record "serving loop rows $rows" "$(key "^serving loop $rows:" | cut -d: -f2-)" "$LOG/bench.log"
    done

    bench_context "decode ctx 1024" "$LIMIT_CTX_1K" 1024
    bench_context "decode ctx 8192" "$LIMIT_CTX_8K" 8192

    # The tensor-core kernels under the sanitizers: the grouped experts GEMM gathers picks with
    # shared atomics; flash::paged_mma's prefill blocks (one sequence's rows) and, at 300 keys,
    # its two chunks merged across blocks (counters, scratch, the merge weights in shared memory).
    sanitize "memcheck moe tc" memcheck "$LIMIT_TC_SANITIZE" --builtin tiny-qwen3-moe --context 300 \
        --width 8 --levers tensor_cores
    sanitize "racecheck moe tc" racecheck "$LIMIT_TC_SANITIZE" --builtin tiny-qwen3-moe --context 300 \
        --width 8 --levers tensor_cores

    sanitize "memcheck qwen3_moe" memcheck "$LIMIT_MEMCHECK_MODEL" --model tests/fixtures/golden/qwen3_moe
    sanitize "memcheck qwen3_next" memcheck "$LIMIT_MEMCHECK_MODEL" --model tests/fixtures/golden/qwen3_next

    # The split steps (decode, multi_seq:8) replayed from the same state, bytes compared
    # every time; the first difference fails with its replay's index.
    stage "stress replays" "$LIMIT_STRESS" "$LOG/checks.log" \
        "$BIN" gpu-step "${SPLIT_MODEL[@]}" --replays "$STRESS_REPLAYS"
    local equal
    equal=$(grep -c 'graph replays from the same state' "$STAGE_OUT")
    record "stress replays" "$([ "$equal" -gt 0 ] && echo "$equal steps x $STRESS_REPLAYS replays equal; $(key '^gpu-step ')")" "$LOG/checks.log"
}

part3() {
    # Per-kernel: the recurrence of one sequence's chunk of 16, 128 and 512 rows at the 80B's
    # Gated DeltaNet shape, gdn::gates_recurrence against gdn::gates_chunked and
    # gdn::gates_chunked_mma (their outputs compared first), medians of launches timed alone.
    stage "gdn kernels" "$LIMIT_GDN_KERNELS" "$LOG/bench.log" \
        "$BIN" gpu-kernels --backend cuda --family gdn --rows 16,128,512 --runs 20
    record "gdn kernels" "$(key '^gdn kernels:')" "$LOG/bench.log"

    # Per-kernel: gemm::gate_up_silu_mma and gemm::linear_mma (down, o) at Llama-3.1-8B's
    # shapes and 1, 16, 64, 128 and 512 rows, medians against the roofline, against the floor
    # of weights read once per 64 rows (the grid's old order), against gemv's kernels, against
    # their _large entries (lever mma_large), at 1 and 16 rows their _narrow entries (lever
    # mma_narrow) and at 64 rows and more their _pipe entries (lever mma_pipe: three k tiles in
    # flight through cp.async, 81 or 108 KB of shared memory opted in), the tiles' bytes checked
    # equal first. Two rows: the kernels against the roofline and gemv, the tiles against each
    # other.
    stage "gemm kernels" "$LIMIT_GEMM_KERNELS" "$LOG/bench.log" \
        "$BIN" gpu-kernels --backend cuda --family gemm --rows 1,16,64,128,512 --runs 20
    record "gemm kernels" "$(key '^gemm kernels:')" "$LOG/bench.log"
    record "gemm tiles" "$(key '^gemm tiles:')" "$LOG/bench.log"

    # Per-kernel: gemm::qkv_norm_rope_kv_mma at Qwen3-8B's and Qwen3-32B's attention shapes and
    # the gated layout at Qwen3-Next-80B's (256-wide heads), each through the 64 x 32 tile and
    # its _large entry, whose stage of 32 or 64 KB opts in past 48 KB of shared memory: their q,
    # gate and cache bytes checked equal first, then medians against the roofline.
    stage "qkv kernels" "$LIMIT_QKV_KERNELS" "$LOG/bench.log" \
        "$BIN" gpu-kernels --backend cuda --family qkv --rows 64,128,512 --runs 20
    record "qkv kernels" "$(key '^qkv kernels:')" "$LOG/bench.log"

    # fp8 weights: gemv's quantized entries against the tensor cores' (linear_mma_fp8, the fused
    # qkv_mma_fp8 and gate_up_silu_mma_fp8), then every launch of a 1,024-token prefill with
    # the lever under ncu.
    prefill "prefill 2048 fp8 gemv" "" "$LIMIT_PREFILL_FP8" fp8
    prefill "prefill 2048 fp8 tensor cores" tensor_cores "$LIMIT_PREFILL_FP8" fp8
    local fp8_fnv=$PREFILL_FNV
    # The same with mma_narrow: its decode steps (eager_ms, graph_ms) through the quantized
    # _narrow entries (stages of 128 k); the prefill's 512-row chunks keep the wide tile. The
    # lever promises the same bytes, so the same digest.
    prefill "prefill 2048 fp8 tensor cores narrow" tensor_cores,mma_narrow "$LIMIT_PREFILL_FP8" fp8
    same_bytes "fp8 narrow tiles: bytes" "$fp8_fnv" "$PREFILL_FNV"
    if [ -z "$NCU" ]; then
        skip "ncu prefill fp8" "ncu not found"
    else
        stage "ncu prefill fp8" "$LIMIT_NCU_PREFILL_FP8" "$LOG/bench.log" \
            "$NCU" --clock-control none --csv --print-units base \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
            --log-file "$DATA/ncu-prefill-fp8.csv" \
            "$BIN" bench --backend cuda --synth llama-3.2-1b --quant fp8 --prompt-len 1024 \
            --chunk 512 --gen 1 --graphs eager --levers tensor_cores
        ncu_by_kernel "$DATA/ncu-prefill-fp8.csv" ncu-prefill-fp8 >"$SCRATCH/ncu-prefill-fp8.txt"
        record "ncu prefill fp8" "$(head -n 3 "$SCRATCH/ncu-prefill-fp8.txt" | tr -s ' ' | paste -sd ';')" "$LOG/bench.log"
    fi

    # The fallback path: every module from its PTX, JIT-compiled by this driver.
    stage "facts, ptx jit" "$LIMIT_FACTS_JIT" "$LOG/facts.log" \
        env SOLDER_CUBINS= CUDA_CACHE_DISABLE=1 "$BIN" gpu-facts
    record "facts, ptx jit" "$(key '^modules loaded')" "$LOG/facts.log"

    stage "step 1b ctx 4200" "$LIMIT_STEP_LONG" "$LOG/checks.log" \
        "$BIN" gpu-step --synth llama-3.2-1b --context 4200 --width 8 --compare
    record "step 1b ctx 4200" "$(key '^(second identical run|gpu-step )')" "$LOG/checks.log"

    echo "compute-sanitizer: ${SANITIZER:-not found}" | tee -a "$LOG/checks.log"
    sanitize "initcheck split" initcheck "$LIMIT_INITCHECK" "${SPLIT_MODEL[@]}"
    sanitize "synccheck split" synccheck "$LIMIT_SYNCCHECK" "${SPLIT_MODEL[@]}"
    sanitize "memcheck split pdl" memcheck "$LIMIT_MEMCHECK_PDL" "${SPLIT_MODEL[@]}" --levers pdl
    sanitize "racecheck split pdl" racecheck "$LIMIT_RACECHECK_PDL" "${SPLIT_MODEL[@]}" --levers pdl
    # The tensor-core tiles alone, the _pipe entries' cp.async stages above all (a stage
    # refilled while a warp still reads it, which the emulation cannot see): the gemm family's
    # projections cut by 16 (k 256 to 896: 4 to 14 k tiles, every stage reused) at 130 rows.
    sanitize_run "racecheck gemm tiles" racecheck "$LIMIT_RACECHECK_TILES" \
        gpu-kernels --backend cuda --family gemm --rows 130 --runs 1 --cut 16

    # 131,069 tokens: the step's own positions (and the warm-up's) fill the 1B's 131,072.
    bench_context "decode ctx 131069" "$LIMIT_CTX_128K" 131069
}

case $PART in
    1)
        facts "$LIMIT_FACTS"
        part1
        ;;
    2)
        facts "$LIMIT_FACTS_2"
        part2
        ;;
    3)
        facts "$LIMIT_FACTS_3"
        part3
        ;;
    all)
        facts "$LIMIT_FACTS"
        part1
        part2
        part3
        ;;
esac
clocks after
rm -rf "$SCRATCH"

echo
echo "=== summary of part $PART ($(($(date +%s) - START)) s; every row also in $LOG/summary.txt, logs and JSON beside it)"
printf '%-24s %-9s %8s  %s\n' stage status time "key figure"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
