/* config.json parsing: every field, defaults, text_config precedence, refusals by name. */
#include "pack/config.h"
#include "tap.h"

/* The extra fields come first: a later duplicate key would be ignored. */
static const char *base =
    "{%s\"model_type\":\"muse_spark\",\"vocab_size\":512,\"hidden_size\":256,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"layer_types\":[\"sliding_attention\",\"full_attention\"],\"sliding_window\":16,"
    "\"num_experts\":8,\"moe_intermediate_size\":128,\"max_position_embeddings\":1024}";

/* Parses base with extra fields appended; returns the rc and leaves the message in e. */
static int parse_with(const char *extra, muse_config *c, muse_err *e)
{
    char buf[4096];
    snprintf(buf, sizeof buf, base, extra);
    e->msg[0] = 0;
    return muse_config_parse(buf, strlen(buf), c, e);
}

static void refuses(const char *json, const char *needle, const char *what)
{
    muse_config c;
    muse_err e = {{0}};
    int rc = muse_config_parse(json, strlen(json), &c, &e);
    ok(rc == -1 && strstr(e.msg, needle) != NULL, "refuses %s (message names '%s')", what, needle);
    if (rc != -1 || !strstr(e.msg, needle)) diag("got rc %d: %s", rc, e.msg);
}

static void refuses_extra(const char *extra, const char *needle, const char *what)
{
    char buf[4096];
    snprintf(buf, sizeof buf, base, extra);
    refuses(buf, needle, what);
}

