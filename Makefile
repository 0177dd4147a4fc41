# stoke — the two commands a new user runs: `make demo` and `make test`.
# Everything else here is a helper they call.
BUILD     ?= build
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX    ?= /usr/local
# make stress: how many times in a row each `stress`-labelled test runs (next to a CPU hog).
STRESS_N  ?= 50

.PHONY: all build configure deps test stress demo install clean format asan tsan

all: build

# A first configure by `make`, `make demo` or `make install` builds no tests (they need only gcc,
# make and cmake); `make test` turns them on (and then needs cmocka: make deps).
$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_INSTALL_PREFIX=$(PREFIX) -DSTOKE_BUILD_TESTS=OFF $(CMAKE_ARGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Installs the Debian packages the tests need (cmocka, PoCL's OpenCL device, ...) if missing.
deps:
	@scripts/deps.sh

# A test that could not check what it is for is reported as skipped (exit 77), never passed;
# a build with no tests at all is an error (--no-tests=error).
test: deps
	@# configure again: cmocka may have just been installed
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DSTOKE_BUILD_TESTS=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	ctest --test-dir $(BUILD) --output-on-failure --no-tests=error -j $(JOBS)

# The `stress` tests (every test that runs threads) STRESS_N times in a row each, stopping at
# the first failure, while a CPU hog keeps a core busy: races show up as failures here.
stress: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DSTOKE_BUILD_TESTS=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	scripts/stress.sh $(BUILD) $(STRESS_N)

demo: build
	scripts/demo.sh $(BUILD)

# PREFIX given (make install PREFIX=DIR, or in the environment) always wins, also over a build/
# configured earlier (by make, make demo or make test) for another prefix; without it, the
# prefix build/ was configured with (/usr/local unless CMAKE_ARGS named one).
install: build
	cmake --install $(BUILD)$(if $(filter command line environment,$(origin PREFIX)), --prefix "$(PREFIX)")

asan:
	$(MAKE) test BUILD=build-asan BUILD_TYPE=Debug CMAKE_ARGS="-DSTOKE_SANITIZE=address,undefined -DSTOKE_WERROR=ON"

tsan:
	$(MAKE) test BUILD=build-tsan BUILD_TYPE=Debug CMAKE_ARGS="-DSTOKE_SANITIZE=thread -DSTOKE_WERROR=ON"

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan
