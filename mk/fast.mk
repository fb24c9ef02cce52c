# The fast EXL3 product (kernels/linear_fast.cu, its wgmma forms linear_fast_wg.cu,
# linear_fast_ws.cu and linear_fast_wr.cu) builds without -fmad=false: its only float
# arithmetic is mma/wgmma and explicit fp16 intrinsics (see the files' opening comments); the
# register form's fused splits add in double as the finish does. The fast attention
# (kernels/attention_fast.cu) too: its fp32 sums contract to FMA, one code path for every row.
# build/t/exl3-fast-check: the standalone GPU check-and-time tool for the product
# (t/tools/exl3_fast_check.cu), run on a GPU machine.
ifneq ($(NVCC_BIN),)
$(BUILD)/obj/kernels/linear_fast.o: NVCCFLAGS := $(filter-out -fmad=false,$(NVCCFLAGS))
$(BUILD)/obj/kernels/linear_fast_wg.o: NVCCFLAGS := $(filter-out -fmad=false,$(NVCCFLAGS))
$(BUILD)/obj/kernels/linear_fast_ws.o: NVCCFLAGS := $(filter-out -fmad=false,$(NVCCFLAGS))
$(BUILD)/obj/kernels/linear_fast_wr.o: NVCCFLAGS := $(filter-out -fmad=false,$(NVCCFLAGS))
$(BUILD)/obj/kernels/attention_fast.o: NVCCFLAGS := $(filter-out -fmad=false,$(NVCCFLAGS))

EXL3_FAST_CHECK := $(BUILD)/t/exl3-fast-check
EXTRA_ALL += $(EXL3_FAST_CHECK)
$(EXL3_FAST_CHECK): t/tools/exl3_fast_check.cu $(LIB) | $(BUILD)/t
	@mkdir -p $(BUILD)/obj/t
	$(NVCC_BIN) $(NVCCFLAGS) -MMD -MP -MF $(BUILD)/obj/t/exl3-fast-check.d $< $(LIB) \
	  -lcjson -lpcre2-8 -levent_core -lm -lpthread -o $@

# build/t/mma-probe: wgmma against mma.sync, bits and rates (t/tools/mma_probe.cu), sm_90a only
ifneq ($(filter 90a,$(CUDA_ARCHS)),)
MMA_PROBE := $(BUILD)/t/mma-probe
EXTRA_ALL += $(MMA_PROBE)
$(MMA_PROBE): t/tools/mma_probe.cu kernels/wgmma.cuh kernels/mma.cuh | $(BUILD)/t
	$(NVCC_BIN) -O2 -std=c++17 -Xcompiler -Wall -gencode=arch=compute_90a,code=sm_90a $< -o $@
endif
endif
