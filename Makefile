# sglang-replayssm
#   make test           CPU-only: creates .venv (torch, triton 3.6 interpreter, SGLang 0.5.17 --no-deps
#                       + what its server modules import), downloads SGLang 0.5.15/0.5.23 wheels to check
#                       patch targets against, runs pytest (kernels in TRITON_INTERPRET=1) in TEST_JOBS
#                       pytest-xdist workers (default 2); the `slow` kernel tests (full launch-config grid,
#                       real geometries) are left to gpu-test. make test-full: those too, in the interpreter
#   make test-sglang-0.5.23  tests/foundation + tests/patches against SGLang 0.5.23's classes (its wheel, unpacked)
#   make sglang-versions     those suites on 0.5.17 and 0.5.23 -> eval/results/sglang-versions.json
#   make doctor         versions, config, and every patch target: resolved / patched / missing, in the CPU
#                       .venv (on a GPU host: python -m sglang_replayssm doctor)
#   make serve          GPU host: launch the patched server (built-in tiny model unless MODEL=...)
#   make bench-kernels  GPU host: kernel benchmark vs SGLang's stock kernels -> eval/results/
#   make bench-spec     GPU host: spec-verify kernels vs SGLang's verify + commit -> eval/results/
#   make ab             GPU host: A/B of stock SGLang vs the patched launcher on real servers -> eval/results/
#   make soak           GPU host: one server at a time under a bounded chaos client -> eval/results/soak-h200.*
#   make e2e-summary    parity/decode/spec summaries from the A/B results under eval/results/e2e-h200/
#   make gpu-test       GPU host: all the kernel tests on CUDA, in GPU_TEST_JOBS pytest-xdist workers
#   make carry-size     will the tree + CARRY (default .sglang-bundle) fit the device tool's 64 MiB?
#   make verify-sass    CPU: offline sm_90a build of the verify kernels: registers, spills, SASS per variant
#   make venv / sglang-wheels / clean   build the CPU .venv / fetch the SGLang 0.5.15/0.5.23 wheels / remove .venv

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp-replayssm
SGLANG_VERSION := 0.5.17
OTHER_SGLANG := 0.5.15 0.5.23
WHEEL_CACHE := .cache/sglang-wheels
PIP := $(PY) -m pip --disable-pip-version-check
PYTEST_ARGS ?=

.PHONY: test test-full venv doctor serve bench-kernels bench-spec gpu-test clean sglang-wheels ab soak e2e-summary verify-sass carry-size

# the tests check patch targets against the other SGLang releases' wheels: a venv comes with them
venv: $(STAMP) sglang-wheels

$(STAMP): pyproject.toml requirements/test.txt requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c requirements/constraints.txt torch torchvision -r requirements/test.txt
	# triton last and without deps: the CPU interpreter version pinned to the GPU host's (3.6.0)
	$(PIP) install -q --no-deps sglang==$(SGLANG_VERSION) triton==3.6.0
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import torch, triton, sglang, sglang_replayssm; print('venv ok: torch', torch.__version__, 'triton', triton.__version__)"
	touch $(STAMP)

sglang-wheels: $(foreach v,$(OTHER_SGLANG),$(WHEEL_CACHE)/$(v)/.done)

$(WHEEL_CACHE)/%/.done:
	mkdir -p $(WHEEL_CACHE)/$*
	$(PYTHON) -m pip download -q --no-deps -d $(WHEEL_CACHE)/$* sglang==$*
	touch $@

