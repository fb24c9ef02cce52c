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
