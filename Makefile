# muse: build, test and run. `make run` and `make test` first install what is missing (Debian 12).
CC       ?= gcc
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -Iengine -I.
DEPFLAGS := -MMD -MP
LDLIBS   += -lcjson -lpcre2-8 -lm -pthread
BUILD    := build
NVCC     ?= nvcc

DEB_PACKAGES := build-essential clang libclang-rt-14-dev clang-format cppcheck \
                libcjson-dev libevent-dev libpcre2-dev nginx nginx-dev \
                python3 python3-numpy python3-jsonschema perl curl gnuplot-nox

# engine/: one folder a job (docs/layout.md). engine/cmd/muse_*.c are the programs' main
# files; every other .c under the library folders is libmuse.a. Objects depend on the headers
# they include (-MMD), not on every header.
LIB_DIRS  := abi base pack text grammar model backend backend/cpu tp serve check cmd
MAIN_SRCS := engine/cmd/muse_engine.c engine/cmd/muse_pack.c engine/cmd/muse_quant.c
MAINS     := $(patsubst engine/cmd/muse_%.c,$(BUILD)/muse-%,$(MAIN_SRCS))
LIB_SRCS  := $(filter-out $(MAIN_SRCS),$(foreach d,$(LIB_DIRS),$(wildcard engine/$(d)/*.c)))
LIB_OBJS  := $(patsubst engine/%.c,$(BUILD)/obj/%.o,$(LIB_SRCS))

# The CUDA backend (engine/backend/cuda/ and the kernels/ it launches), built into libmuse.a
# when nvcc is found (make CUDA=0: never); without it the engine is CPU-only and --backend cuda
# says so. Kernels build for sm_90a and sm_90 with -fmad=false: no contraction the CPU
# reference does not do. cudart is linked statically, so the binaries need no CUDA install.
CUDA      ?= 1
NVCC_BIN  := $(if $(filter 1,$(CUDA)),$(firstword $(shell command -v $(NVCC) 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc)))
ifneq ($(NVCC_BIN),)
# the toolkit root as nvcc itself reports it (TOP), so a wrapper script on PATH finds its headers
CUDA_HOME    := $(realpath $(shell $(NVCC_BIN) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ TOP=//p'))
ifeq ($(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h),)
$(error nvcc $(NVCC_BIN) found but no cuda_runtime_api.h under '$(CUDA_HOME)/include': set NVCC=/path/to/cuda/bin/nvcc, or build CPU-only with make CUDA=0)
endif
# the archs built (wgmma needs 90a); muse-engine version lists them and the backend refuses others
CUDA_ARCHS   := 90a 90
NVCCFLAGS    ?= -O2
NVCCFLAGS    += -std=c++17 -fmad=false -Iengine -I. -Xcompiler -Wall \
                $(foreach a,$(CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a))
KERNEL_SRCS  := $(wildcard kernels/*.cu)
KERNEL_OBJS  := $(patsubst kernels/%.cu,$(BUILD)/obj/kernels/%.o,$(KERNEL_SRCS))
CUDA_SRCS    := $(wildcard engine/backend/cuda/*.c)
CUDA_OBJS    := $(patsubst engine/%.c,$(BUILD)/obj/%.o,$(CUDA_SRCS)) $(KERNEL_OBJS)
LDLIBS       += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
$(patsubst engine/%.c,$(BUILD)/obj/%.o,$(CUDA_SRCS)): CFLAGS += -I. -isystem $(CUDA_HOME)/include -DMUSE_CUDA_ARCHS='"$(foreach a,$(CUDA_ARCHS),sm_$(a))"'
$(BUILD)/obj/backend/backend.o: CFLAGS += -DMUSE_HAVE_CUDA -DMUSE_CUDA_ARCHS='"$(foreach a,$(CUDA_ARCHS),sm_$(a))"'
# -MMD -MP: a kernel rebuilds when any header it includes changes, engine/ ones too
$(BUILD)/obj/kernels/%.o: kernels/%.cu
	@mkdir -p $(dir $@)
	$(NVCC_BIN) $(NVCCFLAGS) -MMD -MP -c $< -o $@
endif
LIB       := $(BUILD)/libmuse.a
ENGINE_H  := $(shell find engine -name '*.h')

# C unit tests: t/unit/test_NAME.c -> build/t/test_NAME (TAP on stdout, run by prove).
UNIT_SRCS := $(wildcard t/unit/test_*.c)
UNITS     := $(patsubst t/unit/%.c,$(BUILD)/t/%,$(UNIT_SRCS))

# Fuzz harnesses: t/fuzz/fuzz_NAME.c -> build/fuzz/fuzz_NAME (libFuzzer + ASan, clang).
FUZZ_SRCS := $(wildcard t/fuzz/fuzz_*.c)
FUZZERS   := $(patsubst t/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))

.DEFAULT_GOAL := all
-include mk/*.mk

.PHONY: all deps test test-gpu lint format clean fuzz run stop
all: $(MAINS) $(UNITS) $(EXTRA_ALL)

# `make run` and `make test` run this first: it installs what is missing when root, else it
# prints the one apt-get line to run and stops.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	command -v node >/dev/null && command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	missing=$$(echo $$missing); \
	if [ -z "$$missing" ]; then echo "make deps: all Debian packages present"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "make deps: missing Debian packages; run this once as root, then make again:"; \
	  echo "  apt-get update && apt-get install -y --no-install-recommends $$missing"; exit 1; \
	else echo "make deps: installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

$(BUILD)/obj/%.o: engine/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS) $(CUDA_OBJS)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/muse-%: $(BUILD)/obj/cmd/muse_%.o $(LIB) | $(BUILD)
	$(CC) $(CFLAGS) $< $(LIB) $(LDLIBS) -o $@

$(BUILD)/t/%: t/unit/%.c t/unit/tap.h $(LIB) | $(BUILD)/t
	@mkdir -p $(BUILD)/obj/t
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $(BUILD)/obj/t/$*.d -It/unit $< $(LIB) $(LDLIBS) -o $@

# test_validate also links the nginx module's pure validator (ngx_muse_validate.c: libc and
# cJSON, no nginx), compiled here on its own with the engine's flags.
NGX_VALIDATE_OBJ := $(BUILD)/obj/ngx_muse_validate.o
$(NGX_VALIDATE_OBJ): ngx_muse_validate.c | $(BUILD)/obj
	$(CC) $(CFLAGS) $(DEPFLAGS) -I. -c $< -o $@

$(BUILD)/t/test_validate: t/unit/test_validate.c t/unit/tap.h $(NGX_VALIDATE_OBJ) | $(BUILD)/t
	@mkdir -p $(BUILD)/obj/t
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $(BUILD)/obj/t/test_validate.d -I. -It/unit $< $(NGX_VALIDATE_OBJ) \
	  -lcjson -lm -o $@

FUZZ_CFLAGS := -std=c11 -g -O1 -D_GNU_SOURCE -pthread -Iengine -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
$(BUILD)/fuzz/%: t/fuzz/%.c $(LIB_SRCS) $(ENGINE_H) | $(BUILD)/fuzz
	clang $(FUZZ_CFLAGS) $< $(LIB_SRCS) $(LDLIBS) -o $@
# fuzz_validate: the nginx module's validator, without nginx (its only sources are its own).
$(BUILD)/fuzz/fuzz_validate: t/fuzz/fuzz_validate.c ngx_muse_validate.c ngx_muse_validate.h \
                             engine/abi/muse_limits.h engine/abi/muse_ring.h | $(BUILD)/fuzz
	clang $(FUZZ_CFLAGS) -I. $< ngx_muse_validate.c -lcjson -lm -o $@
fuzz: $(FUZZERS)

$(BUILD) $(BUILD)/obj $(BUILD)/t $(BUILD)/fuzz:
	mkdir -p $@

# The README's test command: every test through prove, then one "N passed, N failed" line.
test:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory all fuzz
	@t/run-tests

# On a GPU machine: kernel-check and the parity tests on the CUDA backend, then the serving
# exactness tests against an engine on --backend cuda (MUSE_TEST_BACKEND), then a real sticky
# device fault (an illegal address) through the hooks engine. Without a GPU the CUDA runs
# print skip lines.
test-gpu: all
	MUSE_OPS_BACKEND=cuda prove t/ops/ops.t t/ops/cuda_logits.t
	MUSE_TEST_BACKEND=cuda prove t/stack/serve_exactness.t
	prove t/stack/serve_gpu_fault.t

LINT_C := $(shell find engine -name '*.[ch]') t/unit/*.c t/unit/*.h t/fuzz/*.c t/tools/*.c
# ngx_muse_module.c is written in nginx's own style and built with nginx's -Werror instead.
lint:
	clang-format --dry-run --Werror $(LINT_C)
	cppcheck --quiet --error-exitcode=1 --std=c11 --enable=warning,portability \
	  --suppress=missingIncludeSystem --inline-suppr -Iengine -I. engine t/unit t/fuzz t/tools

format:
	clang-format -i $(LINT_C)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
