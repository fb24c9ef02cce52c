# make gpu-carry: what one device call needs to check the CUDA backend on a GPU machine that has
# no Debian packages and no nginx: the binaries built here, the nginx module and test engines,
# and Debian's nginx, libcjson and jsonschema .debs (unpacked there with dpkg -x by t/tools/gpu_check.sh).
# Carry build/gpu; run `bash t/tools/gpu_check.sh` there (docs/gpu.md).
GPU_CARRY := $(BUILD)/gpu
# python3-jsonschema and its two dependencies: the constrained tests' validator (pure Python
# on the device's own python3, PYTHONPATH set by gpu_check.sh)
GPU_DEBS  := nginx nginx-common libcjson1 python3-jsonschema python3-attr python3-pyrsistent

.PHONY: gpu-carry
gpu-carry: all
	rm -rf $(GPU_CARRY) && mkdir -p $(GPU_CARRY)/t $(GPU_CARRY)/nginx $(GPU_CARRY)/debs
	cp $(BUILD)/muse-engine $(BUILD)/muse-pack $(BUILD)/muse-bench $(GPU_CARRY)/
	cp $(BUILD)/t/muse-engine-test $(BUILD)/t/muse-test-engine $(GPU_CARRY)/t/
	if [ -x $(BUILD)/t/exl3-fast-check ]; then cp $(BUILD)/t/exl3-fast-check $(GPU_CARRY)/t/; fi
	if [ -x $(BUILD)/t/synth-check ]; then cp $(BUILD)/t/synth-check $(GPU_CARRY)/t/; fi
	if [ -x $(BUILD)/t/mma-probe ]; then cp $(BUILD)/t/mma-probe $(GPU_CARRY)/t/; fi
	mkdir -p $(GPU_CARRY)/obj && cp $(BUILD)/obj/kernels/linear_fast.o $(GPU_CARRY)/obj/ 2>/dev/null || true
	cp $(BUILD)/nginx/ngx_muse_module.so $(GPU_CARRY)/nginx/
	$(MAKE) --no-print-directory $(DEMO_TOK) && gzip -9c $(DEMO_TOK) >$(GPU_CARRY)/o200k-tokenizer.json.gz
	# the carry is at most 64 MiB with the tree: no debug sections (the kernels' fatbins stay)
	strip --strip-debug $(GPU_CARRY)/muse-* $(GPU_CARRY)/t/*
	# the kernel tracer (gpu_check.sh's step trace) and CUPTI's library, which it loads
	if [ -n "$(NVCC_BIN)" ]; then $(MAKE) --no-print-directory trace && \
		cp $(BUILD)/t/libkernel-trace.so $(GPU_CARRY)/t/ && \
		gzip -9c $(CUDA_HOME)/lib64/libcupti.so.13 >$(GPU_CARRY)/t/libcupti.so.13.gz; fi
	cd $(GPU_CARRY)/debs && apt-get download $(GPU_DEBS)
	@du -sh $(GPU_CARRY)

# make trace: t/tools/kernel_trace.c, the CUPTI kernel tracer that gpu_check.sh's step `trace`
# injects (CUDA_INJECTION64_PATH); CUPTI's library rides beside it in the carry
.PHONY: trace
trace: $(BUILD)/t/libkernel-trace.so
$(BUILD)/t/libkernel-trace.so: t/tools/kernel_trace.c | $(BUILD)/t
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -shared -fPIC -isystem $(CUDA_HOME)/include $< \
		-o $@ -L$(CUDA_HOME)/lib64 -lcupti -Wl,-rpath,'$$ORIGIN'
