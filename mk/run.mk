# make run [PORT=8080] [MODEL=DIR]: build, make the demo pack (when MODEL is not given), start
# the engine and nginx on 127.0.0.1:PORT in the background, stream one chat reply.
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

run: all $(if $(MODEL),,$(DEMO)/config.json)
	@PORT=$(PORT) MODEL=$(if $(MODEL),$(abspath $(MODEL)),$(abspath $(DEMO))) RUN_DIR=$(RUN_DIR) \
	  BUILD=$(abspath $(BUILD)) mk/run.sh

stop:
	@RUN_DIR=$(RUN_DIR) mk/stop.sh

.PHONY: run stop demo-pack
