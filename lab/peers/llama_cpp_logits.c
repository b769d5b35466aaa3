// llama.cpp's logits after a prompt, for the lab's agreement check: the model is loaded through
// libllama as llama.cpp's own tools load it, the prompt's token ids (given, so both sides score
// the same ids) are decoded in one batch, and the last position's logits are written as
// little-endian f32.
//   llama_cpp_logits MODEL.gguf OUT.f32 GPU_LAYERS ID [ID ...]
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 GPU_LAYERS ID [ID ...]\n", argv[0]);
        return 2;
    }
    int n = argc - 4;
    llama_token *ids = malloc(sizeof(llama_token) * n);
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long v = strtol(argv[4 + i], &end, 10);
        if (errno || *end || v < 0) {
            fprintf(stderr, "token id `%s` is not a number\n", argv[4 + i]);
            return 2;
        }
        ids[i] = (llama_token)v;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = atoi(argv[3]);
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    for (int i = 0; i < n; i++) {
        if (ids[i] >= n_vocab) {
            fprintf(stderr, "token id %d is outside the vocabulary of %d\n", ids[i], n_vocab);
            return 2;
        }
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + 16;
    cp.n_batch = n;
    cp.n_ubatch = n;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx || llama_decode(ctx, llama_batch_get_one(ids, n)) != 0) {
        fprintf(stderr, "llama.cpp could not decode the %d-token prompt\n", n);
        return 1;
    }
    const float *logits = llama_get_logits_ith(ctx, -1);
    FILE *out = fopen(argv[2], "wb");
    if (!out || fwrite(logits, sizeof(float), n_vocab, out) != (size_t)n_vocab || fclose(out) != 0) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    llama_free(ctx);
    llama_model_free(model);
    free(ids);
    return 0;
}
