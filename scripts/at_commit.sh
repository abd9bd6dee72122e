#!/bin/bash
# Run a command against the code of one commit, so that edits in this tree while it runs (a
# benchmark of an hour) cannot change what it measures:
#
#   scripts/at_commit.sh REV COMMAND [ARGS...]
#   scripts/at_commit.sh HEAD .venv/bin/python scripts/bench_routing.py --part multi_turn \
#       --out "$PWD/bench-results/multi-turn"
#
# COMMAND runs in a git worktree of REV (removed afterwards), with this tree's .venv on PATH.
# The repository maps `splitserve.router` to `router/` (and so on) through the editable install
# of *this* tree, so the worktree gets links `splitserve/router -> ../router` (and the other
# mapped folders) and PYTHONPATH set to its root, ahead of the editable finder; Ray's workers and
# vLLM's engine processes inherit it. Relative paths in ARGS are the worktree's: give --out an
# absolute path.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 REV COMMAND [ARGS...]" >&2; exit 2; }
REV=$1; shift
WORK=$(mktemp -d /tmp/splitserve-at-XXXXXX)
trap 'git -C "$ROOT" worktree remove --force "$WORK/tree" 2>/dev/null; rm -rf "$WORK"' EXIT
git -C "$ROOT" worktree add --detach -f "$WORK/tree" "$REV" -q || exit 1
for d in router controller prefill_workers decode_workers kv_transfer; do
  ln -sfn "../$d" "$WORK/tree/splitserve/$d"
done
ln -sfn "$ROOT/.venv" "$WORK/tree/.venv"
echo "at $(git -C "$WORK/tree" log --oneline -1)"
cd "$WORK/tree" && PATH=$ROOT/.venv/bin:$PATH PYTHONPATH=$WORK/tree "$@"
