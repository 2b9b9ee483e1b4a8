// Prints the top-5 logits at every position of a token sequence as llama.cpp computes them.
// Built by scripts/llamacpp_probe.sh; the parity goldens match flash-attn mode 0.
// Prints top-k logits at every position for a list of token ids, under a chosen flash-attention mode.
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    // usage: logits MODEL FA(-1|0|1) THREADS id id id ...
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    struct llama_context_params cp = llama_context_default_params();
    cp.flash_attn_type = atoi(argv[2]);
    cp.n_threads = cp.n_threads_batch = atoi(argv[3]);
    int n = argc - 4;
    cp.n_ctx = n + 16; cp.n_batch = 512; cp.n_ubatch = 512;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    llama_token * toks = malloc(sizeof(llama_token) * n);
    for (int i = 0; i < n; i++) toks[i] = atoi(argv[4 + i]);
    int chunk = getenv("CHUNK") ? atoi(getenv("CHUNK")) : n;
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    float * all = malloc(sizeof(float) * (size_t)nv * n);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int s0 = 0; s0 < n; s0 += chunk) {
      int m = n - s0 < chunk ? n - s0 : chunk;
      for (int i = 0; i < m; i++) { b.token[i] = toks[s0+i]; b.pos[i] = s0+i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1; }
      b.n_tokens = m;
      if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
      for (int i = 0; i < m; i++) memcpy(all + (size_t)(s0+i)*nv, llama_get_logits_ith(ctx, i), sizeof(float)*nv);
    }
    for (int i = 0; i < n; i++) {
        float * l = all + (size_t)i*nv;
        printf("%d", i);
        int used[5] = {-1,-1,-1,-1,-1};
        for (int k = 0; k < 5; k++) { int best = -1; for (int j = 0; j < nv; j++) { int skip=0; for(int u=0;u<k;u++) if(used[u]==j) skip=1; if(!skip && (best<0 || l[j]>l[best])) best=j; } used[k]=best; printf(" %d:%.4f", best, l[best]); }
        printf("\n");
    }
    return 0;
}
