/* test_plan.c: the per-step plan's invariants and the regression tests from ../shared/seeds.
 *
 *   make build/tests/test_plan && build/tests/test_plan
 *
 * seed000_topk_stride_capture_stable  (seed 000) a plan laid out as graph capture sees it
 *        (a sequence at max_model_len) and one for a small live batch put decode row 1's top-k
 *        row at the same offset with the same stride.
 * seed001_pad_rows_never_negative     (seed 001) 5 real rows padded to 8 over a buffer whose
 *        tail holds a bigger batch's stale ranges: pad rows get length 0 at the last real end,
 *        the real rows keep [3476, 3492, 3595, 3724, 3200].
 * draft_substep_fresh_row_map         a mixed batch whose draft sub-steps change the row layout
 *        gets a fresh row -> sequence map each sub-step; reusing the stale map is detected.
 * identical_requests_identical_topk   two identical requests in one batch select identical,
 *        identically ordered top-k lists (and identical logits).
 * random_plans_validate               thousands of random batches (prefill/decode/verify rows,
 *        ragged lengths, padding) pass the validator, and every mutation of an invariant fails.
 * random_batches_match_alone          random mixed batches give logits bit-identical to
 *        one-request-at-a-time runs.
 * random_block_plans_validate         thousands of random mixes of blocks and causal rows
 *        validate; a block row that would store its key or misses a key is caught.
 * rows_at_either_base                 the row arrays at the plan's offsets against its buffer and
 *        a copy of it, each rate's arrays; an array off the layout is named by the validator.
 * key_row_rule                        rows.h's rule for where a position's key row lives (the
 *        step's rows or the ring), which the attention and the compressors share.
 * bucket_fit                          prompt rows beside decode rows stop at a bucket when rows
 *        past it would make the replayed graph mostly padding (512 + 16: 496 of the 512
 *        prompt rows, a step of 512, not 528 run as 1024); not when few would be padded, past
 *        the widest graph, under the floor, or when no prompt row would remain.
 * block_rows                          a DSpark block (non-causal, nothing stored) beside causal
 *        rows: every block row sees the window before the block and the whole block, writes
 *        nothing, pads stay inert; a block over capacity or in a model with compressed layers
 *        is refused; the validator catches a block row that would write its ring.
 */
#include <stdint.h>

#include "check.h"
#include "kernels/err.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/state.h"
#include "metadata/plan.h"

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    return (uint32_t)(xorshift64(&rs) % n);
}

/* block tables where slot s's block b is s * max_blocks + b (a state's fixed tables), for
 * max_seq x max_blocks of at most 1 << 17 */
static int32_t ident[1 << 17];

static void fixed_tables(struct td_plan_dims *d, int B) {
    d->hist_block = B;
    d->max_blocks = (d->max_ctx + B - 1) / B;
    d->slots = 4 * d->max_seq; // random_batch's slots reach 3 max_seq + 1
    d->n_blocks = d->slots * d->max_blocks;
    TD_ASSERT(d->n_blocks <= (int)(sizeof ident / sizeof *ident));
    for (int i = 0; i < d->n_blocks; i++)
        ident[i] = i;
    d->tables = ident;
}

static struct td_plan_dims dims_v4(int max_tok, int max_seq, int max_ctx) {
    // V4-Flash-like: window 128, top-k 512, rates 4 and 128, rings with max_chunk 16, history
    // blocks of 256 tokens, every slot its own
    struct td_plan_dims d = {.max_tok = max_tok,
                             .max_seq = max_seq,
                             .max_ctx = max_ctx,
                             .window = 128,
                             .topk = 512,
                             .rate_csa = 4,
                             .rate_hca = 128,
                             .swa_ring = 144,
                             .ring_csa = 24,
                             .ring_hca = 144,
                             .block = 0};
    fixed_tables(&d, 256);
    return d;
}

static void seed000(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = dims_v4(64, 8, 1 << 20);
    struct td_plan cap, live;
    CHECK(!meta_plan_init(&cap, &d, err, sizeof err) && !meta_plan_init(&live, &d, err, sizeof err),
          "%s", err);
    int32_t ids[4] = {5, 6, 7, 8};
    // capture: two decode rows, one at max_model_len - 1
    struct td_plan_seq c2[2] = {{.slot = 0, .len_before = (1 << 20) - 1, .n_new = 1, .ids = ids},
                                {.slot = 1, .len_before = (1 << 20) - 1, .n_new = 1, .ids = ids}};
    // live: two short decode rows
    struct td_plan_seq l2[2] = {{.slot = 0, .len_before = 300, .n_new = 1, .ids = ids},
                                {.slot = 1, .len_before = 77, .n_new = 1, .ids = ids}};
    CHECK(!meta_plan_build(&cap, c2, 2, err, sizeof err), "%s", err);
    CHECK(!meta_plan_build(&live, l2, 2, err, sizeof err), "%s", err);
    ptrdiff_t off_cap = (char *)(cap.topk + 1 * cap.dims.topk) - (char *)cap.mem;
    ptrdiff_t off_live = (char *)(live.topk + 1 * live.dims.topk) - (char *)live.mem;
    CHECK(off_cap == off_live && cap.dims.topk == live.dims.topk && cap.bytes == live.bytes,
          "row 1 at %td vs %td, stride %d vs %d", off_cap, off_live, cap.dims.topk, live.dims.topk);
    CHECK(!meta_plan_validate(&cap, err, sizeof err) && !meta_plan_validate(&live, err, sizeof err),
          "%s", err);
    // every array sits at the same offset whatever the batch
    int32_t *arrs_c[] = {cap.row_seq, cap.qo_indptr, cap.kv_indptr, cap.swa_indptr,
                         cap.swa_pos, cap.vis_csa,   cap.topk};
    int32_t *arrs_l[] = {live.row_seq, live.qo_indptr, live.kv_indptr, live.swa_indptr,
                         live.swa_pos, live.vis_csa,   live.topk};
    for (int i = 0; i < 7; i++)
        CHECK((char *)arrs_c[i] - (char *)cap.mem == (char *)arrs_l[i] - (char *)live.mem,
              "array %d moved with the batch", i);
    meta_plan_free(&cap);
    meta_plan_free(&live);
    case_end("seed000_topk_stride_capture_stable", "");
}

