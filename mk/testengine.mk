# Test builds of muse-engine from the same sources, both with -DMUSE_TEST_HOOKS so `serve`
# accepts test-only flags (--fault-after-tokens N ...); the shipped build/muse-engine has none.
#   build/t/muse-engine-test: the end-to-end tests (t/serve_*.t) use it for engine-side faults.
#   build/t/muse-engine-asan: the same with AddressSanitizer and UBSan; t/*_asan.t run tests
#   again against it, so a corrupt ring or pack shows any bad access or leak.
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

# $(call test_engine,NAME,OBJ_DIR,EXTRA_CFLAGS,EXTRA_LDFLAGS,EXTRA_OBJS)
define test_engine
$(1)_OBJS := $$(patsubst engine/%.c,$(BUILD)/$(2)/%.o,$$(LIB_SRCS) engine/cmd/muse_engine.c) $(5)
EXTRA_ALL += $(BUILD)/t/$(1)

$(BUILD)/$(2)/%.o: engine/%.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $(3) -DMUSE_TEST_HOOKS $$(DEPFLAGS) -c $$< -o $$@

$(BUILD)/t/$(1): $$($(1)_OBJS) | $(BUILD)/t
	$$(CC) $$(CFLAGS) $(4) $$($(1)_OBJS) $$(LDLIBS) -o $$@
endef

# Where nvcc is found the hooks engine carries the CUDA backend (the shipped objects: nothing
# in it depends on the hooks), so a GPU test can force a real device fault through it
# (t/stack/serve_gpu_fault.t); the ASan build stays CPU-only.
ifneq ($(NVCC_BIN),)
$(BUILD)/obj-hooks/backend/backend.o: CFLAGS += -DMUSE_HAVE_CUDA -DMUSE_CUDA_ARCHS='"$(foreach a,$(CUDA_ARCHS),sm_$(a))"'
$(BUILD)/obj-hooks/backend/backend.o: mk/testengine.mk # a build from before this rule lacks CUDA
endif
$(eval $(call test_engine,muse-engine-test,obj-hooks,,,$(CUDA_OBJS)))
$(eval $(call test_engine,muse-engine-asan,obj-asan,-O1 $(ASAN_FLAGS),$(ASAN_FLAGS)))
