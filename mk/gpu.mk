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

# make gpu-carry-small: the carry for one H200 (sm_90a alone, built in build/a90), its large
# binaries gzipped, into build/gpu (under the 64 MiB a call carries with the tree); GPU_OLD=DIR
# adds DIR's muse-engine and muse-bench (an earlier build's) as build/gpu/old, for gpu_check.sh's
# oldnew and abdecode. gpu_check.sh's setup unpacks it; the call is then `bash
# t/tools/gpu_check.sh` with carry build/gpu.
.PHONY: gpu-carry-small
gpu-carry-small:
	$(MAKE) --no-print-directory BUILD=build/a90 CUDA_ARCHS=90a gpu-carry
	rm -rf build/gpu && cp -r build/a90/gpu build/gpu
	rm -rf build/gpu/t/synth-check build/gpu/t/mma-probe build/gpu/obj
	gzip -9 build/gpu/muse-bench build/gpu/muse-engine build/gpu/muse-pack \
		build/gpu/t/exl3-fast-check build/gpu/t/muse-engine-test
	if [ -n "$(GPU_OLD)" ]; then mkdir -p build/gpu/old && \
		for b in muse-engine muse-bench; do strip --strip-debug -o build/gpu/old/$$b $(GPU_OLD)/$$b && \
		gzip -9 build/gpu/old/$$b || exit 1; done; fi
	@du -sh build/gpu

# make trace: t/tools/kernel_trace.c, the CUPTI kernel tracer that gpu_check.sh's step `trace`
# injects (CUDA_INJECTION64_PATH); CUPTI's library rides beside it in the carry
.PHONY: trace
trace: $(BUILD)/t/libkernel-trace.so
$(BUILD)/t/libkernel-trace.so: t/tools/kernel_trace.c | $(BUILD)/t
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -shared -fPIC -isystem $(CUDA_HOME)/include $< \
		-o $@ -L$(CUDA_HOME)/lib64 -lcupti -Wl,-rpath,'$$ORIGIN'