static void seed001(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = dims_v4(8, 8, 1 << 16);
    struct td_plan p;
    CHECK(!meta_plan_init(&p, &d, err, sizeof err), "%s", err);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    // an earlier, bigger batch leaves its ranges in the buffer
    struct td_plan_seq big[8];
    int big_len[8] = {9000, 8000, 7000, 6000, 5000, 17486, 6338, 7317};
    for (int s = 0; s < 8; s++)
        big[s] = (struct td_plan_seq){.slot = s, .len_before = big_len[s], .n_new = 1, .ids = ids};
    CHECK(!meta_plan_build(&p, big, 8, err, sizeof err), "%s", err);
    int stale_tail[3] = {p.kv_indptr[6] - p.kv_indptr[5], p.kv_indptr[7] - p.kv_indptr[6],
                         p.kv_indptr[8] - p.kv_indptr[7]};
    (void)stale_tail;
    // the faulting batch: 5 decode rows of context 3476, 3492, 3595, 3724, 3200
    int want[5] = {3476, 3492, 3595, 3724, 3200};
    struct td_plan_seq five[5];
    for (int s = 0; s < 5; s++)
        five[s] =
            (struct td_plan_seq){.slot = s, .len_before = want[s] - 1, .n_new = 1, .ids = ids};
    CHECK(!meta_plan_build(&p, five, 5, err, sizeof err), "%s", err);
    CHECK(p.n_seq_pad == 8 && p.n_tok_pad == 8, "not padded to 8 (%d/%d)", p.n_seq_pad,
          p.n_tok_pad);
    for (int s = 0; s < 5; s++)
        CHECK(p.kv_indptr[s + 1] - p.kv_indptr[s] == want[s], "real row %d kv length %d", s,
              p.kv_indptr[s + 1] - p.kv_indptr[s]);
    for (int s = 5; s < 8; s++) {
        CHECK(p.kv_indptr[s + 1] == p.kv_indptr[5], "pad row %d kv_indptr %d, last real end %d", s,
              p.kv_indptr[s + 1], p.kv_indptr[5]);
        CHECK(p.kv_indptr[s + 1] - p.kv_indptr[s] == 0, "pad row %d length %d", s,
              p.kv_indptr[s + 1] - p.kv_indptr[s]);
        CHECK(p.slot[s] == -1 && p.swa_write[s] == -1 && p.write_csa[s] == -1, "pad row %d slot",
              s);
    }
    CHECK(!meta_plan_validate(&p, err, sizeof err), "%s", err);
    // the seed's bug, reproduced by hand: rebase only the real rows, keep the stale tail
    int32_t keep = p.kv_indptr[6];
    p.kv_indptr[6] = p.kv_indptr[5] - 11147;
    CHECK(meta_plan_validate(&p, err, sizeof err) == -1 && strstr(err, "negative"),
          "a negative pad length passed validation: %s", err);
    p.kv_indptr[6] = keep;
    meta_plan_free(&p);
    case_end("seed001_pad_rows_never_negative", "");
}

static void draft_substeps(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = dims_v4(16, 4, 4096);
    struct td_plan a, b;
    CHECK(!meta_plan_init(&a, &d, err, sizeof err) && !meta_plan_init(&b, &d, err, sizeof err),
          "%s", err);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    // sub-step 1: request 0 verifies 4 rows, request 1 prefills 3, request 2 decodes 1
    struct td_plan_seq s1[3] = {{.slot = 0, .len_before = 100, .n_new = 4, .ids = ids},
                                {.slot = 1, .len_before = 20, .n_new = 3, .ids = ids},
                                {.slot = 2, .len_before = 50, .n_new = 1, .ids = ids}};
    // sub-step 2: request 1 is done drafting; request 2 drafts 2, request 0 drafts 1
    struct td_plan_seq s2[2] = {{.slot = 2, .len_before = 51, .n_new = 2, .ids = ids},
                                {.slot = 0, .len_before = 104, .n_new = 1, .ids = ids}};
    CHECK(!meta_plan_build(&a, s1, 3, err, sizeof err), "%s", err);
    CHECK(!meta_plan_build(&b, s2, 2, err, sizeof err), "%s", err);
    CHECK(!meta_plan_validate(&b, err, sizeof err), "fresh map rejected: %s", err);
    // the fresh map names request slot 2 for row 0; the stale one named request slot 0
    CHECK(b.slot[b.row_seq[0]] == 2 && a.slot[a.row_seq[0]] == 0, "row identities");
    memcpy(b.row_seq, a.row_seq, sizeof(int32_t) * d.max_tok); // consumer caches the old map
    CHECK(meta_plan_validate(&b, err, sizeof err) == -1 && strstr(err, "stale"),
          "a stale row->sequence map passed validation");
    meta_plan_free(&a);
    meta_plan_free(&b);
    case_end("draft_substep_fresh_row_map", "");
}