int main(void)
{
    muse_config c;
    muse_err e = {{0}};
    is_int(parse_with("", &c, &e), 0, "minimal config parses");
    is_int(c.head_dim, 64, "head_dim defaults to hidden/heads");
    is_int(c.num_experts_per_tok, 8 > c.num_experts ? c.num_experts : 8,
           "num_experts_per_tok defaults to 8");
    ok(c.rope_theta == 500000 && c.rope_theta_layer[1] == 500000,
       "rope_theta default 500000 on every layer");
    ok(c.rms_norm_eps == 1e-5 && c.post_norm_eps == 1e-5,
       "eps defaults (post_norm_eps = rms_norm_eps)");
    ok(c.mlp_kind[0] == MUSE_MLP_MOE && c.mlp_kind[1] == MUSE_MLP_MOE,
       "mlp_layer_types default all moe");
    ok(c.norm_topk_prob && !c.expert_output_norm && c.routed_scaling_factor == 1.0,
       "routing defaults");
    ok(c.attn_kind[0] == MUSE_ATTN_SLIDING && c.attn_kind[1] == MUSE_ATTN_FULL, "layer_types read");
    ok(!c.quantized && c.final_logit_softcapping == 0 && c.output_multiplier == 1.0,
       "head defaults");

    is_int(
        parse_with("\"layer_rope_theta\":[10000,0],\"post_norm_eps\":1e-6,\"eos_token_id\":[3,4],",
                   &c, &e),
        0, "optional fields parse");
    ok(c.rope_theta_layer[0] == 10000 && c.rope_theta_layer[1] == 0,
       "layer_rope_theta per layer (0 = NoPE)");
    ok(c.post_norm_eps == 1e-6 && c.n_eos == 2 && c.eos_ids[1] == 4, "post_norm_eps and eos list");

    const char *nested =
        "{\"model_type\":\"muse_spark\",\"hidden_size\":999,\"text_config\":{"
        "\"model_type\":\"muse_spark\",\"vocab_size\":512,\"hidden_size\":256,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":4,"
        "\"layer_types\":[\"full_attention\"],\"num_experts\":4,\"num_experts_per_tok\":2,"
        "\"moe_intermediate_size\":128,\"max_position_embeddings\":64}}";
    is_int(muse_config_parse(nested, strlen(nested), &c, &e), 0, "fields under text_config parse");
    is_int(c.hidden_size, 256, "text_config wins over top level");

    refuses("{\"model_type\":\"llama\"}", "model_type", "an unknown model_type");
    refuses("[1,2]", "not a JSON object", "a config that is not an object");
    refuses("{\"model_type\":\"muse_spark\"}", "'vocab_size' is missing",
            "a missing required field");
    refuses_extra("\"layer_types\":[\"full_attention\"],", "'layer_types' has 1 entries",
                  "layer_types of the wrong length");
    refuses_extra("\"layer_types\":[\"full_attention\",\"chunked\"],", "'layer_types'[1]",
                  "an unknown layer type");
    refuses_extra("\"layer_rope_theta\":[1],", "'layer_rope_theta'",
                  "layer_rope_theta of the wrong length");
    refuses_extra("\"mlp_layer_types\":[\"moe\",\"dense\",\"moe\"],", "'mlp_layer_types' has 3",
                  "mlp_layer_types of the wrong length");
    refuses_extra("\"mlp_layer_types\":[\"moe\",\"sparse\"],", "'mlp_layer_types'[1]",
                  "an unknown mlp type");
    refuses_extra("\"mlp_layer_types\":[\"moe\",\"dense\"],", "'intermediate_size' is missing",
                  "a dense layer without intermediate_size");
    refuses_extra("\"num_key_value_heads\":3,", "not a multiple of num_key_value_heads",
                  "heads that do not divide");
    refuses_extra("\"quantization_config\":{\"quant_method\":\"gptq\"},", "quant_method",
                  "a quantization method that is not exl3");
    refuses_extra("\"rope_scaling\":{\"type\":\"yarn\"},", "rope_scaling", "rope_scaling");
    refuses_extra("\"hidden_act\":\"gelu\",", "hidden_act", "an activation other than silu");
    refuses_extra("\"n_group\":4,", "n_group", "grouped routing");
    refuses_extra("\"attention_bias\":true,", "attention_bias", "attention biases");
    refuses_extra("\"vocab_size\":\"512\",", "'vocab_size' must be an integer",
                  "a string where an integer belongs");
    refuses_extra("\"eos_token_id\":[99999],", "outside the vocabulary",
                  "an eos id outside the vocabulary");
    refuses_extra("\"eos_token_id\":2.5,", "'eos_token_id' must be an integer",
                  "a fractional eos id");
    refuses_extra("\"bos_token_id\":512,", "bos_token_id 512 is outside the vocabulary",
                  "a bos id outside the vocabulary");
    refuses_extra("\"norm_topk_prob\":1,", "'norm_topk_prob' must be true or false",
                  "a number where a bool belongs");
    const char *no_window =
        "{\"model_type\":\"muse_spark\",\"vocab_size\":512,\"hidden_size\":256,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"layer_types\":[\"sliding_attention\"],\"num_experts\":8,"
        "\"moe_intermediate_size\":128,\"max_position_embeddings\":1024}";
    refuses(no_window, "sliding_window", "a sliding layer without sliding_window");
    is_int(parse_with("\"quantization_config\":{\"quant_method\":\"exl3\",\"bits\":2.5,"
                      "\"codebook\":\"mul1\"},",
                      &c, &e),
           0, "an exl3 quantization_config parses");
    ok(c.quantized && c.quant_bits == 2.5 && strcmp(c.quant_codebook, "mul1") == 0,
       "quantization_config fields read");
    /* the context a serve or plan runs at */
    muse_config ctx_cfg = {.max_position_embeddings = 2048};
    long long ctx = 0;
    ok(muse_config_context(&ctx_cfg, &ctx, &e) == 0 && ctx == 2048,
       "context 0: max_position_embeddings when below 4096");
    ctx_cfg.max_position_embeddings = 524288;
    ctx = 0;
    ok(muse_config_context(&ctx_cfg, &ctx, &e) == 0 && ctx == 4096, "context 0: 4096 at most");
    ctx = 524289;
    ok(muse_config_context(&ctx_cfg, &ctx, &e) == -1 && strstr(e.msg, "--context 524289") &&
           strstr(e.msg, "524288"),
       "a context past max_position_embeddings is refused naming --context and the limit");
    ok(muse_config_load_file("--config", "/nonexistent/config.json", &c, &e) == -1 &&
           strstr(e.msg, "--config /nonexistent/config.json"),
       "a missing --config file is refused naming the flag and the path");
    return done_testing();
}