# TEST_JOBS pytest-xdist workers (the cores shared out for torch's threads, tests/conftest.py); worksteal: each
# starts on a contiguous block of the tests and an idle one takes half of a busy one's rest. A per-test time
# limit (pytest-timeout, pyproject.toml) fails a hung test alone; no test collected (exit 5) fails too.
TEST_JOBS ?= 2
PYTEST_RUN = REPLAYSSM_TEST_SGLANG_WHEELS=$(WHEEL_CACHE) $(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal $(PYTEST_ARGS)
test: venv sglang-wheels
	$(PYTEST_RUN)

# the slow kernel tests too, in the interpreter (REPLAYSSM_TEST_FULL=1: the full launch-config grid, real geometries)
test-full: venv sglang-wheels
	REPLAYSSM_TEST_FULL=1 $(PYTEST_RUN)

# the seam and pool tests (tests/foundation, tests/patches) against SGLang 0.5.23's real classes: its wheel is
# unpacked into .cache/sglang-site/0.5.23 and put first on PYTHONPATH in this venv (eval/sglang_versions.py)
.PHONY: test-sglang-0.5.23 sglang-versions
test-sglang-0.5.23: venv sglang-wheels
	$(PY) -m eval.sglang_versions --versions 0.5.23 --jobs $(TEST_JOBS)

# eval/results/sglang-versions.json: the same suites on 0.5.17 and 0.5.23, counts per release (at a commit)
sglang-versions: venv sglang-wheels
	$(PY) -m eval.sglang_versions --versions 0.5.17,0.5.23 --jobs $(TEST_JOBS) --out eval/results/sglang-versions.json

doctor: venv
	$(PY) -m sglang_replayssm doctor

# ---- GPU host targets (python3 with torch+CUDA; SGLang from pip or the offline bundle) ----
GPU_PY ?= python3
MODEL ?=
# the launcher's default is the replay decode/verify path; SERVE_ARGS='--replayssm-replay-ring false' serves
# with the launch checks only (SGLang's own SSM kernels)
SERVE_ARGS ?=
serve:
	$(GPU_PY) -m sglang_replayssm serve $(if $(MODEL),--model $(MODEL),) $(SERVE_ARGS)

bench-kernels:
	GIT_COMMIT=$$(git rev-parse HEAD 2>/dev/null || echo $${GIT_COMMIT:-unknown}) \
	$(GPU_PY) -m eval.bench_kernels --out eval/results/kernels-h200.json

bench-spec:
	GIT_COMMIT=$$(git rev-parse HEAD 2>/dev/null || echo $${GIT_COMMIT:-unknown}) \
	$(GPU_PY) -m eval.bench_spec --out eval/results/spec-kernels-h200.json

# all of tests/kernels on CUDA, slow tests included; the time is Triton compiles on the host's CPU cores:
# GPU_TEST_JOBS pytest-xdist workers (eval/gpu_kernels.sh, tests only). Fails on any failed, errored or cut test.
GPU_TEST_JOBS ?= 16
GPU_TEST_OUT ?= /tmp/replayssm-gpu-tests
gpu-test:
	KERNEL_BENCH=0 TEST_JOBS=$(GPU_TEST_JOBS) TEST_TIMEOUT=$${TEST_TIMEOUT:-1800} OUT=$(GPU_TEST_OUT) GPU_PY=$(GPU_PY) \
		bash eval/gpu_kernels.sh

# A/B harness (eval/ab/): noise floor (stock vs stock) and stock vs staged (the launcher's replay path), same flags
AB_MODEL ?= nemotron-h-8b
AB_BATCH ?= 1,32,128,256
AB_ARMS ?= stock,stock,staged
AB_ARGS ?=
ab:
	GIT_COMMIT=$$(git rev-parse HEAD 2>/dev/null || echo $${GIT_COMMIT:-unknown}) PYTHON=$(GPU_PY) \
	bash eval/gpu_ab.sh --model $(AB_MODEL) --batch $(AB_BATCH) --arms $(AB_ARMS) $(AB_ARGS)

# soak test (eval/soak.py): SOAK_PLAN="MODEL:SPEC:MINUTES ..." (default: eval/gpu_soak.sh's), SOAK_ARGS: eval.soak flags
SOAK_ARGS ?=
soak:
	GIT_COMMIT=$$(git rev-parse HEAD 2>/dev/null || echo $${GIT_COMMIT:-unknown}) PYTHON=$(GPU_PY) \
	bash eval/gpu_soak.sh $(SOAK_ARGS)

e2e-summary: venv
	$(PY) -m eval.e2e_summary eval/results/e2e-h200 --out-dir eval/results

verify-sass: venv
	env -u TRITON_INTERPRET $(PY) -m eval.verify_sass

CARRY ?= .sglang-bundle
carry-size:
	$(PYTHON) -m eval.carry_size $(CARRY)

clean:
	rm -rf $(VENV) .pytest_cache
