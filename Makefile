# stoke — the two commands a new user runs: `make demo` and `make test`.
# Everything else here is a helper they call.
BUILD     ?= build
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX    ?= /usr/local

.PHONY: all build configure deps test demo install clean format asan tsan

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_ARGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Installs the Debian packages the tests need (cmocka, PoCL's OpenCL device, ...) if missing.
deps:
	@scripts/deps.sh

test: deps
	@# configure again: cmocka may have just been installed
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

demo: build
	scripts/demo.sh $(BUILD)

install: build
	cmake --install $(BUILD)

asan:
	$(MAKE) test BUILD=build-asan BUILD_TYPE=Debug CMAKE_ARGS="-DSTOKE_SANITIZE=address,undefined -DSTOKE_WERROR=ON"

tsan:
	$(MAKE) test BUILD=build-tsan BUILD_TYPE=Debug CMAKE_ARGS="-DSTOKE_SANITIZE=thread -DSTOKE_WERROR=ON"

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan
