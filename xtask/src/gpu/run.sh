#!/usr/bin/env bash
# solder's device check: `cargo xtask gpu-check` copies this file (xtask/src/gpu/run.sh) into
# target/gpu-check/ beside the `solder` binary it builds. Run on the GPU machine from the
# repository root:   bash target/gpu-check/run.sh
#
# Stages (each under `timeout`, so one hang cannot eat the lease; limits in seconds, each
# overridable by its variable): facts, parity (built-in models on the GPU), goldens (parity on
# every golden checkpoint), sanitizer (compute-sanitizer memcheck over one small run of three
# models), bench (gpu-bench on Llama-3.2-1B's shape). Logs and JSON go to $OUT (the device
# tool's folder) or /tmp/solder-gpu-check: 8 files at most. A summary table is printed last.
set -u
cd "$(dirname "$0")/../.." || exit 2

# 330 s in all: the device call's timeout_s (360) leaves room for a second call in the lease.
LIMIT_FACTS=${LIMIT_FACTS:-20}
LIMIT_PARITY=${LIMIT_PARITY:-60}
LIMIT_GOLDENS=${LIMIT_GOLDENS:-80}
LIMIT_SANITIZER=${LIMIT_SANITIZER:-30} # per model, three models
LIMIT_BENCH=${LIMIT_BENCH:-80}

BIN=target/gpu-check/solder
chmod +x "$BIN" 2>/dev/null
LOG=${OUT:-/tmp/solder-gpu-check}
mkdir -p "$LOG"
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
    echo "=== $name (limit ${limit} s): $*"
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
    SUMMARY+=("$(printf '%-22s %-9s %7s  %s' "$1" "$STAGE_STATUS" "${STAGE_SECONDS}s" "${key:0:110}")")
}

last_line() { grep -E "$2" "$1" 2>/dev/null | tail -n 1; }

# --- facts
: >"$LOG/facts.log"
echo "=== solder device check, $(date -u +%FT%TZ), $(uname -m)"
cat target/gpu-check/BUILD 2>/dev/null | tee -a "$LOG/facts.log"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>&1 | tee -a "$LOG/facts.log"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
        tee -a "$LOG/facts.log"
else
    echo "nvidia-smi: not found" | tee -a "$LOG/facts.log"
fi
stage facts "$LIMIT_FACTS" "$LOG/facts.log" "$BIN" gpu-facts
key=$(last_line "$LOG/facts.log" '^cuda backend:' | cut -d: -f2-)
[ -n "$key" ] && key="$key; JIT $(last_line "$LOG/facts.log" '^modules loaded' | grep -oE '[0-9.]+ s$')"
record facts "$key" "$LOG/facts.log"

# --- parity on the GPU: built-in models, then every golden case
: >"$LOG/parity.log"
stage parity "$LIMIT_PARITY" "$LOG/parity.log" \
    "$BIN" parity --backend cuda --json "$LOG/parity.json"
record "parity (built-in)" "$(last_line "$LOG/parity.log" '^(PASS|FAIL)')" "$LOG/parity.log"
: >"$LOG/goldens.log"
stage goldens "$LIMIT_GOLDENS" "$LOG/goldens.log" \
    "$BIN" parity --backend cuda --goldens tests/fixtures/golden --json "$LOG/goldens.json"
record "parity (goldens)" "$(last_line "$LOG/goldens.log" '^(PASS|FAIL)')" "$LOG/goldens.log"

# --- compute-sanitizer memcheck over a short run of a dense, an MoE and a hybrid model
: >"$LOG/sanitizer.log"
SANITIZER=$(command -v compute-sanitizer)
for candidate in /usr/local/cuda*/bin/compute-sanitizer \
    /usr/local/cuda*/compute-sanitizer/compute-sanitizer /opt/nvidia/*/compute-sanitizer \
    /opt/nvidia/*/*/compute-sanitizer; do
    [ -z "$SANITIZER" ] && [ -f "$candidate" ] && [ -x "$candidate" ] && SANITIZER=$candidate
done
echo "compute-sanitizer: ${SANITIZER:-not found}" | tee -a "$LOG/sanitizer.log"
for model in "--builtin tiny-llama" "--model tests/fixtures/golden/qwen3_moe" \
    "--model tests/fixtures/golden/qwen3_next"; do
    name="memcheck ${model##*[ /]}"
    if [ -z "$SANITIZER" ]; then
        STAGE_STATUS=SKIP STAGE_SECONDS=0
        record "$name" "compute-sanitizer not found"
        continue
    fi
    # shellcheck disable=SC2086 # $model is two words on purpose
    stage "$name" "$LIMIT_SANITIZER" "$LOG/sanitizer.log" \
        "$SANITIZER" --tool memcheck --error-exitcode 3 "$BIN" gpu-step $model --steps 2
    record "$name" "$(last_line "$LOG/sanitizer.log" 'ERROR SUMMARY' | sed 's/^=* *//')" "$LOG/sanitizer.log"
done

# --- gpu-bench: Llama-3.2-1B's shape, random weights
: >"$LOG/bench.log"
stage gpu-bench "$LIMIT_BENCH" "$LOG/bench.log" \
    "$BIN" gpu-bench --synth llama-3.2-1b --runs 100 --max-seconds 1 --json "$LOG/bench.json"
floor=$(last_line "$LOG/bench.log" '^gpu-bench ' | grep -oE 'floor [0-9.]+ us')
key=$(last_line "$LOG/bench.log" '^decode +1 ' | awk -v floor="$floor" \
    '{printf "decode: graph %s us = %s of the %s, eager %s us, %s launches", $5, $7, floor, $4, $3}')
record gpu-bench "$key" "$LOG/bench.log"

echo
echo "=== summary ($(($(date +%s) - START)) s; logs and JSON in $LOG)"
printf '%-22s %-9s %8s  %s\n' stage status time "key figure"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
