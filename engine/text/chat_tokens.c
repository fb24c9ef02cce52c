/* Binds the chat renderer to the real tokenizer: control ids by content, text via muse_tokenize. */
#include "text/chat.h"

int muse_chat_ids_from_tokenizer(const muse_tokenizer *t, muse_chat_ids *ids, muse_err *e)
{
    static const char *const names[6] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eom|>",
                                         "<|eot|>",           "<|start|>",       "<|message|>"};
    int32_t *slots[6] = {&ids->begin_of_text, &ids->end_of_text, &ids->eom,
                         &ids->eot,           &ids->start,       &ids->message};
    for (int k = 0; k < 6; k++) {
        int32_t id = muse_tokenizer_special_id(t, names[k]);
        if (id < 0)
            return muse_fail(e,
                             "tokenizer.json has no added token %s: the Muse chat format "
                             "needs it; use the pack's own tokenizer.json",
                             names[k]);
        *slots[k] = id;
    }
    return 0;
}

static int tokenize_text(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n,
                         size_t *cap, muse_err *e)
{
    return muse_tokenize((const muse_tokenizer *)ctx, text, len, ids, n, cap, e);
}

int muse_chat_render_tokens(const muse_chat_render *r, const muse_tokenizer *t, int32_t **ids,
                            size_t *n, muse_err *e)
{
    return muse_chat_render_flatten(r, tokenize_text, (void *)t, ids, n, e);
}
