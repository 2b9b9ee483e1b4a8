// llama.cpp as the oracle for a model file: for each prompt (one line of token ids on stdin), the
// mean next-token NLL over the prompt, the top two logits at every prompt position (the prompt read
// in 512-row batches), then greedy tokens decoded one row at a time with their top-two margins.
// Prints one JSON object. Flash attention off, the CPU backend, like the parity goldens.
//
//   bash scripts/llamacpp_reference.sh MODEL.gguf GREEDY < prompts.txt > reference.json
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level;
    (void)text;
    (void)user;
}

static void top2(const float *l, int nv, int *a, int *b) {
    *a = 0;
    *b = -1;
    for (int j = 1; j < nv; j++) {
        if (l[j] > l[*a]) {
            *b = *a;
            *a = j;
        } else if (*b < 0 || l[j] > l[*b]) {
            *b = j;
        }
    }
}

static int decode(struct llama_context *ctx, struct llama_batch *b, const int *toks, int n, int pos0) {
    for (int i = 0; i < n; i++) {
        b->token[i] = toks[i];
        b->pos[i] = pos0 + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = 1;
    }
    b->n_tokens = n;
    return llama_decode(ctx, *b);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL THREADS GREEDY < prompts\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[2]), greedy = atoi(argv[3]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    static char line[1 << 20];
    int first = 1;
    printf("{\"n_vocab\": %d, \"greedy\": %d, \"prompts\": [", nv, greedy);
    while (fgets(line, sizeof line, stdin)) {
        int cap = 1024, n = 0;
        int *toks = malloc(sizeof(int) * (cap + greedy));
        for (char *s = strtok(line, " \n"); s; s = strtok(NULL, " \n")) {
            if (n == cap) {
                cap *= 2;
                toks = realloc(toks, sizeof(int) * (cap + greedy));
            }
            toks[n++] = atoi(s);
        }
        if (n == 0) continue;
        struct llama_context_params cp = llama_context_default_params();
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.n_threads = cp.n_threads_batch = threads;
        cp.n_ctx = n + greedy + 16;
        cp.n_batch = cp.n_ubatch = 512;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        struct llama_batch b = llama_batch_init(512, 0, 1);
        printf("%s\n{\"ids\": [", first ? "" : ",");
        first = 0;
        for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", toks[i]);
        printf("], \"top2\": [");
        double nll = 0;
        int next = 0;
        for (int s0 = 0; s0 < n; s0 += 512) {
            int m = n - s0 < 512 ? n - s0 : 512;
            if (decode(ctx, &b, toks + s0, m, s0)) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            for (int i = 0; i < m; i++) {
                int p = s0 + i, a, c;
                const float *l = llama_get_logits_ith(ctx, i);
                top2(l, nv, &a, &c);
                printf("%s[%d,%.5f,%d,%.5f]", p ? "," : "", a, l[a], c, l[c]);
                if (p + 1 < n) {
                    double z = 0;
                    for (int j = 0; j < nv; j++) z += exp((double)l[j] - l[a]);
                    nll += log(z) - ((double)l[toks[p + 1]] - l[a]);
                }
                if (p == n - 1) next = a;
            }
        }
        printf("], \"mean_nll\": %.8f, \"greedy_ids\": [", n > 1 ? nll / (n - 1) : 0.0);
        double *margins = malloc(sizeof(double) * (greedy + 1));
        {
            const float *l = llama_get_logits_ith(ctx, (n - 1) % 512);
            int a, c;
            top2(l, nv, &a, &c);
            margins[0] = l[a] - l[c];
        }
        for (int g = 0; g < greedy; g++) {
            printf("%s%d", g ? "," : "", next);
            if (g + 1 == greedy) break;
            if (decode(ctx, &b, &next, 1, n + g)) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            const float *l = llama_get_logits_ith(ctx, 0);
            int a, c;
            top2(l, nv, &a, &c);
            margins[g + 1] = l[a] - l[c];
            next = a;
        }
        printf("], \"greedy_top2_margin\": [");
        for (int g = 0; g < greedy; g++) printf("%s%.6f", g ? "," : "", margins[g]);
        printf("]}");
        free(margins);
        free(toks);
        llama_batch_free(b);
        llama_free(ctx);
    }
    printf("\n]}\n");
    llama_model_free(model);
    return 0;
}