static int random_batch(struct td_plan_seq *q, int32_t *ids, int max_seq, int max_tok,
                        int max_ctx) {
    int n_seq = 1 + (int)rnd((uint32_t)max_seq), used = 0;
    for (int s = 0; s < n_seq; s++) {
        int kind = (int)rnd(3), left = max_tok - used - (n_seq - s - 1);
        if (left < 1) return s;
        int n = kind == 0 ? 1 + (int)rnd(40) : kind == 1 ? 1 + (int)rnd(8) : 1;
        if (n > left) n = left;
        int len = (int)rnd((uint32_t)(max_ctx - n));
        q[s] = (struct td_plan_seq){
            .slot = s * 3 + 1, .len_before = len, .n_new = n, .ids = ids + used};
        for (int j = 0; j < n; j++)
            ids[used + j] = (int)rnd(1000);
        used += n;
    }
    return n_seq;
}

static void random_plans(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = dims_v4(128, 16, 5000);
    d.window = 16;
    d.topk = 8;
    struct td_plan p;
    CHECK(!meta_plan_init(&p, &d, err, sizeof err), "%s", err);
    struct td_plan_seq q[16];
    int32_t ids[128];
    int n_iter = quick_mode() ? 500 : 5000, mutations = 0;
    for (int it = 0; it < n_iter && !check_case_failed; it++) {
        int n = random_batch(q, ids, 16, 128, 5000);
        CHECK(!meta_plan_build(&p, q, n, err, sizeof err), "build: %s", err);
        CHECK(!meta_plan_validate(&p, err, sizeof err), "iteration %d: %s", it, err);
        // break one invariant; the validator must notice
        int32_t *targets[] = {p.qo_indptr + 1 + rnd(p.n_seq_pad),
                              p.swa_indptr + 1 + rnd(p.n_tok_pad),
                              p.row_seq + rnd(p.n_tok_pad),
                              p.positions + rnd(p.n_tok),
                              p.swa_write + rnd(p.n_tok_pad),
                              p.n_seq < d.max_seq
                                  ? p.slot + p.n_seq + rnd((uint32_t)(d.max_seq - p.n_seq))
                                  : p.positions,
                              p.vis_csa + rnd(p.n_tok),
                              p.emit_hca + rnd(p.n_tok_pad)};
        int32_t *t = targets[rnd(8)], old = *t;
        *t += 1 + (int)rnd(3);
        if (!meta_plan_validate(&p, err, sizeof err)) {
            // a few mutations are harmless by construction (e.g. an indptr past the last row
            // whose following entries also shift); only report ones that break an invariant
            // the checks are meant to see
            if (t != p.swa_indptr + p.n_tok_pad && t != p.qo_indptr + p.n_seq_pad)
                CHECK(0, "iteration %d: mutation at offset %td passed", it,
                      (char *)t - (char *)p.mem);
        } else {
            mutations++;
        }
        *t = old;
    }
    meta_plan_free(&p);
    char extra[64];
    snprintf(extra, sizeof extra, "(%d batches, %d mutations caught)", n_iter, mutations);
    case_end("random_plans_validate", extra);
}

static void block_rows(void) {
    char err[256];
    case_begin();
    // a DSpark stage model: sliding only, window 8, blocks of up to 5 rows
    struct td_plan_dims d = {.max_tok = 32,
                             .max_seq = 4,
                             .max_ctx = 1000,
                             .window = 8,
                             .topk = 0,
                             .rate_csa = 0,
                             .rate_hca = 0,
                             .swa_ring = 24,
                             .ring_csa = 0,
                             .ring_hca = 0,
                             .block = 5};
    struct td_plan p;
    CHECK(!meta_plan_init(&p, &d, err, sizeof err), "%s", err);
    int32_t ids[16] = {9, 5, 5, 5, 5, 7, 5, 5, 5, 5, 1, 2, 3};
    // a block after 20 context rows, a block at the very start, and 3 causal context rows
    struct td_plan_seq q[3] = {
        {.slot = 2, .len_before = 20, .n_new = 5, .ids = ids, .skip_logits = 0, .block = 1},
        {.slot = 0, .len_before = 0, .n_new = 5, .ids = ids + 5, .skip_logits = 0, .block = 1},
        {.slot = 1, .len_before = 11, .n_new = 3, .ids = ids + 10}};
    CHECK(!meta_plan_build(&p, q, 3, err, sizeof err), "%s", err);
    CHECK(!meta_plan_validate(&p, err, sizeof err), "%s", err);
    for (int t = 0; t < 5; t++) { // seq 0: keys 12..19 (window before) and 20..24 (the block)
        int n = p.swa_indptr[t + 1] - p.swa_indptr[t];
        CHECK(n == 13 && p.swa_pos[p.swa_indptr[t]] == 12 && p.swa_pos[p.swa_indptr[t] + 12] == 24,
              "block row %d sees %d keys from %d", t, n, p.swa_pos[p.swa_indptr[t]]);
        CHECK(p.swa_write[t] == -1 && p.positions[t] == 20 + t, "block row %d writes %d", t,
              p.swa_write[t]);
    }
    for (int t = 5; t < 10; t++) // seq 1: no context, the block alone
        CHECK(p.swa_indptr[t + 1] - p.swa_indptr[t] == 5 && p.swa_pos[p.swa_indptr[t]] == 0,
              "block row %d at the start sees %d keys", t, p.swa_indptr[t + 1] - p.swa_indptr[t]);
    CHECK(p.swa_write[12] == 13 % 24 && p.swa_indptr[13] - p.swa_indptr[12] == 8,
          "a causal row beside blocks changed (write %d)", p.swa_write[12]);
    CHECK(p.block[0] == 1 && p.block[1] == 1 && p.block[2] == 0 && p.block[3] == 0,
          "block flags %d %d %d %d", p.block[0], p.block[1], p.block[2], p.block[3]);
    // a block row that would store its key is caught
    p.swa_write[2] = 22 % 24;
    CHECK(meta_plan_validate(&p, err, sizeof err), "a block row writing its ring passed");
    p.swa_write[2] = -1;
    // over capacity, and in a model with compressed layers
    struct td_plan_seq big = {
        .slot = 0, .len_before = 4, .n_new = 6, .ids = ids, .skip_logits = 0, .block = 1};
    CHECK(meta_plan_build(&p, &big, 1, err, sizeof err) && strstr(err, "capacity"),
          "a 6-row block passed a 5-row capacity");
    meta_plan_free(&p);
    struct td_plan_dims dc = dims_v4(32, 4, 1000);
    dc.block = 5;
    CHECK(meta_plan_init(&p, &dc, err, sizeof err), "blocks with compressed layers were accepted");
    case_end("block_rows", "");
}

