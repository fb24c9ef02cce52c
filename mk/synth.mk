# build/t/synth-check (t/tools/synth_check.c): the GPU's synthetic fill against the host's, every
# byte of every tensor, and the timed start of a large shape; run on a GPU machine
# (t/tools/gpu_check.sh step synth). It reads the CUDA backend's internals, so it needs CUDA.
ifneq ($(NVCC_BIN),)
SYNTH_CHECK := $(BUILD)/t/synth-check
EXTRA_ALL += $(SYNTH_CHECK)
$(SYNTH_CHECK): t/tools/synth_check.c $(LIB) | $(BUILD)/t
	@mkdir -p $(BUILD)/obj/t
	$(CC) $(CFLAGS) $(DEPFLAGS) -isystem $(CUDA_HOME)/include -MF $(BUILD)/obj/t/synth-check.d $< \
	  $(LIB) $(LDLIBS) -o $@
endif
