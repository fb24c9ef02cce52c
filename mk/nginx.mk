# ngx_muse_module.so, built against Debian's nginx-dev tree with Debian's exact configure flags
# (same module signature as /usr/sbin/nginx), plus the transport test engine.
NGX_SRC       := /usr/share/nginx/src
NGX_BUILDDIR  := $(abspath $(BUILD))/nginx-build
NGX_SO        := $(BUILD)/nginx/ngx_muse_module.so
NGX_CC_OPT    := -g -O2 -fstack-protector-strong -Wformat -Werror=format-security -fPIC -D_FORTIFY_SOURCE=2
NGX_LD_OPT    := -Wl,-z,relro -Wl,-z,now -fPIC
MUSE_TEST_ENGINE := $(BUILD)/t/muse-test-engine

EXTRA_ALL += $(NGX_SO) $(MUSE_TEST_ENGINE)

$(NGX_BUILDDIR)/Makefile: config mk/nginx.mk
	@mkdir -p $(NGX_BUILDDIR)
	cd $(NGX_SRC) && bash -c '. ./conf_flags && ./configure "$${NGX_CONF_FLAGS[@]}" \
	  --with-cc-opt="$(NGX_CC_OPT)" --with-ld-opt="$(NGX_LD_OPT)" \
	  --add-dynamic-module=$(CURDIR) --builddir=$(NGX_BUILDDIR)' > $(NGX_BUILDDIR)/configure.log 2>&1 \
	  || { tail -20 $(NGX_BUILDDIR)/configure.log; exit 1; }

NGX_MUSE_SRCS := ngx_muse_module.c ngx_muse_validate.c ngx_muse_transport.c ngx_muse_status.c \
                 ngx_muse_module.h ngx_muse_validate.h engine/abi/muse_ring.h engine/abi/muse_limits.h \
                 engine/base/sha256.c engine/base/sha256.h engine/base/keyfile.c engine/base/keyfile.h

$(NGX_SO): $(NGX_MUSE_SRCS) $(NGX_BUILDDIR)/Makefile
	$(MAKE) -s -f $(NGX_BUILDDIR)/Makefile -C $(NGX_SRC) modules
	@mkdir -p $(dir $@)
	cp $(NGX_BUILDDIR)/ngx_muse_module.so $@.tmp
	@want=$$(strings /usr/sbin/nginx | grep -E '^[0-9]+,[0-9]+,[0-9]+,[01]+$$' | head -1); \
	got=$$(strings $@.tmp | grep -E '^[0-9]+,[0-9]+,[0-9]+,[01]+$$' | head -1); \
	if [ -z "$$want" ] || [ "$$want" != "$$got" ]; then \
	  echo "ngx_muse_module: signature '$$got' differs from /usr/sbin/nginx '$$want': rebuild with Debian's conf_flags"; \
	  rm -f $@.tmp; exit 1; fi
	@d=$$(mktemp -d); mkdir -p $$d/logs; \
	printf 'load_module %s;\nevents {}\n' "$(abspath $@.tmp)" > $$d/nginx.conf; \
	if ! nginx -q -t -p $$d -c $$d/nginx.conf -g 'error_log stderr; pid nginx.pid;'; then \
	  rm -rf $$d $@.tmp; echo "ngx_muse_module: nginx -t refused the module"; exit 1; fi; rm -rf $$d
	mv $@.tmp $@

# A scripted engine for the transport tests (ring server only, no model).
$(MUSE_TEST_ENGINE): t/tools/muse_test_engine.c engine/serve/ring_server.c engine/serve/ring_server.h engine/base/flags.c engine/base/flags.h engine/base/clock.h engine/abi/muse_ring.h engine/base/muse_common.h engine/base/sha256.c engine/base/sha256.h engine/base/keyfile.c engine/base/keyfile.h | $(BUILD)/t
	$(CC) $(CFLAGS) t/tools/muse_test_engine.c engine/serve/ring_server.c engine/base/flags.c engine/base/sha256.c engine/base/keyfile.c -levent_core -lcjson -lm -pthread -o $@
