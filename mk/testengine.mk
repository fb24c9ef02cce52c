# build/t/muse-engine-test: muse-engine built from the same sources with -DMUSE_TEST_HOOKS, so
# `serve` accepts test-only flags (--fault-after-tokens N). The end-to-end tests (t/serve_*.t)
# use it for engine-side faults; the shipped build/muse-engine has no hooks.
HOOKS_OBJS   := $(patsubst engine/%.c,$(BUILD)/obj-hooks/%.o,$(LIB_SRCS) engine/muse_engine.c)
MUSE_HOOKS_ENGINE := $(BUILD)/t/muse-engine-test

EXTRA_ALL += $(MUSE_HOOKS_ENGINE)

$(BUILD)/obj-hooks:
	mkdir -p $@

$(BUILD)/obj-hooks/%.o: engine/%.c $(wildcard engine/*.h) | $(BUILD)/obj-hooks
	$(CC) $(CFLAGS) -DMUSE_TEST_HOOKS -c $< -o $@

$(MUSE_HOOKS_ENGINE): $(HOOKS_OBJS) | $(BUILD)/t
	$(CC) $(CFLAGS) $(HOOKS_OBJS) $(LDLIBS) -o $@

# build/t/muse-engine-asan: the same test engine with AddressSanitizer and UBSan; the fault
# tests run again against it (t/serve_faults2_asan.t) so a corrupt ring shows any bad access.
ASAN_FLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_OBJS   := $(patsubst engine/%.c,$(BUILD)/obj-asan/%.o,$(LIB_SRCS) engine/muse_engine.c)
MUSE_ASAN_ENGINE := $(BUILD)/t/muse-engine-asan

EXTRA_ALL += $(MUSE_ASAN_ENGINE)

$(BUILD)/obj-asan:
	mkdir -p $@

$(BUILD)/obj-asan/%.o: engine/%.c $(wildcard engine/*.h) | $(BUILD)/obj-asan
	$(CC) $(CFLAGS) -O1 $(ASAN_FLAGS) -DMUSE_TEST_HOOKS -c $< -o $@

$(MUSE_ASAN_ENGINE): $(ASAN_OBJS) | $(BUILD)/t
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $(ASAN_OBJS) $(LDLIBS) -o $@
