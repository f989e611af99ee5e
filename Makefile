# gpu-mem build. `make build` needs only Go (the BPF object is committed);
# `make generate` rebuilds that object with clang-19 and IG's BPF headers.

GO ?= go
IG = $(shell $(GO) list -m -f '{{.Dir}}' github.com/inspektor-gadget/inspektor-gadget)
SIM = build/sim
SIM_CFLAGS = -O0 -g -fno-omit-frame-pointer -Wall -Wextra -Werror

.PHONY: setup setup-demo build generate dashboard docs check-generated sim demo image test bench bench-smoke soak fuzz fuzz-seeds clean

# Install toolchains and Go modules (Debian, as root). Cheap when done.
setup:
	./scripts/setup.sh

build: bin/gpumem bin/gpumem-lean

GO_SOURCES = $(shell find . -name '*.go' -not -path './build/*') tracer/gpumem_x86_bpfel.o report/flamegraph.html go.mod go.sum

bin/gpumem: $(GO_SOURCES)
	$(GO) build -o $@ ./cmd/gpumem

# The agent image's build (Dockerfile): every command but image and run,
# without IG's image store, OCI and runtime packages; static.
bin/gpumem-lean: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -tags lean -o $@ ./cmd/gpumem

generate:
	cd tracer && IG=$(IG) $(GO) generate ./...

# The Grafana dashboard, from dashboards/dashboards.go, to dashboards/ and
# the chart. Not part of generate, which test runs: a stale or hand-edited
# dashboard must fail TestOutputsAreGenerated, not be rewritten first.
dashboard:
	$(GO) generate ./dashboards/...

# The CLI and metrics references, docs/reference, from the command tree of
# the full build and the metrics package's list (cmd/gpumem/reference.go).
# Like dashboard, not part of test: TestReferenceIsGenerated fails on a
# stale or hand-edited page.
docs:
	$(GO) generate ./cmd/gpumem/

# The BPF object and its bindings must be what program.bpf.c compiles to.
GENERATED = tracer/gpumem_x86_bpfel.go tracer/gpumem_x86_bpfel.o
check-generated:
	@mkdir -p build && sha256sum $(GENERATED) > build/generated.sha256
	@$(MAKE) -s generate
	@sha256sum --quiet -c build/generated.sha256 || { echo "tracer/: BPF object out of date with program.bpf.c: run make generate"; exit 1; }

# The simulated driver and its workloads. simwork finds libcuda.so.1 beside
# itself (RUNPATH $ORIGIN), so LD_LIBRARY_PATH can point it at another copy.
sim: $(SIM)/libcuda.so.1 $(SIM)/simwork $(SIM)/libc10_cuda.so $(SIM)/nvml/libnvidia-ml.so.1

$(SIM)/libcuda.so.1: tests/simcuda/libcuda.c tests/simcuda/cuda.h
	@mkdir -p $(SIM)
	cc $(SIM_CFLAGS) -O1 -shared -fPIC -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread

# The simulated NVML, which answers from what the simulated driver publishes
# (SIMNVML_DIR); in a folder of its own, so that a test chooses whether a
# program finds it.
$(SIM)/nvml/libnvidia-ml.so.1: tests/simnvml/nvml.c tests/simnvml/nvml.h
	@mkdir -p $(SIM)/nvml
	cc $(SIM_CFLAGS) -O1 -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o $@ $<

# The simulated PyTorch caching allocator, with torch's USDT probes; it
# finds libcuda.so.1 beside itself.
$(SIM)/libc10_cuda.so: tests/simtorch/allocator.cc tests/simcuda/cuda.h $(SIM)/libcuda.so.1 $(SIM)/libc10.so
	c++ -std=c++17 $(SIM_CFLAGS) -O1 -shared -fPIC -o $@ $< -L$(SIM) -l:libcuda.so.1 -l:libc10.so -Wl,--enable-new-dtags,-rpath,'$$ORIGIN'

# torch's libc10.so, beside it: the function its allocator reports an
# out-of-memory to, before it raises.
$(SIM)/libc10.so: tests/simtorch/c10.cc
	c++ -std=c++17 $(SIM_CFLAGS) -O1 -shared -fPIC -o $@ $<

$(SIM)/simwork: tests/workloads/simwork.c tests/simcuda/cuda.h $(SIM)/libcuda.so.1
	cc $(SIM_CFLAGS) -o $@ $< -L$(SIM) -l:libcuda.so.1 -Wl,--enable-new-dtags,-rpath,'$$ORIGIN' -lpthread

# Profile the demo workload on the simulated driver: prints the stacks
# holding the most and writes gpumem-demo.pb.gz (go tool pprof -top it).
# It needs a C compiler and the lean build only, not setup's toolchains for
# the tests: a few minutes on a fresh machine.
setup-demo:
	./scripts/setup.sh demo

demo: setup-demo bin/gpumem-lean $(SIM)/libcuda.so.1 $(SIM)/simwork
	./bin/gpumem-lean record --duration 3s --library $(SIM)/libcuda.so.1 -o gpumem-demo.pb.gz --top 6 -- env SIMWORK_NOWAIT=1 $(SIM)/simwork demo

# The gadget as an Inspektor Gadget image in IG's local store, built with
# local tools (no Docker); gpumem image export IMAGE FILE makes a tarball.
IMAGE ?= gpu-mem:dev
image: setup build
	./bin/gpumem image build -t $(IMAGE) .