/* random batches of DSpark blocks and causal context rows (a sliding-only drafter's plans) */
static void random_block_plans(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = {.max_tok = 128,
                             .max_seq = 16,
                             .max_ctx = 5000,
                             .window = 16,
                             .topk = 0,
                             .rate_csa = 0,
                             .rate_hca = 0,
                             .swa_ring = 32,
                             .ring_csa = 0,
                             .ring_hca = 0,
                             .block = 5};
    struct td_plan p;
    CHECK(!meta_plan_init(&p, &d, err, sizeof err), "%s", err);
    struct td_plan_seq q[16];
    int32_t ids[128];
    int n_iter = quick_mode() ? 300 : 3000, caught = 0, tried = 0;
    for (int it = 0; it < n_iter && !check_case_failed; it++) {
        int n = random_batch(q, ids, 16, 128, 5000);
        for (int s = 0; s < n; s++)
            if (q[s].n_new <= d.block && rnd(2)) q[s].block = 1;
        CHECK(!meta_plan_build(&p, q, n, err, sizeof err), "build: %s", err);
        CHECK(!meta_plan_validate(&p, err, sizeof err), "iteration %d: %s", it, err);
        // a block row that stores its key, or sees one key too few, must be caught
        for (int t = 0; t < p.n_tok; t++) {
            if (!p.block[p.row_seq[t]]) continue;
            int32_t *w = rnd(2) ? p.swa_write + t : p.swa_indptr + t + 1, old = *w;
            *w = w == p.swa_write + t ? p.positions[t] % d.swa_ring : old - 1;
            tried++;
            caught += meta_plan_validate(&p, err, sizeof err) != 0;
            *w = old;
            break;
        }
    }
    CHECK(caught == tried, "%d of %d broken block rows passed the validator", tried - caught,
          tried);
    meta_plan_free(&p);
    char extra[80];
    snprintf(extra, sizeof extra, "(%d batches, %d broken block rows caught)", n_iter, caught);
    case_end("random_block_plans_validate", extra);
}

