# splitserve developer targets. Everything runs inside $(VENV), which `make install` creates and
# fills from requirements/cpu.lock; targets that need it depend on install, which costs a second
# when the environment is already up to date.
#   make serve ARGS="--config my.yaml"      make test PYTEST_ARGS="-x -k router"

VENV        ?= .venv
PY          := $(VENV)/bin/python
LOCK        := requirements/cpu.lock
ARGS        ?=
PYTEST_ARGS ?=
# Never frozen into the lock: pip and the project itself, and the packages scripts/install.sh
# explains leaving out (CUDA torch add-ons that break the CPU torch; the unused nixl CUDA 12 backend).
LOCK_DROP   := pip|splitserve|torchvision|torchaudio|torchcodec|nixl[-_]cu12

SHELL       := bash
.SHELLFLAGS := -euo pipefail -c

.PHONY: help install serve test test-fast chaos bench lock clean

# List the targets.
help:
	@echo "make install    create/update $(VENV) from $(LOCK) (no-op when up to date)"
	@echo "make serve      run 'splitserve serve \$$(ARGS)'"
	@echo "make test       run the whole test suite (PYTEST_ARGS=... to narrow it)"
	@echo "make test-fast  tests without real vLLM engines (-m 'not engine')"
	@echo "make chaos      fault-injection runs on real engines (-m chaos; long, not in make test)"
	@echo "make bench      run scripts/bench_foundation.py"
	@echo "make lock       rewrite $(LOCK) from what is installed in $(VENV)"
	@echo "make clean      remove $(VENV) and caches"

# Create or update the virtualenv; does nothing when its stamp matches cpu.lock + pyproject.toml.
install:
	@bash scripts/install.sh $(VENV)

# Start the server (router, controller, prefill and decode pools).
serve: install
	$(VENV)/bin/splitserve serve $(ARGS)

# Full test suite, including the slow tests that start real vLLM engines (chaos runs apart).
test: install
	$(PY) -m pytest -m "not chaos" --durations=30 $(PYTEST_ARGS)

# Quick tests only: skip everything marked `engine`.
test-fast: install
	$(PY) -m pytest -m "not engine" $(PYTEST_ARGS)

# Chaos tests: faults injected into the disaggregated path on real engines (tests/e2e/test_chaos.py).
chaos: install
	$(PY) -m pytest -m chaos $(PYTEST_ARGS)

# Foundation benchmark (results go to bench-results/).
bench: install
	$(PY) scripts/bench_foundation.py $(ARGS)

# Freeze the current $(VENV) into the lock, keeping the lock's leading comment block. Use after
# changing versions in the venv by hand; the next `make install` sees the new hash and reinstalls.
lock:
	@test -x $(PY) || { echo "make lock: $(PY) not found; run 'make install' first" >&2; exit 1; }
	@awk '!/^#/ { exit } { print }' $(LOCK) > $(LOCK).new
	@$(PY) -m pip freeze --all --exclude-editable 2> >(grep -v "' is ignored" >&2 || true) \
		| grep -viE '^($(LOCK_DROP))==' >> $(LOCK).new
	@mv $(LOCK).new $(LOCK)
	@echo "wrote $(LOCK) ($$(grep -vc '^#' $(LOCK)) packages)"

# Remove the virtualenv and every generated cache (bench-results/ and models/ are kept).
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
