/* The fast attention on the CUDA backend (kernels/attention_fast.cu): the workspace its split
 * partials need and the longest key range a layer's rows read. Whether it runs is a function of
 * the model's shape and the path alone (head_dim, GQA group), never of the batch. */
#include "backend/cuda/cuda_internal.h"
#include "kernels/attention_fast.cuh"
#include "model/kv_addr.h"

int64_t cuda_attn_max_len(const cuda_backend *c, int layer)
{
    const muse_config *cfg = &c->base.model->cfg;
    int64_t full = c->base.kv.blocks_per_seq * MUSE_KV_BLOCK;
    if (cfg->attn_kind[layer] == MUSE_ATTN_SLIDING && cfg->sliding_window > 0 &&
        cfg->sliding_window < full)
        return cfg->sliding_window;
    return full;
}

size_t cuda_attn_workspace(const cuda_backend *c, const cuda_rank *rk, long rows)
{
    const muse_config *cfg = &c->base.model->cfg;
    long hd = (long)cfg->head_dim, group = (long)(cfg->n_heads / cfg->n_kv_heads);
    if (c->base.kernels != MUSE_KERNELS_FAST || !muse_k_attention_fast_fits(hd, group)) return 0;
    int64_t most = 0;
    for (int i = 0; i < (int)cfg->num_layers; i++)
        if (cuda_attn_max_len(c, i) > most) most = cuda_attn_max_len(c, i);
    return muse_k_attention_fast_workspace((long)(rk->heads.q1 - rk->heads.q0), hd, most, rows);
}
