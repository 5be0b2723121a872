#!/usr/bin/env bash
# Instructions per range, counted by callgrind (repeatable on shared machines, unlike ns): runs
# profile_range_loop with N1 and N2 ranges, profiling on and off, and divides the difference of
# the totals by N2 - N1. Fails above the budgets; exit 77 (ctest: skipped) without valgrind.
#   callgrind_ranges.sh path/to/profile_range_loop
set -euo pipefail
bin=$1
if ! command -v valgrind >/dev/null; then
  echo "valgrind not found: instruction counts skipped (apt-get install valgrind)"
  exit 77
fi
# Budgets: off = the gate (a load and a branch, plus the loop); on = two TSC reads and the ring
# store, the call into record() and the loop.
OFF_MAX=${OFF_MAX:-12}
ON_MAX=${ON_MAX:-60}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total() {  # n mode -> total instructions of the run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bin" "$1" "$2" >/dev/null 2>"$tmp/log"
  awk '/Collected :/ {print $NF}' "$tmp/log"
}
n1=1000
n2=201000
status=0
for mode in off on; do
  a=$(total $n1 $mode)
  b=$(total $n2 $mode)
  per=$(awk -v a="$a" -v b="$b" -v n=$((n2 - n1)) 'BEGIN { printf "%.2f", (b - a) / n }')
  max=$OFF_MAX
  [[ $mode == on ]] && max=$ON_MAX
  verdict=ok
  if awk -v p="$per" -v m="$max" 'BEGIN { exit !(p > m) }'; then verdict=FAIL; status=1; fi
  echo "profile range, profiling $mode: $per instructions per range (budget $max) $verdict"
done
exit $status