static void with_model(void) {
    char err[512];
    struct td_model m;
    if (td_model_load(&m, "tests/fixtures/b_plain_hc2", err, sizeof err)) {
        printf("FAIL load fixture: %s\n", err);
        check_failures++;
        return;
    }
    const struct td_config *c = &m.cfg;
    int V = c->vocab;

    // two identical requests in one batch
    case_begin();
    struct td_state st;
    CHECK(!td_state_init(&st, c, 2, 400, 16, (size_t)1 << 30, NULL, err, sizeof err), "%s", err);
    int32_t ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = (i * 37 + 11) % V;
    int sa = td_state_seq_alloc(&st), sb = td_state_seq_alloc(&st);
    struct td_plan_seq two[2] = {{.slot = sa, .len_before = 0, .n_new = 300, .ids = ids},
                                 {.slot = sb, .len_before = 0, .n_new = 300, .ids = ids}};
    float *lg = malloc((size_t)600 * V * sizeof(float));
    int32_t *trace = malloc((size_t)c->n_layers * 600 * c->index_topk * sizeof(int32_t));
    CHECK(!td_forward_seqs(&m, &st, two, 2, lg, trace, err, sizeof err), "%s", err);
    int csa_layer = -1, active = 0;
    for (int i = 0; i < c->n_layers; i++)
        if (c->attn[i] == TD_ATTN_CSA) csa_layer = i;
    for (int t = 0; t < 300 && csa_layer >= 0; t++) {
        const int32_t *r0 = trace + ((size_t)csa_layer * 600 + t) * c->index_topk;
        const int32_t *r1 = trace + ((size_t)csa_layer * 600 + 300 + t) * c->index_topk;
        CHECK(!memcmp(r0, r1, (size_t)c->index_topk * 4), "row %d top-k differs", t);
        active += (t + 1) / c->rate_csa > c->index_topk;
    }
    CHECK(!memcmp(lg, lg + (size_t)300 * V, (size_t)300 * V * 4), "logits differ");
    char extra[64];
    snprintf(extra, sizeof extra, "(%d rows with sparse selection active)", active);
    case_end("identical_requests_identical_topk", extra);
    td_state_free(&st);

    // the top-k region is the indexer's: whatever a plan's buffer holds there before a step
    // (the builder leaves it alone), the step's logits are the same bits (a prefill chunk with
    // sparse selection active, then a decode step)
    case_begin();
    float *lp[2] = {malloc((size_t)301 * V * sizeof(float)),
                    malloc((size_t)301 * V * sizeof(float))};
    for (int pass = 0; pass < 2; pass++) {
        struct td_state sp;
        CHECK(!td_state_init(&sp, c, 1, 400, 16, (size_t)1 << 30, NULL, err, sizeof err), "%s",
              err);
        struct td_plan_dims pd = td_state_plan_dims(&sp, 512, 1);
        struct td_plan pl;
        CHECK(!meta_plan_init(&pl, &pd, err, sizeof err), "%s", err);
        int slot = td_state_seq_alloc(&sp);
        struct td_plan_seq q[2] = {{.slot = slot, .len_before = 0, .n_new = 300, .ids = ids},
                                   {.slot = slot, .len_before = 300, .n_new = 1, .ids = ids + 7}};
        for (int k = 0; k < 2; k++) {
            CHECK(!meta_plan_build(&pl, q + k, 1, err, sizeof err), "%s", err);
            for (size_t j = 0; j < (size_t)pd.max_tok * pd.topk; j++) // stale picks: -1, or entry 3
                pl.topk[j] = pass ? 3 : -1;
            CHECK(!td_forward(&m, &sp, &pl, lp[pass] + (size_t)(k ? 300 : 0) * V, NULL, err,
                              sizeof err),
                  "%s", err);
        }
        meta_plan_free(&pl);
        td_state_free(&sp);
    }
    CHECK(!memcmp(lp[0], lp[1], (size_t)301 * V * sizeof(float)),
          "a step's logits depend on what the top-k region held before it");
    free(lp[0]), free(lp[1]);
    case_end("stale_topk_never_read", "");

    // random mixed batches against one-at-a-time
    case_begin();
    int n_iter = quick_mode() ? 60 : 1000, n_seqs = 6;
    struct td_state sb_st, one;
    CHECK(!td_state_init(&sb_st, c, n_seqs, 400, 16, (size_t)1 << 30, NULL, err, sizeof err), "%s",
          err);
    CHECK(!td_state_init(&one, c, n_seqs, 400, 16, (size_t)1 << 30, NULL, err, sizeof err), "%s",
          err);
    int slot_b[6], slot_1[6], len[6] = {0};
    int32_t seq_ids[6][400];
    for (int s = 0; s < n_seqs; s++) {
        slot_b[s] = td_state_seq_alloc(&sb_st);
        slot_1[s] = td_state_seq_alloc(&one);
        for (int i = 0; i < 400; i++)
            seq_ids[s][i] = (int32_t)rnd((uint32_t)V);
    }
    float *lb = malloc((size_t)128 * V * sizeof(float)), *l1 = malloc((size_t)64 * V * 4);
    for (int it = 0; it < n_iter && !check_case_failed; it++) {
        struct td_plan_seq q[6];
        int n = 0, rows = 0, order[6];
        for (int s = 0; s < n_seqs; s++)
            order[s] = s;
        for (int s = n_seqs - 1; s > 0; s--) { // random order of sequences in the batch
            int j = (int)rnd((uint32_t)s + 1), t = order[s];
            order[s] = order[j];
            order[j] = t;
        }
        for (int k = 0; k < n_seqs; k++) {
            int s = order[k];
            if (len[s] >= 380) { // finished: the slot goes back and a new request takes it
                td_state_seq_release(&sb_st, slot_b[s]);
                td_state_seq_release(&one, slot_1[s]);
                slot_b[s] = td_state_seq_alloc(&sb_st);
                slot_1[s] = td_state_seq_alloc(&one);
                len[s] = 0;
                for (int i = 0; i < 400; i++)
                    seq_ids[s][i] = (int32_t)rnd((uint32_t)V);
            }
            if (rnd(3) == 0) continue;
            int kind = (int)rnd(3), nn = kind == 0 ? 1 + (int)rnd(19) : kind == 1 ? 4 : 1;
            if (len[s] + nn > 380) nn = 380 - len[s];
            q[n++] = (struct td_plan_seq){
                .slot = slot_b[s], .len_before = len[s], .n_new = nn, .ids = seq_ids[s] + len[s]};
            rows += nn;
        }
        if (!n) continue;
        CHECK(!td_forward_seqs(&m, &sb_st, q, n, lb, NULL, err, sizeof err), "%s", err);
        for (int k = 0, row = 0; k < n; k++) {
            int s = 0;
            while (slot_b[s] != q[k].slot)
                s++;
            struct td_plan_seq q1 = {
                .slot = slot_1[s], .len_before = len[s], .n_new = q[k].n_new, .ids = q[k].ids};
            CHECK(!td_forward_seqs(&m, &one, &q1, 1, l1, NULL, err, sizeof err), "%s", err);
            CHECK(!memcmp(l1, lb + (size_t)row * V, (size_t)q[k].n_new * V * 4),
                  "iteration %d: sequence %d differs batched vs alone", it, s);
            // rejected drafts: sometimes roll both back by a few rows
            len[s] += q[k].n_new;
            row += q[k].n_new;
            int room = sb_st.max_chunk - (sb_st.hi[slot_b[s]] - len[s]); // rollback depth left
            if (q[k].n_new > 1 && room > 0 && rnd(2)) {
                int back = 1 + (int)rnd((uint32_t)q[k].n_new - 1);
                back = back > room ? room : back;
                len[s] -= back;
                CHECK(!td_state_rollback(&sb_st, slot_b[s], len[s], err, sizeof err) &&
                          !td_state_rollback(&one, slot_1[s], len[s], err, sizeof err),
                      "%s", err);
            }
        }
    }
    snprintf(extra, sizeof extra, "(%d random batches of up to 6 sequences)", n_iter);
    case_end("random_batches_match_alone", extra);
    td_state_free(&sb_st);
    td_state_free(&one);
    free(lg);
    free(trace);
    free(lb);
    free(l1);
    td_model_free(&m);
}

