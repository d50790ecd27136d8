# The two commands a new user types are `make run` and `make test`; everything else is here for
# developers. Build folders: build/ (release, CUDA when nvcc is found), build-asan/, build-fuzz/.
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60
PROMPT ?= What is the capital of France? Answer in one sentence.
FUZZ_TARGETS = gguf safetensors tokenizer http openai_request disagg_wire

.PHONY: setup build run test test-asan fuzz gpu-test clean

setup:
	@bash scripts/setup.sh

build: setup
	cmake -S . -B build -G Ninja $(CMAKE_FLAGS)
	cmake --build build -j $(JOBS)

run: build
	./build/pagoda chat --once "$(PROMPT)"

test: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

# RelWithDebInfo: optimized enough that the model and engine tests finish in minutes under ASan.
test-asan: setup
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGODA_SANITIZE=ON -DPAGODA_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure -j $(JOBS)

fuzz: setup
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGODA_FUZZ=ON -DPAGODA_CUDA=OFF
	cmake --build build-fuzz -j $(JOBS) $(addprefix --target fuzz_,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  ./build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 \
	    build-fuzz/corpus/$$t fuzz/seeds/$$t 2>build-fuzz/fuzz_$$t.log \
	    || { tail -n 60 build-fuzz/fuzz_$$t.log; exit 1; }; \
	  grep -E "stat::number_of_executed_units|Done" build-fuzz/fuzz_$$t.log | tail -n 2; \
	done

# The GPU tests, where the whole toolchain (scripts/setup.sh) is installed. The lent GPU machines
# have nvcc, CMake, ninja and g++ but not Debian's dev packages, and no network; there:
#   here:   bash scripts/fetch_device_deps.sh            (.debs into .device-deps/, git-ignored)
#   device: bash scripts/device_build.sh pagoda gpu_tests && ./build/gpu_tests
# (carry .device-deps to the device: the run tool copies ignored paths only when named in carry).
gpu-test: build
	./build/gpu_tests

clean:
	rm -rf build build-asan build-fuzz
