#!/usr/bin/env bash
# solder's device check: `cargo xtask gpu-check` copies this file (xtask/src/gpu/run.sh) into
# target/gpu-check/ beside the `solder` binary it builds. Run on the GPU machine from the
# repository root:   bash target/gpu-check/run.sh
#
# Stages, each under `timeout` (so one hang cannot eat the lease; limits in seconds, each
# overridable by its variable): facts and clocks; parity (built-in models, then every golden
# checkpoint) on the GPU; gpu-step checks (eager == graph replay == a second run, byte for
# byte, past 4,096 tokens on Llama-3.2-1B's shape; a tiny model against its CPU twin);
# compute-sanitizer memcheck (three models), racecheck and synccheck (a tiny model); ncu's
# per-kernel time and DRAM bytes over one decode and one 16-wide multi-seq step, as a table
# against the peak and each launch's floor; gpu-bench; gpu-bench --ab (the same model once per
# lever set of AB_LEVERS, timed interleaved, logits bytes checked); clocks again. A tool that is missing
# is a SKIP row naming it. Results go to $OUT (the device tool's folder) or
# /tmp/solder-gpu-check, in eight files: facts.log parity.log parity.json goldens.json
# checks.log bench.log bench.json ncu.csv. A summary table is printed last.
set -u
cd "$(dirname "$0")/../.." || exit 2

# 480 s in all (gpu-check's device call gives 520): well under a 10-minute lease. The A/B
# stage's 105 s came from 25 s more in all (455 s before it) and 80 s trimmed from the others
# (parity, the long step, the twin step, racecheck, synccheck 5 s each, goldens 10, ncu 20,
# gpu-bench 25: it times every ladder width for 0.3 s now, and the A/B re-times the key
# widths). Split-K's lever in the A/B took 20 s more there, from goldens 5, ncu 10 and
# gpu-bench 5. None of these limits has met a device yet: the first run's summary sets them.
LIMIT_FACTS=${LIMIT_FACTS:-15}
LIMIT_PARITY=${LIMIT_PARITY:-35}
LIMIT_GOLDENS=${LIMIT_GOLDENS:-30}
LIMIT_STEP_LONG=${LIMIT_STEP_LONG:-55}   # Llama-3.2-1B's shape, 4,200 tokens, compared
LIMIT_STEP_TWIN=${LIMIT_STEP_TWIN:-25}   # tiny-llama, 4,200 tokens, against the CPU twin
LIMIT_MEMCHECK=${LIMIT_MEMCHECK:-20}     # per model, three models
LIMIT_RACECHECK=${LIMIT_RACECHECK:-25}
LIMIT_SYNCCHECK=${LIMIT_SYNCCHECK:-20}
LIMIT_NCU=${LIMIT_NCU:-50}   # builds the 1B shape (~20 s), profiles 196 kernels
LIMIT_NCU_TABLE=${LIMIT_NCU_TABLE:-10}
LIMIT_BENCH=${LIMIT_BENCH:-30}
LIMIT_AB=${LIMIT_AB:-125}    # 1B shape, one build per variant (7 with five levers), 4 widths
# The levers the A/B stage compares (comma-separated; an unknown name fails the stage, naming
# it): programmatic launch, the six-launch layer, the classic gemv entries, the streaming
# entries without split-K, the o projection folded into attention (its logits differ within
# its rule's tolerance, not byte for byte).
AB_LEVERS=${AB_LEVERS:-pdl,split_rope_kv,gemv_classic,gemv_unsplit,split_resident,qkv_norm_ahead,fold_o_proj}

BIN=${BIN:-target/gpu-check/solder}
chmod +x "$BIN" 2>/dev/null
LOG=${OUT:-/tmp/solder-gpu-check}
mkdir -p "$LOG"
SCRATCH=$(mktemp -d /tmp/solder-gpu-check.XXXXXX)
# One JIT of the PTX per machine, reused by every later process (the default cache is small).
export CUDA_CACHE_MAXSIZE=2147483648
export SOLDER_LOG=${SOLDER_LOG:-warn}
START=$(date +%s)
SUMMARY=()
FAILED=0