/* What a device copy receives (meta_plan_spans) is a function of the step alone: a plan that
 * held a 100-row step of 3 sequences and then a 6-row one sends the same bytes as a fresh plan
 * built for the 6-row step, a small step sends a small part of the buffer, and the spans end
 * before the top-k region (the indexer's output) */
static void span_fresh(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = dims_v4(128, 8, 4096);
    struct td_plan a, b;
    CHECK(!meta_plan_init(&a, &d, err, sizeof err) && !meta_plan_init(&b, &d, err, sizeof err),
          "init: %s", err);
    int32_t ids[128];
    for (int i = 0; i < 128; i++)
        ids[i] = i * 7 + 1;
    struct td_plan_seq big[3] = {{.slot = 0, .len_before = 300, .n_new = 60, .ids = ids},
                                 {.slot = 2, .len_before = 4000 - 40, .n_new = 30, .ids = ids},
                                 {.slot = 5, .len_before = 0, .n_new = 10, .ids = ids}};
    struct td_plan_seq small[1] = {{.slot = 2, .len_before = 517, .n_new = 6, .ids = ids}};
    CHECK(!meta_plan_build(&a, big, 3, err, sizeof err), "big: %s", err);
    CHECK(!meta_plan_build(&a, small, 1, err, sizeof err) &&
              !meta_plan_build(&b, small, 1, err, sizeof err),
          "small: %s", err);
    CHECK(!meta_plan_validate(&a, err, sizeof err), "validate: %s", err);
    size_t oa[2], ba[2], ob[2], bb[2], la = 0;
    int na = meta_plan_spans(&a, oa, ba), nb = meta_plan_spans(&b, ob, bb);
    CHECK(na == 2 && nb == 2, "%d and %d spans, not 2 (the block tables)", na, nb);
    for (int i = 0; i < na && i < nb; i++) {
        CHECK(oa[i] == ob[i] && ba[i] == bb[i] &&
                  !memcmp((char *)a.mem + oa[i], (char *)b.mem + ob[i], ba[i]),
              "span %d differs (%zu bytes at %zu against %zu at %zu)", i, ba[i], oa[i], bb[i],
              ob[i]);
        CHECK(oa[i] + ba[i] <= (size_t)((char *)a.topk - (char *)a.mem),
              "span %d reaches the top-k region", i);
        la += ba[i];
    }
    CHECK(la < a.bytes / 4, "a 6-row step sends %zu of %zu bytes", la, a.bytes);
    char extra[96];
    snprintf(extra, sizeof extra, "(a 6-row step sends %zu of %zu bytes)", la, a.bytes);
    meta_plan_free(&a);
    meta_plan_free(&b);
    case_end("span_is_the_step_alone", extra);
}

/* meta_plan_rows resolves every row array at the plan's own offsets against either base (the
 * plan's buffer or a copy of it, as the device's is), with the rate's arrays; the validator
 * names an array that is not where the layout puts it */
