#!/usr/bin/env bash
# Side-by-side benchmarks of github.com/kilat-dev/ratelimit and other Go rate limiters.
#
#   bash benchmarks/run.sh                  # full run: 6 interleaved rounds, about 8 minutes on 2 cores
#   QUICK=1 bash benchmarks/run.sh          # smoke test: 2 short rounds, no memory benchmarks, about 80 seconds
#   COUNT=10 BENCHTIME=500ms bash benchmarks/run.sh
#
# The test binary is built once. Every round runs every contender in every scenario once, each in
# a process of its own, so the rounds interleave and a burst of noise on a shared machine lands on
# all contenders alike; benchstat then reports the median of the rounds. Raw results and a copy
# of the tables go to benchmarks/results/<UTC time>/ (not committed).
set -euo pipefail
cd "$(dirname "$0")"

COUNT=${COUNT:-6}
BENCHTIME=${BENCHTIME:-250ms}
MEMORY=${MEMORY:-1}
if [ "${QUICK:-0}" = 1 ]; then
  COUNT=${QUICK_COUNT:-2}
  BENCHTIME=50ms
  MEMORY=0
fi
CPUS=$(nproc)

# benchstat, installed with the go command if it is missing.
BENCHSTAT_VERSION=v0.0.0-20260908200009-22c9c6c9d4da
BENCHSTAT=$(command -v benchstat || true)
if [ -z "$BENCHSTAT" ]; then
  gobin=$(go env GOBIN)
  [ -n "$gobin" ] || gobin="$(go env GOPATH | cut -d: -f1)/bin"
  BENCHSTAT="$gobin/benchstat"
  if [ ! -x "$BENCHSTAT" ]; then
    echo "installing benchstat $BENCHSTAT_VERSION" >&2
    go install "golang.org/x/perf/cmd/benchstat@$BENCHSTAT_VERSION"
  fi
fi

out="results/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
trap 'rm -f "$out/benchmarks.test" "$out/ratelimit.test"' EXIT
go test -c -o "$out/benchmarks.test" .
# The library's own test binary, for one client flooding the limiter from every goroutine.
(cd .. && go test -c -o "benchmarks/$out/ratelimit.test" .)
{
  echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine: $CPUS CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "go:      $(go version)"
  echo "run:     COUNT=$COUNT BENCHTIME=$BENCHTIME, interleaved rounds"
} | tee "$out/machine.txt"

# record FILE NAME BINARY ARGS... runs a test binary's benchmarks and appends their results to
# FILE. It stops the script, showing the binary's output, when the binary fails or reports no
# benchmark whose name starts with NAME: a failed or misspelled benchmark must not pass quietly.
record() {
  local file=$1 name=$2 binary=$3 result
  shift 3
  if ! result=$("$binary" -test.run '^$' "$@" 2>&1) || ! grep -q "^$name" <<<"$result"; then
    echo "$binary $*: failed, or no $name result:" >&2
    echo "$result" >&2
    exit 1
  fi
  echo "$result" >>"$file"
}
# Every scenario and contender runs in a process of its own: in a shared process a contender
# inherits the heap that the ones before it left (its garbage collector's pace, the memory its
# objects land in), which moved a contender's result by a third depending on its place in the list.
# The list comes from one pass of a single iteration each, on one CPU so that no name carries a
# -N suffix; TestContenderNames keeps the names to letters and '-', safe in a -test.bench pattern.
discovery=$(record /dev/stdout BenchmarkLimiters/ "$out/benchmarks.test" -test.benchtime 1x -test.cpu 1 \
  -test.bench '^BenchmarkLimiters$')
benchmarks=$(awk '$1 ~ /^BenchmarkLimiters\/scenario=[a-z]+\/limiter=[a-z-]+$/ { print substr($1, 19) }' <<<"$discovery")
if [ -z "$benchmarks" ] || [ "$(wc -l <<<"$benchmarks")" != "$(grep -c '^BenchmarkLimiters/' <<<"$discovery")" ]; then
  echo "cannot read every BenchmarkLimiters sub-benchmark's name from:" >&2
  echo "$discovery" >&2
  exit 1
fi
for i in $(seq "$COUNT"); do
  echo "round $i of $COUNT" >&2
  for name in $benchmarks; do
    scenario=${name%%/*} limiter=${name#*/}
    record "$out/limiters.txt" "BenchmarkLimiters/$name" "$out/benchmarks.test" -test.benchtime "$BENCHTIME" \
      -test.bench "^BenchmarkLimiters\$/^$scenario\$/^$limiter\$"
    # The parallel scenario again on 1 and on every CPU: throughput must grow with cores.
    if [ "$scenario" = scenario=parallel ]; then
      record "$out/scaling.txt" "BenchmarkLimiters/$name" "$out/benchmarks.test" -test.benchtime "$BENCHTIME" \
        -test.bench "^BenchmarkLimiters\$/^$scenario\$/^$limiter\$" -test.cpu "1,$CPUS"
    fi
  done
  # One client over its limit, from every goroutine: denials must not queue on its counter.
  record "$out/flood.txt" BenchmarkHandlerDenyFlood "$out/ratelimit.test" -test.benchtime "$BENCHTIME" \
    -test.bench '^BenchmarkHandlerDenyFlood$' -test.cpu "1,$CPUS"
