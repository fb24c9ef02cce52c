# build/muse-bench: the speed benchmarks (docs/benchmarks.md), one file a job under engine/bench/.
BENCH_SRCS := $(wildcard engine/bench/*.c)
MUSE_BENCH := $(BUILD)/muse-bench

EXTRA_ALL += $(MUSE_BENCH)

$(MUSE_BENCH): $(BENCH_SRCS) $(wildcard engine/bench/*.h) $(ENGINE_H) $(LIB) | $(BUILD)
	$(CC) $(CFLAGS) $(BENCH_SRCS) $(LIB) $(LDLIBS) -o $@
