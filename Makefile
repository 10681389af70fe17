# Two commands from a fresh Debian 12 machine:
#   make demo   install what is missing, build, train Fashion-MNIST on 2 processes
#   make test   install what is missing, build, run every test
# Also: make build, make package (accelerant_<version>_amd64.deb in build/), make docs (the API
# reference from the public headers), make bench (rewrites docs/benchmarks.md), make fuzz
# (libFuzzer on the file parsers, FUZZ_SECONDS each), make clean.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)

.PHONY: deps configure build demo test package docs bench fuzz clean

deps:
	@scripts/install-deps

configure: deps
	@test -f $(BUILD_DIR)/build.ninja || cmake -S . -B $(BUILD_DIR) -G Ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Only what the demo needs: its packages (scripts/install-deps --demo), the library and the
# example (the `accelerant` CLI comes with make build). A later `make test` installs the rest of
# the packages; the build then configures itself again. The compiler cache is off for this one
# build: on a fresh machine it holds nothing, and filling it cost about 10% of the build
# (bench/notes/build-goals.md); the objects stay in the build folder for make test.
demo:
	@scripts/install-deps --demo
	@test -f $(BUILD_DIR)/build.ninja || cmake -S . -B $(BUILD_DIR) -G Ninja
	CCACHE_DISABLE=1 cmake --build $(BUILD_DIR) -j $(JOBS) --target fashion_mnist
	$(BUILD_DIR)/bin/fashion_mnist --world_size 2 --epochs 2

test: build
	ctest --test-dir $(BUILD_DIR) -j $(JOBS) --output-on-failure

# docs too: the package installs the API reference when it has been built.
package: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target accelerant accelerant_cli docs
	cd $(BUILD_DIR) && cpack -G DEB

docs: configure
	cmake --build $(BUILD_DIR) --target docs

# The benches are built here, not by make build (bench/CMakeLists.txt).
bench: build
	cmake --build $(BUILD_DIR) -j $(JOBS) --target benches
	bench/run $(BUILD_DIR)

fuzz: deps
	bench/fuzz $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