done
if [ "$MEMORY" = 1 ]; then
  echo "memory benchmarks" >&2
  record "$out/memory.txt" BenchmarkMemory "$out/benchmarks.test" -test.benchtime 1x -test.bench '^BenchmarkMemory'
fi

{
  echo
  echo "== benchstat: every contender in every scenario (median of $COUNT rounds)"
  "$BENCHSTAT" "$out/limiters.txt"

  echo
  echo "== ratelimit against the fastest peer (medians; ratio = fastest peer / ratelimit)"
  "$BENCHSTAT" -format csv "$out/limiters.txt" 2>/dev/null | awk -F, '
    function show(v) { return v == "" ? "-" : sprintf("%.0fns", v * 1e9) }
    function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.1fx", a / b) }
    $1 == "" && $2 ~ /\/op$/ { unit = $2; next }
    $1 ~ /^Limiters\/scenario=/ {
      split($1, part, "/")
      sc = substr(part[2], 10); lim = substr(part[3], 9); sub(/-[0-9]+$/, "", lim)
      val[unit, sc, lim] = $2
    }
    function table(unit, title,    i, j, sc, v, best, bestName, ours, bare) {
      print ""
      print title
      printf "%-9s %10s %10s %10s  %-20s %8s %8s\n", "scenario", "ratelimit", "noheaders", "xtimerate", "fastest peer", "ratio", "nohdr"
      for (i = 1; i <= nsc; i++) {
        sc = scs[i]; best = ""; bestName = "-"
        for (j = 1; j <= npeers; j++) {
          v = val[unit, sc, peers[j]]
          if (v != "" && (best == "" || v + 0 < best + 0)) { best = v; bestName = peers[j] }
        }
        ours = val[unit, sc, "ratelimit"]; bare = val[unit, sc, "ratelimit-noheaders"]
        printf "%-9s %10s %10s %10s  %-20s %8s %8s\n", sc, show(ours), show(bare), show(val[unit, sc, "xtimerate"]),
          bestName " " show(best), ratio(best, ours), ratio(best, bare)
      }
    }
    END {
      npeers = split("ulule httprate golimiter tollbooth throttled", peers, " ")
      nsc = split("one distinct parallel deny", scs, " ")
      table("sec/op", "wall clock per request (sec/op)")
      table("cpu-sec/op", "CPU time of the process per request (cpu-sec/op; parallel: summed over cores)")
      print ""
      print "the standard headers stripped to storing two values (references; ratio = fastest peer / reference, wall clock):"
      print "ref-fresh stores two constant values, each response in slices of its own; ref-shared, unsafely, the same slices"
      printf "%-9s %10s %10s %10s %8s %8s %8s\n", "scenario", "ratelimit", "ref-fresh", "ref-shared", "ratio", "fresh", "shared"
      for (i = 1; i <= nsc; i++) {
        sc = scs[i]; best = ""
        for (j = 1; j <= npeers; j++) {
          v = val["sec/op", sc, peers[j]]
          if (v != "" && (best == "" || v + 0 < best + 0)) best = v
        }
        printf "%-9s %10s %10s %10s %8s %8s %8s\n", sc, show(val["sec/op", sc, "ratelimit"]),
          show(val["sec/op", sc, "ref-fresh"]), show(val["sec/op", sc, "ref-shared"]), ratio(best, val["sec/op", sc, "ratelimit"]),
          ratio(best, val["sec/op", sc, "ref-fresh"]), ratio(best, val["sec/op", sc, "ref-shared"])
      }
      print ""
      printf "%-9s %10s %10s   allocs/op\n", "scenario", "ratelimit", "noheaders"
      for (i = 1; i <= nsc; i++)
        printf "%-9s %10s %10s\n", scs[i], val["allocs/op", scs[i], "ratelimit"], val["allocs/op", scs[i], "ratelimit-noheaders"]
      print ""
      printf "deny path against allow path (one client), ratelimit: %s vs %s wall, %s vs %s CPU\n",
        show(val["sec/op", "deny", "ratelimit"]), show(val["sec/op", "one", "ratelimit"]),
        show(val["cpu-sec/op", "deny", "ratelimit"]), show(val["cpu-sec/op", "one", "ratelimit"])
    }'

  echo
  echo "== parallel scenario on 1 and on $CPUS CPUs (sec/op falls as throughput grows)"
  "$BENCHSTAT" -col /gomaxprocs -row /limiter -filter '.unit:sec/op' "$out/scaling.txt" 2>/dev/null | grep -v '^goos\|^goarch\|^pkg\|^cpu' || true

  echo
  echo "== one client over its limit flooding ratelimit from every goroutine, on 1 and on $CPUS CPUs"
  "$BENCHSTAT" -col /gomaxprocs -filter '.unit:sec/op' "$out/flood.txt" 2>/dev/null | grep -v '^goos\|^goarch\|^pkg\|^cpu' || true

  if [ -f "$out/memory.txt" ]; then
    echo
    echo "== MemoryKV memory: bytes per tracked client (1,000,000 clients) and a flood over 40 windows"
    grep '^Benchmark' "$out/memory.txt" || cat "$out/memory.txt"
  fi
} | tee "$out/tables.txt"