# Every test; the end-to-end ones load BPF and need root. The Kubernetes
# tests run a real kube-apiserver and etcd, built once (about 15 minutes)
# and cached outside the repository by scripts/k8s-binaries.sh.
# The packages whose parts run on goroutines of their own are tested
# again under the race detector.
RACE_PACKAGES = ./profiler/ ./symbolize/ ./accounting/ ./control/ ./metrics/ ./pystack/
# tests/promql is a module of its own (Prometheus's module cannot join the
# product's: tests/promql/main.go says why); TestGuideDashboard builds it.
test: setup check-generated build sim
	$(GO) vet ./...
	cd tests/promql && $(GO) vet ./...
	$(MAKE) -s bench-smoke
	GPUMEM_K8S_BIN=$$(./scripts/k8s-binaries.sh) $(GO) test -count=1 -timeout 60m ./...
	$(GO) test -race -count=1 -timeout 15m $(RACE_PACKAGES)

clean:
	rm -rf bin build

# Fuzz every parser of untrusted data and every output writer, one target
# after another, FUZZTIME each (docs/fuzzing.md). Not part of test: there,
# the seed corpora (testdata/fuzz) run as plain cases. A crash is written
# to the package's testdata/fuzz/FuzzX/ and reported at the end.
# Go 1.26 may fail a run at FUZZTIME with "context deadline exceeded" and
# no input (golang/go#75804, fixed in 1.27): that is not a failure here.
# FUZZMINIMIZETIME bounds the minimizing of each new input by runs, not
# time: a minimizing cut short by a time bound has its worker killed, its
# runs uncounted, and took the whole bound (docs/fuzzing.md).
FUZZTIME ?= 30s
FUZZMINIMIZETIME ?= 100x
FUZZPARALLEL ?= 1
FUZZ_TARGETS = \
	tracer:FuzzDecode \
	discover:FuzzParseMapsLine discover:FuzzLibrariesIn discover:FuzzParseStat \
	usdt:FuzzParseArg usdt:FuzzNotes usdt:FuzzRead \
	symbolize:FuzzParseELF symbolize:FuzzSymbolTable \
	container:FuzzFromCgroupFile kube:FuzzKubeconfig \
	kube:FuzzPodList kube:FuzzWatch \
	pystack:FuzzFrames pystack:FuzzLineTable pystack:FuzzDetect \
	report:FuzzHTML report:FuzzFolded report:FuzzJSON report:FuzzTop report:FuzzPprof
fuzz:
	@mkdir -p build/fuzz; failed=; start=$$(date +%s); \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; log=build/fuzz/$$fn.log; \
		if $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) \
			-parallel $(FUZZPARALLEL) ./$$pkg > $$log 2>&1; then \
			echo "ok    $$pkg $$fn: $$(grep '^fuzz: elapsed' $$log | tail -1 | sed 's/^fuzz: //')"; \
		elif grep -qx '    context deadline exceeded' $$log && ! grep -q 'Failing input written' $$log; then \
			echo "ok    $$pkg $$fn: $$(grep '^fuzz: elapsed' $$log | tail -1 | sed 's/^fuzz: //') (nothing found; failed by Go's race at the deadline, golang/go#75804)"; \
		else \
			echo "FAIL  $$pkg $$fn ($$log):"; grep -v '^fuzz: elapsed' $$log | tail -30; failed="$$failed $$t"; \
		fi; \
	done; \
	echo "fuzz: $(words $(FUZZ_TARGETS)) targets, $(FUZZTIME) each, in $$(( $$(date +%s) - start )) s"; \
	if [ -n "$$failed" ]; then echo "fuzz: failed:$$failed (inputs in each package's testdata/fuzz)"; exit 1; fi

# Write the seed corpora again (testdata/fuzz): each package's TestWriteSeeds
# (seeds_test.go, built only with the fuzzseed tag, so not by test), run by
# go generate. Needs cc and c++. The seeds come out as committed, byte for
# byte (git diff shows a change), but those read from a live process
# (FuzzFrames's memory, FuzzLibrariesIn's maps: addresses differ each run),
# written only with RECORD=1, which needs the pyenv interpreters.
RECORD ?=
fuzz-seeds:
	GPUMEM_RECORD_SEEDS=$(RECORD) $(GO) generate -tags fuzzseed -run fuzzseed ./...

# Benchmarks, side by side in one run: writes BENCHMARKS.md (about 4 minutes).
# The GPU sections come from bench/gpu/MODEL.md and RESULTS.md, made on the
# GPU machine (bench/README.md says how).
bench: setup build sim
	$(GO) run ./bench -o BENCHMARKS.md

# A short run of every benchmark: checks the harness, not the figures.
bench-smoke: build sim
	$(GO) run ./bench -smoke -o build/BENCHMARKS-smoke.md

# The soak, not part of test (30 minutes, as root): the agent under churn
# (a new process every second, native and Python, the driver unloaded and
# loaded again, over 100,000 distinct stacks, the Pyroscope receiver down
# 30 s every 5 minutes), each process's books checked against its own
# counts, the agent's RSS, goroutines, heap and open files sampled. Writes
# bench/soak/RESULTS.md (copied into BENCHMARKS.md by bench); every sample
# and the agent's log go to build/soak/. Fails when a
# figure grew or a book is off. SOAKFLAGS='-duration 3m' for a short one.
SOAKFLAGS ?=
soak: setup build sim
	$(GO) run ./bench/soak $(SOAKFLAGS)
