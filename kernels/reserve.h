/* reserve.h: the largest work a step can give the ops, as shapes. Each CUDA op's
 * <op>_cuda_reserve (declared in its kernels/<op>.h with what it accepts) reads the shapes it
 * needs, sizes its scratch once outside any capture (graphs cannot allocate), and refuses a
 * shape its kernels cannot take with the numbers, before any step runs. The kernels' own
 * geometry (splits, threads, shared memory) stays inside their .cu files. The forward fills
 * one from the model's configuration and its state's capacity (forward.c ws_make). */
#ifndef TD_KERNELS_RESERVE_H
#define TD_KERNELS_RESERVE_H

#ifdef __cplusplus
extern "C" {
#endif

struct td_reserve {
    int rows;           /* rows of a step */
    int gemm_in;        /* the widest GEMM input (columns of x) */
    int dim;            /* the model's width */
    int hc_mult;        /* hyper-connection streams */
    int n_heads;        /* the attention's heads */
    int head_dim;       /* the attention's d, and the width of its normed and roped vectors */
    int index_head_dim; /* the indexer's d (its compressor's and queries' width); 0: no indexer */
    int index_n_heads;  /* the indexer's heads */
    int rot_dim;        /* rotary dims of every rope */
    int max_keys;       /* keys a row sees at most: its window ring and the compressed entries
                           (every visible one, or its top-k) */
    int entries;        /* compressed entries a sequence holds at most; 0: no compressed layer */
    int comp_slots;     /* rows one compressor window pools at most ((1 + overlap) * rate); 0:
                           none */
    int moe_k;          /* expert picks a row at most (a shared expert folded in counts) */
    int moe_experts;    /* experts a pick may name (the routed ones and the shared) */
    int moe_inter;      /* an expert's intermediate width */
    int markov_rank;    /* a DSpark Markov head's rank; 0: none */
    int markov_slots;   /* its draft slots a block (g) */
    int vocab;          /* entries of a logits row */
    long long quant_weight; /* elements of the largest Q8 / Q4 matrix outside the experts (a wide
                               step decodes it to bf16); 0: none */
};

#ifdef __cplusplus
}
#endif
#endif