# stage NAME LIMIT LOGFILE COMMAND...: runs COMMAND under timeout, appends its output to LOGFILE.
stage() {
    local name=$1 limit=$2 log=$3
    shift 3
    echo
    echo "=== $name (limit ${limit} s): $*" | tee -a "$log"
    local t0 rc ms
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    ms=$((($(date +%s%N) - t0) / 1000000))
    STAGE_SECONDS="$((ms / 1000)).$((ms % 1000 / 100))"
    case $rc in
        0) STAGE_STATUS=ok ;;
        124 | 137) STAGE_STATUS=TIMEOUT; FAILED=1 ;;
        *) STAGE_STATUS="FAIL($rc)"; FAILED=1 ;;
    esac
}

# record NAME KEY LOG: one row of the summary for the stage just run (KEY, else LOG's last
# error line, else its last line).
record() {
    local key=$2
    if [ -z "${key// /}" ] && [ -n "${3:-}" ]; then
        key=$(last_line "$3" 'error|Error|ERROR|panicked')
        [ -z "$key" ] && key="last output: $(last_line "$3" '.')"
    fi
    SUMMARY+=("$(printf '%-24s %-9s %7s  %s' "$1" "$STAGE_STATUS" "${STAGE_SECONDS}s" "${key:0:110}")")
}

# skip NAME WHY: a summary row for a stage that could not run.
skip() {
    STAGE_STATUS=SKIP STAGE_SECONDS=0
    record "$1" "$2"
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
    out=$(nvidia-smi --query-gpu="$CLOCK_FIELDS,$REASONS" --format=csv 2>&1) ||
        out=$(nvidia-smi --query-gpu="$CLOCK_FIELDS" --format=csv 2>&1)
    echo "$out" | tee -a "$LOG/facts.log"
    STAGE_STATUS=ok STAGE_SECONDS=0
    record "clocks $1" "$(echo "$out" | sed -n 2p)"
}

# --- facts
: >"$LOG/facts.log"
echo "=== solder device check, $(date -u +%FT%TZ), $(uname -m)"
tee -a "$LOG/facts.log" 2>/dev/null <target/gpu-check/BUILD
if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>&1 | tee -a "$LOG/facts.log"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
        tee -a "$LOG/facts.log"
fi
clocks before
stage facts "$LIMIT_FACTS" "$LOG/facts.log" "$BIN" gpu-facts
key=$(last_line "$LOG/facts.log" '^cuda backend:' | cut -d: -f2-)
[ -n "$key" ] && key="$key; JIT $(last_line "$LOG/facts.log" '^modules loaded' | grep -oE '[0-9.]+ s$')"
record facts "$key" "$LOG/facts.log"

# --- parity on the GPU: built-in models, then every golden case
: >"$LOG/parity.log"
stage parity "$LIMIT_PARITY" "$LOG/parity.log" \
    "$BIN" parity --backend cuda --json "$LOG/parity.json"
record "parity (built-in)" "$(last_line "$LOG/parity.log" '^(PASS|FAIL)')" "$LOG/parity.log"
stage goldens "$LIMIT_GOLDENS" "$LOG/parity.log" \
    "$BIN" parity --backend cuda --goldens tests/fixtures/golden --json "$LOG/goldens.json"
record "parity (goldens)" "$(last_line "$LOG/parity.log" '^(PASS|FAIL)')" "$LOG/parity.log"

# --- gpu-step: eager == graph == a second run past 4,096 tokens; a tiny model's CPU twin
: >"$LOG/checks.log"
stage "step 1b ctx 4200" "$LIMIT_STEP_LONG" "$LOG/checks.log" \
    "$BIN" gpu-step --synth llama-3.2-1b --context 4200 --width 8 --compare
record "step 1b ctx 4200" "$(last_line "$LOG/checks.log" '^(second identical run|gpu-step )')" "$LOG/checks.log"
stage "step twin ctx 4200" "$LIMIT_STEP_TWIN" "$LOG/checks.log" \
    "$BIN" gpu-step --builtin tiny-llama --context 4200 --compare --cpu-twin
record "step twin ctx 4200" "$(last_line "$LOG/checks.log" '^cpu twin:')" "$LOG/checks.log"

