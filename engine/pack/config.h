/* config.json of a muse_spark pack: every field of MUSE_SPARK.md, validated by name. */
#ifndef MUSE_CONFIG_H
#define MUSE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/muse_common.h"

#define MUSE_MAX_LAYERS 512
#define MUSE_MAX_EOS    16

typedef enum { MUSE_ATTN_SLIDING, MUSE_ATTN_FULL } muse_attn_kind;
typedef enum { MUSE_MLP_DENSE, MUSE_MLP_MOE } muse_mlp_kind;

typedef struct muse_config {
    int64_t vocab_size, hidden_size, num_layers;
    int64_t n_heads, n_kv_heads, head_dim;
    muse_attn_kind attn_kind[MUSE_MAX_LAYERS];
    muse_mlp_kind mlp_kind[MUSE_MAX_LAYERS];
    double rope_theta_layer[MUSE_MAX_LAYERS]; /* 0: NoPE */
    int64_t sliding_window;                   /* 0 when no sliding layer */
    double rope_theta, rms_norm_eps, post_norm_eps, qk_scale_factor;
    int64_t intermediate_size; /* dense layers; 0 when none */
    int64_t num_experts, num_experts_per_tok, moe_intermediate_size, num_shared_experts;
    double routed_scaling_factor;
    bool norm_topk_prob, expert_output_norm, tie_word_embeddings;
    double final_logit_softcapping, output_multiplier;
    int64_t bos_token_id; /* -1 when absent */
    int64_t eos_ids[MUSE_MAX_EOS];
    int n_eos;
    int64_t max_position_embeddings;
    /* quantization_config (EXL3.md); per-tensor bits come from the tensors */
    bool quantized;
    double quant_bits, quant_head_bits;
    char quant_codebook[16];
    /* generation_config.json sampling defaults; < 0 when absent */
    double gen_temperature, gen_top_p;
    int64_t gen_top_k;
} muse_config;

/* Parses config.json text. Refuses by name (with the fix) every invalid or unsupported field. */
int muse_config_parse(const char *json, size_t len, muse_config *c, muse_err *e);
/* Reads dir/config.json and, when present, dir/generation_config.json (its eos list wins). */
int muse_config_load(const char *dir, muse_config *c, muse_err *e);

/* Reads one config.json file (--config FILE, no pack around it); errors read "FLAG PATH: why". */
int muse_config_load_file(const char *flag, const char *path, muse_config *c, muse_err *e);
/* The context a serve or plan runs at: *context, or min(max_position_embeddings, 4096) when 0;
 * more than max_position_embeddings is refused naming --context and the most it may be. */
int muse_config_context(const muse_config *c, long long *context, muse_err *e);

/* Reads a whole small file (config, index) into a NUL-terminated malloc'd buffer. */
int muse_read_file(const char *path, size_t max_bytes, char **out, size_t *len, muse_err *e);

#endif
