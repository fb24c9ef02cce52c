# The fast EXL3 product (kernels/linear_fast.cu) builds without -fmad=false: its only float
# arithmetic is mma and explicit fp16 intrinsics (see its opening comment). The fast attention
# (kernels/attention_fast.cu) too: its fp32 sums contract to FMA, one code path for every row.
# build/t/exl3-fast-check: the standalone GPU check-and-time tool for the product
# (t/tools/exl3_fast_check.cu), run on a GPU machine.
ifneq ($(NVCC_BIN),)
$(BUILD)/obj/kernels/linear_fast.o: NVCCFLAGS := $(filter-out -fmad=false,$(NVCCFLAGS))
$(BUILD)/obj/kernels/attention_fast.o: NVCCFLAGS := $(filter-out -fmad=false,$(NVCCFLAGS))

EXL3_FAST_CHECK := $(BUILD)/t/exl3-fast-check
EXTRA_ALL += $(EXL3_FAST_CHECK)
$(EXL3_FAST_CHECK): t/tools/exl3_fast_check.cu $(LIB) | $(BUILD)/t
	@mkdir -p $(BUILD)/obj/t
	$(NVCC_BIN) $(NVCCFLAGS) -MMD -MP -MF $(BUILD)/obj/t/exl3-fast-check.d $< $(LIB) \
	  -lcjson -lpcre2-8 -levent_core -lm -lpthread -o $@
endif
