# make run [PORT=8080] [MODEL=DIR]: install what is missing, build, start the engine and nginx
# on 127.0.0.1:PORT in the background with MODEL (default conf/packs/demo-en, the trained demo
# model, docs/demo-model.md), stream one chat reply. `make demo-pack` makes the random-weight
# pack of vocab 202048 (build/demo/pack) that tests and benchmarks use.
# make stop: stops both by their pids. State lives under RUN_DIR (default run/: logs, pids,
# nginx prefix).
PORT     ?= 8080
RUN_DIR  ?= $(CURDIR)/run
DEMO_TOK := $(BUILD)/demo/tokenizer.json
DEMO     := $(BUILD)/demo/pack

# The demo tokenizer: js-tiktoken's o200k_base converted, with Muse's control tokens.
$(DEMO_TOK): t/tools/tiktoken_to_tokenizer_json.mjs t/node/package-lock.json
	@mkdir -p $(dir $@)
	[ -d t/node/node_modules/js-tiktoken ] || npm ci --prefix t/node --no-audit --no-fund --loglevel=error
	node t/tools/tiktoken_to_tokenizer_json.mjs $@.tmp && mv $@.tmp $@

$(DEMO)/config.json: conf/packs/demo.json $(BUILD)/muse-pack $(DEMO_TOK)
	rm -rf $(DEMO) && $(BUILD)/muse-pack --config conf/packs/demo.json --out $(DEMO) --seed 1 --shards 2
	cp $(DEMO_TOK) $(DEMO)/tokenizer.json

demo-pack: $(DEMO)/config.json

# The trained demo model when this checkout has it (t/tools/demo_finish.sh), else the random pack.
DEMO_EN  := $(if $(wildcard conf/packs/demo-en/config.json),conf/packs/demo-en)
RUN_PACK := $(if $(MODEL),$(MODEL),$(if $(DEMO_EN),$(DEMO_EN),$(DEMO)))

run:
	@$(MAKE) --no-print-directory deps
	@echo "make run: building the engine and the nginx module"
	@$(MAKE) --no-print-directory all $(if $(MODEL)$(DEMO_EN),,$(DEMO)/config.json)
	@echo "make run: pack $(RUN_PACK); starting muse-engine and nginx"
	@PORT=$(PORT) MODEL=$(abspath $(RUN_PACK)) RUN_DIR=$(RUN_DIR) BUILD=$(abspath $(BUILD)) mk/run.sh

stop:
	@RUN_DIR=$(RUN_DIR) mk/stop.sh

.PHONY: run stop demo-pack