# --- compute-sanitizer: memcheck over a dense, an MoE and a hybrid model; racecheck and
# synccheck over a tiny dense model
SANITIZER=$(find_tool compute-sanitizer)
echo "compute-sanitizer: ${SANITIZER:-not found}" | tee -a "$LOG/checks.log"
# sanitize NAME TOOL LIMIT MODEL...: one compute-sanitizer run of gpu-step.
sanitize() {
    local name=$1 tool=$2 limit=$3
    shift 3
    if [ -z "$SANITIZER" ]; then
        skip "$name" "compute-sanitizer not found"
        return
    fi
    stage "$name" "$limit" "$LOG/checks.log" \
        "$SANITIZER" --tool "$tool" --error-exitcode 3 "$BIN" gpu-step "$@" --steps 2
    record "$name" "$(last_line "$LOG/checks.log" 'ERROR SUMMARY|RACECHECK SUMMARY' | sed 's/^=* *//')" "$LOG/checks.log"
}
sanitize "memcheck tiny-llama" memcheck "$LIMIT_MEMCHECK" --builtin tiny-llama
sanitize "memcheck qwen3_moe" memcheck "$LIMIT_MEMCHECK" --model tests/fixtures/golden/qwen3_moe
sanitize "memcheck qwen3_next" memcheck "$LIMIT_MEMCHECK" --model tests/fixtures/golden/qwen3_next
sanitize "racecheck tiny-llama" racecheck "$LIMIT_RACECHECK" --builtin tiny-llama
sanitize "synccheck tiny-llama" synccheck "$LIMIT_SYNCCHECK" --builtin tiny-llama

# --- ncu: per-kernel time and DRAM bytes over one decode and one 16-wide multi-seq step
: >"$LOG/bench.log"
NCU=$(find_tool ncu)
echo "ncu: ${NCU:-not found}" | tee -a "$LOG/bench.log"
if [ -z "$NCU" ]; then
    skip "ncu" "ncu not found"
else
    stage "ncu profile" "$LIMIT_NCU" "$LOG/bench.log" \
        "$NCU" --profile-from-start off --clock-control none --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        --log-file "$SCRATCH/ncu.csv" \
        "$BIN" gpu-step --synth llama-3.2-1b --context 32 --width 16 --profile
    record "ncu profile" "$(grep -c '^"[0-9]' "$SCRATCH/ncu.csv" 2>/dev/null) CSV lines" "$LOG/bench.log"
    cp "$SCRATCH/ncu.csv" "$LOG/ncu.csv" 2>/dev/null
    stage "ncu table" "$LIMIT_NCU_TABLE" "$LOG/bench.log" \
        "$BIN" gpu-ncu-table --csv "$SCRATCH/ncu.csv" --programs decode:1,multi_seq:16 \
        --synth llama-3.2-1b --context 32 --launches
    # n, time_us, dram_MB, floor_MB, TB/s, %peak, floor_us, floor/time
    for program in decode:1 multi_seq:16; do
        record "ncu $program" "$(last_line "$LOG/bench.log" "^ncu $program total" |
            awk '{printf "%s kernels %s us, %s MB DRAM = %s TB/s (%s of peak); floor %s us = %s of it", $4, $5, $6, $8, $9, $10, $11}')" "$LOG/bench.log"
    done
fi

# --- gpu-bench: Llama-3.2-1B's shape, random weights
stage gpu-bench "$LIMIT_BENCH" "$LOG/bench.log" \
    "$BIN" gpu-bench --synth llama-3.2-1b --runs 100 --max-seconds 0.3 --json "$LOG/bench.json"
key=$(last_line "$LOG/bench.log" '^decode +1 ' | awk \
    '{printf "decode: graph %s us, eager %s us, floor %s us = %s of graph, %s launches", $7, $6, $5, $9, $3}')
record gpu-bench "$key" "$LOG/bench.log"

# --- A/B: the same model per lever set (baseline, each of AB_LEVERS, all together), timed
# interleaved graph and eager at 1, 8, 32 and 128 rows; figures under "ab" in bench.json
stage "gpu-bench A/B" "$LIMIT_AB" "$LOG/bench.log" \
    "$BIN" gpu-bench --synth llama-3.2-1b --ab "$AB_LEVERS" --rounds 6 --runs 10 \
    --max-seconds 4 --json "$LOG/bench.json"
for rows in 1 128; do
    record "A/B rows $rows" "$(last_line "$LOG/bench.log" "^ab rows $rows graph:" | cut -d: -f2-)" "$LOG/bench.log"
done

clocks after
rm -rf "$SCRATCH"

echo
echo "=== summary ($(($(date +%s) - START)) s; logs and JSON in $LOG)"
printf '%-24s %-9s %8s  %s\n' stage status time "key figure"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
