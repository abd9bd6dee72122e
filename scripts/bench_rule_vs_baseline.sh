#!/bin/bash
# The disaggregation rule against an earlier commit's default and against colocation, in
# interleaved rounds (issue 27's acceptance run).
#
#   scripts/bench_rule_vs_baseline.sh [--baseline REV] [--candidate REV] [--rounds N]
#       [--rates 2,4,6] [--num-requests 30] [--preset NAME] [--out bench-results/rule-vs-baseline]
#
# Each side runs from a git worktree of its commit (candidate: HEAD by default; baseline:
# e89a9aa, the last commit with the ten-path policy), so that work in progress in this tree
# cannot change what a round measures. Within a round every run uses the same seed (the same
# requests); rounds alternate their order (candidate's `conditional` and `colocated`, then the
# baseline's `conditional`; then the reverse) so that a drift in the machine's load falls on all
# alike. A run that fails to start (a port taken between its choice and its bind on a shared
# machine) is retried once.
#
# The worktrees import their own code: the repository maps `splitserve.router` to `router/` (and
# so on) through the editable install of *this* tree, so each worktree gets links
# `splitserve/router -> ../router` (and the other mapped folders) and runs with PYTHONPATH set to
# its root, ahead of the editable finder. Ray's workers and vLLM's engine processes inherit it.
#
# Results: OUT/round-R/{candidate-conditional,candidate-colocated,baseline}/comparison.json, then
# `scripts/bench_rule_vs_baseline.py OUT` prints the per-round goodput table.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASELINE=e89a9aa CANDIDATE=HEAD ROUNDS=3 RATES=2,4,6 N=30 OUT=$ROOT/bench-results/rule-vs-baseline
PRESET=()  # bench_disagg's workloads (--preset, repeatable): all by default
while [ $# -gt 0 ]; do
  case $1 in
    --baseline) BASELINE=$2; shift 2 ;;
    --candidate) CANDIDATE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --num-requests) N=$2; shift 2 ;;
    --preset) PRESET+=(--preset "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=$ROOT/.venv/bin/python
WORK=$(mktemp -d /tmp/splitserve-bench-XXXXXX)
cleanup() {
  git -C "$ROOT" worktree remove --force "$WORK/candidate" 2>/dev/null
  git -C "$ROOT" worktree remove --force "$WORK/baseline" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
tree() {  # tree NAME REV: a worktree of REV whose `splitserve.*` imports resolve inside it
  git -C "$ROOT" worktree add --detach -f "$WORK/$1" "$2" -q || exit 1
  for d in router controller prefill_workers decode_workers kv_transfer; do
    ln -sfn "../$d" "$WORK/$1/splitserve/$d"
  done
  echo "$1: $(git -C "$WORK/$1" log --oneline -1)"
}
tree candidate "$CANDIDATE"
tree baseline "$BASELINE"
mkdir -p "$OUT"
run() {  # run SIDE CONFIG ROUND
  local dest=$OUT/round-$3/$1-$2
  [ "$1" = baseline ] && dest=$OUT/round-$3/baseline
  (cd "$WORK" && PYTHONPATH=$WORK/$1 "$PY" "$WORK/$1/scripts/bench_disagg.py" --configs "$2" \
    --rates "$RATES" --num-requests "$N" --seed "$3" --rounds 1 ${PRESET[@]+"${PRESET[@]}"} --out "$dest")
}
retry() { "$@" || { echo "=== retry: $*"; sleep 10; "$@"; }; }
for ((r = 0; r < ROUNDS; r++)); do
  echo "=== round $r $(date +%T)"
  if ((r % 2 == 0)); then
    retry run candidate conditional $r; retry run candidate colocated $r; retry run baseline conditional $r
  else
    retry run baseline conditional $r; retry run candidate colocated $r; retry run candidate conditional $r
  fi
done
echo "=== done $(date +%T)"
"$PY" "$ROOT/scripts/bench_rule_vs_baseline.py" "$OUT"