static void rows_at_either_base(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = dims_v4(32, 4, 4096);
    struct td_plan p;
    CHECK(!meta_plan_init(&p, &d, err, sizeof err), "init: %s", err);
    int32_t ids[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    struct td_plan_seq seqs[2] = {
        {.slot = 1, .len_before = 700, .n_new = 5, .ids = ids},
        {.slot = 3, .len_before = 64, .n_new = 1, .ids = ids},
    };
    CHECK(!meta_plan_build(&p, seqs, 2, err, sizeof err), "build: %s", err);
    struct rows_view own = meta_plan_rows(&p, p.mem, META_RATE_CSA);
    struct rows_view hca = meta_plan_rows(&p, p.mem, META_RATE_HCA);
    struct rows_view none = meta_plan_rows(&p, p.mem, META_RATE_NONE);
    CHECK(own.n_tok == 6 && own.topk_stride == d.topk, "n_tok %d, stride %d", own.n_tok,
          own.topk_stride);
    CHECK(own.input_ids == p.input_ids && own.positions == p.positions &&
              own.row_seq == p.row_seq && own.qo_indptr == p.qo_indptr && own.slot == p.slot &&
              own.len_before == p.len_before && own.swa_indptr == p.swa_indptr &&
              own.swa_pos == p.swa_pos && own.swa_write == p.swa_write && own.topk == p.topk,
          "a row array is not the plan's own");
    CHECK(own.vis == p.vis_csa && own.emit == p.emit_csa && own.write == p.write_csa,
          "CSA rows are not the CSA arrays");
    CHECK(hca.vis == p.vis_hca && hca.emit == p.emit_hca && hca.write == p.write_hca,
          "HCA rows are not the HCA arrays");
    CHECK(!none.vis && !none.emit && !none.write, "NONE carries compressed rows");
    // a copy of the buffer (as the device's): the same offsets, so the same values
    char *copy = malloc(p.bytes);
    memcpy(copy, p.mem, p.bytes);
    struct rows_view dev = meta_plan_rows(&p, copy, META_RATE_CSA);
    const char *h = p.mem;
    CHECK((const char *)dev.swa_pos - copy == (const char *)p.swa_pos - h &&
              (const char *)dev.write - copy == (const char *)p.write_csa - h &&
              (const char *)dev.topk - copy == (const char *)p.topk - h,
          "the copy's arrays are at other offsets");
    int same = 1;
    for (int t = 0; t < 6; t++)
        same &= dev.positions[t] == p.positions[t] && dev.emit[t] == p.emit_csa[t] &&
                dev.swa_write[t] == p.swa_write[t];
    CHECK(same, "the copy's rows read other values");
    free(copy);
    // an array moved off the layout is named
    CHECK(!meta_plan_validate(&p, err, sizeof err), "validate: %s", err);
    int32_t *keep = p.emit_hca;
    p.emit_hca += 16;
    CHECK(meta_plan_validate(&p, err, sizeof err) && strstr(err, "emit_hca"),
          "a moved emit_hca is not named: %s", err);
    p.emit_hca = keep;
    meta_plan_free(&p);
    case_end("rows_at_either_base", NULL);
}

/* rows.h's one rule for where position q's row lives (the attention's window keys and the
 * compressors' rows, host and device): the step's row when the step brings q, else the ring
 * row of q in the sequence's slot */
static void key_row_rule(void) {
    case_begin();
    int in_ring = -1;
    // slot 2, rings of 8 rows, 10 committed, the step's rows start at row 3 of its buffers
    CHECK(rows_where(12, 10, 3, 2, 8, &in_ring) == 5 && !in_ring, "q 12: the step's row 5");
    CHECK(rows_where(10, 10, 3, 2, 8, &in_ring) == 3 && !in_ring, "q 10: the step's row 3");
    CHECK(rows_where(9, 10, 3, 2, 8, &in_ring) == 17 && in_ring, "q 9: ring row 2 * 8 + 1");
    CHECK(rows_where(0, 10, 3, 2, 8, &in_ring) == 16 && in_ring, "q 0: ring row 16");
    float step[4 * 3], ring[3 * 8 * 3];
    CHECK(rows_key_row(step, ring, 11, 10, 2, 1, 8, 3) == step + 3 * 3, "the step's row 3");
    CHECK(rows_key_row(step, ring, 7, 10, 2, 1, 8, 3) == ring + (8 + 7) * 3, "ring row 15");
    case_end("key_row_rule", NULL);
}

/* td_state_advance: moves a length forward only, and only in a model whose every layer is a
 * sliding-window one (the lagging MTP layer's); a model with compressed entries is refused,
 * as are a length behind the slot's, past max_ctx, or a slot not in use */
static void state_advance(void) {
    case_begin();
    char err[512];
    struct td_model m;
    CHECK(!td_model_load(&m, "tests/fixtures/b_plain_hc2", err, sizeof err), "%s", err);
    if (check_case_failed) {
        case_end("state/advance", "");
        return;
    }
    struct td_config win = m.cfg;
    win.n_layers = 1, win.attn[0] = TD_ATTN_SLIDING;
    struct td_state st, full;
    CHECK(!td_state_init(&st, &win, 2, 100, 16, (size_t)1 << 30, NULL, err, sizeof err), "%s", err);
    CHECK(!td_state_init(&full, &m.cfg, 2, 100, 16, (size_t)1 << 30, NULL, err, sizeof err), "%s",
          err);
    int s = td_state_seq_alloc(&st), f = td_state_seq_alloc(&full);
    CHECK(!td_state_advance(&st, s, 40, err, sizeof err) && st.len[s] == 40 && st.hi[s] == 40,
          "advance to 40: %s (length %d)", err, st.len[s]);
    st.hi[s] = 45; // positions up to 44 were written once (rolled-back rows): they stay so
    CHECK(!td_state_advance(&st, s, 42, err, sizeof err) && st.len[s] == 42 && st.hi[s] == 45,
          "advance to 42 below the last written 45: length %d, hi %d", st.len[s], st.hi[s]);
    CHECK(td_state_advance(&st, s, 39, err, sizeof err) && strstr(err, "outside [42, 100]"),
          "back to 39: '%s'", err);
    CHECK(td_state_advance(&st, s, 101, err, sizeof err), "past max_ctx accepted");
    CHECK(td_state_advance(&st, 1, 5, err, sizeof err) && strstr(err, "not a live sequence"),
          "a free slot: '%s'", err);
    int csa = 0;
    for (int i = 0; i < m.cfg.n_layers; i++)
        csa += m.cfg.attn[i] != TD_ATTN_SLIDING;
    CHECK(csa > 0, "the fixture has no compressed layer to refuse");
    CHECK(td_state_advance(&full, f, 10, err, sizeof err) && strstr(err, "compressed entries") &&
              full.len[f] == 0,
          "a model with compressed layers: '%s' (length %d)", err, full.len[f]);
    td_state_free(&st);
    td_state_free(&full);
    td_model_free(&m);
    case_end("state/advance", "");
}

/* the paged history's block tables: each sequence's row copied from the tables for the blocks its
 * context reaches, -1 after, pads all -1; two sequences may read one block (a shared prefix);
 * the validator refuses a block the step writes in another sequence's table, a block twice in a
 * table, an id outside the pool, a table that ends before its context, an entry past it */
static void block_tables(void) {
    char err[256];
    case_begin();
    struct td_plan_dims d = dims_v4(32, 4, 2048); // 8 blocks a table
    int32_t tab[4][8], ids[16] = {0};
    for (int s = 0; s < 4; s++)
        for (int b = 0; b < 8; b++)
            tab[s][b] = -1;
    int32_t a[8] = {7, 3, 12, 5, -1, -1, -1, -1}, w[8] = {7, 3, 20, -1, -1, -1, -1, -1};
    memcpy(tab[1], a, sizeof a), memcpy(tab[2], w, sizeof w);
    d.tables = &tab[0][0], d.slots = 4, d.n_blocks = 32;
    struct td_plan p;
    CHECK(!meta_plan_init(&p, &d, err, sizeof err), "init: %s", err);
    // slot 1 decodes at 1000 (blocks 0..3, writes block 3); slot 2 shares its first two blocks
    // and prefills 512 .. 520 (writes block 2)
    struct td_plan_seq q[2] = {{.slot = 1, .len_before = 999, .n_new = 1, .ids = ids},
                               {.slot = 2, .len_before = 512, .n_new = 8, .ids = ids}};
    CHECK(!meta_plan_build(&p, q, 2, err, sizeof err) && !meta_plan_validate(&p, err, sizeof err),
          "%s", err);
    int NB = d.max_blocks, ok = NB == 8;
    for (int b = 0; b < NB; b++)
        ok &= p.blocks[b] == (b < 4 ? a[b] : -1) && p.blocks[NB + b] == (b < 3 ? w[b] : -1);
    CHECK(ok && p.n_seq_pad == 2, "the tables' rows are not the plan's");
    struct rows_view rv = meta_plan_rows(&p, p.mem, META_RATE_CSA);
    CHECK(rv.blocks == p.blocks && rv.blocks_stride == NB &&
              rows_entry(&rv, 1, 130, 64) == 20 * 64 + 2 &&
              rows_entry(&rv, 0, 63, 64) == 7 * 64 + 63 && rows_entry(&rv, 0, 1, 2) == 7 * 2 + 1,
          "rows_entry is not block * per + w %% per");
    // mutations the validator catches, each on a fresh build
    struct {
        int seq, b, id;
        const char *why;
    } bad[] = {{1, 2, 12, "written by one sequence"}, // slot 2 writes a block slot 1 reads
               {1, 1, 5, "written by one sequence"},  // slot 2 reads the block slot 1 writes
               {0, 3, 20, "written by one sequence"}, // slot 1 writes slot 2's block
               {0, 2, 7, "twice"},
               {1, 0, 32, "outside the pool"},
               {0, 4, 9, "past its context"},
               {1, 7, 9, "past its context"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(!meta_plan_build(&p, q, 2, err, sizeof err), "%s", err);
        p.blocks[bad[i].seq * NB + bad[i].b] = bad[i].id;
        CHECK(meta_plan_validate(&p, err, sizeof err) && strstr(err, bad[i].why),
              "mutation %zu (sequence %d's block %d = %d): %s", i, bad[i].seq, bad[i].b, bad[i].id,
              err);
    }
    // the validator leaves its marks clear: the plan as built validates again
    CHECK(!meta_plan_build(&p, q, 2, err, sizeof err) && !meta_plan_validate(&p, err, sizeof err),
          "after the mutations: %s", err);
    // a table that ends before its context: slot 2 at 800 tokens has no block 3
    q[1].len_before = 792;
    CHECK(!meta_plan_build(&p, q, 2, err, sizeof err) && meta_plan_validate(&p, err, sizeof err) &&
              strstr(err, "ends before its context"),
          "a short table: %s", err);
    meta_plan_free(&p);
    // dims without tables for a model with compressed layers are refused
    struct td_plan_dims e = dims_v4(32, 4, 2048);
    e.tables = NULL;
    CHECK(meta_plan_init(&p, &e, err, sizeof err) && strstr(err, "history dims"), "%s", err);
    case_end("block_tables", "");
}

static void bucket_fit(void) {
    case_begin();
    static const struct {
        int fixed, flex, cap, graph_rows, floor, want;
    } t[] = {
        {16, 512, 4096, 1024, 128, 496},   // 528 -> 1024 padded: stop at 512
        {16, 496, 4096, 1024, 128, 496},   // exactly a bucket
        {24, 976, 4096, 1024, 128, 976},   // 1000 of 1024: few padded, keep
        {256, 512, 4096, 1024, 128, 512},  // 768: as many past 512 as padded, keep
        {16, 1024, 4096, 1024, 128, 1024}, // 1040 rows: past the widest graph, eager
        {2, 120, 4096, 1024, 128, 120},    // under the floor
        {2, 129, 4096, 1024, 128, 126},    // 131 -> 256: stop at 128
        {600, 10, 4096, 1024, 128, 10},    // the bucket below holds no prompt row: keep
        {16, 0, 4096, 1024, 128, 0},       // no prompt rows
        {16, 600, 600, 1024, 128, 600},    // cap 600: the bucket is the step itself
        {16, 514, 700, 1024, 128, 496},    // 530 in a bucket of 700 (the cap): stop at 512
        {16, 600, 700, 1024, 128, 600},    // 616 of 700: fewer padded than past 512, keep
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        int got = meta_bucket_fit(t[i].fixed, t[i].flex, t[i].cap, t[i].graph_rows, t[i].floor);
        CHECK(got == t[i].want, "fixed %d, flex %d, cap %d, graph rows %d: %d prompt rows, not %d",
              t[i].fixed, t[i].flex, t[i].cap, t[i].graph_rows, got, t[i].want);
    }
    case_end("bucket_fit", "");
}

int main(void) {
    seed000();
    bucket_fit();
    seed001();
    draft_substeps();
    random_plans();
    block_rows();
    random_block_plans();
    with_model();
    span_fresh();
    rows_at_either_base();
    key_row_rule();
    state_advance();
    block_tables();
    return check_failures ? 1 : 0;
}
