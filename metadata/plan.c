/* plan.c: layout, build and validation of the per-step plan. */
#include "plan.h"

#include "kernels/err.h"

#include <stdlib.h>
#include <string.h>

int meta_bucket(int n, int cap) {
    int b = 1;
    while (b < n)
        b *= 2;
    return b < cap ? b : cap;
}

int meta_bucket_fit(int fixed, int flex, int cap, int graph_rows, int floor) {
    int n = fixed + flex, pad = meta_bucket(n, cap);
    if (flex < 1 || pad == n || pad > graph_rows || pad <= floor) return flex;
    int below = 1; // the bucket below: the largest power of two under n
    while (2 * below < n)
        below *= 2;
    int over = n - below; // the flex rows past it
    return over < pad - n && below > fixed ? below - fixed : flex;
}

/* offsets (in int32 words) of every array; depends on the dims alone */
struct layout {
#define LAYOUT_FIELD(name, words) size_t name;
    TD_PLAN_REGIONS(LAYOUT_FIELD)
#undef LAYOUT_FIELD
    size_t words;
};

static struct layout plan_layout(const struct td_plan_dims *d) {
    struct layout l;
    size_t T = (size_t)d->max_tok, S = (size_t)d->max_seq, w = 0;
    size_t W = (size_t)d->window + (size_t)d->block, K = (size_t)d->topk;
    size_t NB = (size_t)d->max_blocks;
    // each region starts on a 16-word (64-byte) boundary
#define REGION(name, n) l.name = w, w += ((size_t)(n) + 15) / 16 * 16;
    TD_PLAN_REGIONS(REGION)
#undef REGION
    l.words = w;
    return l;
}

size_t meta_plan_bytes(const struct td_plan_dims *d) {
    return plan_layout(d).words * 4;
}

int meta_plan_spans(const struct td_plan *p, size_t off[2], size_t bytes[2]) {
    const struct td_plan_dims *d = &p->dims;
    struct layout l = plan_layout(d);
    off[0] = 0;
    bytes[0] = (l.swa_pos + (size_t)p->n_tok_pad * ((size_t)d->window + d->block)) * 4;
    if (!d->max_blocks) return 1;
    off[1] = l.blocks * 4;
    bytes[1] = (size_t)p->n_seq_pad * d->max_blocks * 4;
    return 2;
}

static void bind_arrays(struct td_plan *p) {
    struct layout l = plan_layout(&p->dims);
    int32_t *m = p->mem;
#define BIND(name, words) p->name = m + l.name;
    TD_PLAN_REGIONS(BIND)
#undef BIND
}

struct rows_view meta_plan_rows(const struct td_plan *p, void *base, enum meta_rate rate) {
    // each array at its offset in the plan's own buffer, which bind_arrays laid out
    const int32_t *m = p->mem;
    int32_t *b = base;
#define AT(arr) (b + ((arr)-m))
    int csa = rate == META_RATE_CSA, none = rate == META_RATE_NONE;
    struct rows_view r = {
        .n_tok = p->n_tok,
        .input_ids = AT(p->input_ids),
        .logit_rows = AT(p->logit_rows),
        .positions = AT(p->positions),
        .row_seq = AT(p->row_seq),
        .qo_indptr = AT(p->qo_indptr),
        .slot = AT(p->slot),
        .len_before = AT(p->len_before),
        .swa_indptr = AT(p->swa_indptr),
        .swa_pos = AT(p->swa_pos),
        .swa_write = AT(p->swa_write),
        .vis = none ? NULL : AT(csa ? p->vis_csa : p->vis_hca),
        .emit = none ? NULL : AT(csa ? p->emit_csa : p->emit_hca),
        .write = none ? NULL : AT(csa ? p->write_csa : p->write_hca),
        .topk = AT(p->topk),
        .topk_stride = p->dims.topk,
        .blocks = p->dims.max_blocks ? AT(p->blocks) : NULL,
        .blocks_stride = p->dims.max_blocks,
    };
#undef AT
    return r;
}

int meta_plan_dims_equal(const struct td_plan_dims *a, const struct td_plan_dims *b) {
    return a->max_tok == b->max_tok && a->max_seq == b->max_seq && a->max_ctx == b->max_ctx &&
           a->window == b->window && a->topk == b->topk && a->rate_csa == b->rate_csa &&
           a->rate_hca == b->rate_hca && a->swa_ring == b->swa_ring && a->ring_csa == b->ring_csa &&
           a->ring_hca == b->ring_hca && a->block == b->block && a->hist_block == b->hist_block &&
           a->max_blocks == b->max_blocks && a->n_blocks == b->n_blocks && a->slots == b->slots &&
           a->tables == b->tables;
}

int meta_plan_init(struct td_plan *p, const struct td_plan_dims *d, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    if (d->max_tok < 1 || d->max_seq < 1 || d->window < 1 || d->topk < 0 || d->swa_ring < 1 ||
        d->max_ctx < 1 || d->block < 0 || (d->block && (d->rate_csa || d->rate_hca)))
        return td_errf(err, errlen, "plan: bad dims (max_tok %d, max_seq %d, window %d, topk %d)",
                       d->max_tok, d->max_seq, d->window, d->topk);
    // a model with compressed layers reads its history through block tables: whole entries of
    // every rate a block, a table as wide as the context, and the state's tables to copy from
    int rates = d->rate_csa || d->rate_hca;
    if (rates ? d->hist_block < 1 || (d->rate_csa && d->hist_block % d->rate_csa) ||
                    (d->rate_hca && d->hist_block % d->rate_hca) ||
                    d->max_blocks != (d->max_ctx + d->hist_block - 1) / d->hist_block ||
                    d->n_blocks < 1 || d->slots < 1 || !d->tables
              : d->hist_block || d->max_blocks)
        return td_errf(err, errlen,
                       "plan: bad history dims (block %d tokens, rates %d/%d, table width %d for "
                       "context %d, %d blocks, %d slots, tables %s)",
                       d->hist_block, d->rate_csa, d->rate_hca, d->max_blocks, d->max_ctx,
                       d->n_blocks, d->slots, d->tables ? "set" : "none");
    // a step's window keys are indexed by int32 (swa_indptr): rows x (window + block) must fit
    if ((size_t)d->max_tok * ((size_t)d->window + d->block) > INT32_MAX)
        return td_errf(err, errlen,
                       "plan: %d rows x (window %d + block %d) keys exceed the int32 range of the "
                       "plan's indices; lower the rows per step or the context",
                       d->max_tok, d->window, d->block);
    p->dims = *d;
    p->bytes = meta_plan_bytes(d);
    p->mem = calloc(1, p->bytes); // the gaps between regions too: a plan is the same bytes
    if (!p->mem)
        return td_errf(err, errlen, "plan: out of memory for a %zu-byte plan buffer", p->bytes);
    bind_arrays(p);
    size_t marks = (size_t)d->n_blocks + d->max_blocks; // the marks, then a row of -1s
    if (d->n_blocks > 0 && !(p->owner = malloc(marks * sizeof *p->owner))) {
        free(p->mem);
        return td_errf(err, errlen, "plan: out of memory for the validator's %d block marks",
                       d->n_blocks);
    }
    if (p->owner) memset(p->owner, 0xff, marks * sizeof *p->owner);
    return 0;
}

void meta_plan_free(struct td_plan *p) {
    free(p->owner);
    free(p->mem);
    memset(p, 0, sizeof *p);
}

/* the blocks a context of len tokens reaches */
static int used_blocks(const struct td_plan_dims *d, int len) {
    return d->hist_block ? (len + d->hist_block - 1) / d->hist_block : 0;
}

/* ring row of position pos in a ring of `ring` rows, when the row is among the last `ring`
 * positions of its sequence after the step (older rows of a long chunk are not kept) */
static int32_t ring_write(int pos, int end, int ring) {
    return ring > 0 && pos >= end - ring ? pos % ring : -1;
}

/* the key positions [*lo, *hi) a row at pos sees: its window, or (a block's row) the window
 * before the block and the whole block */
static void row_keys(const struct td_plan_dims *d, int pos, int len_before, int n_new, int block,
                     int *lo, int *hi) {
    int first = block ? len_before : pos + 1; // the window ends just before this position
    *lo = first - d->window < 0 ? 0 : first - d->window;
    *hi = block ? len_before + n_new : pos + 1;
}

int meta_plan_build(struct td_plan *p, const struct td_plan_seq *seqs, int n_seq, char *err,
                    size_t errlen) {
    const struct td_plan_dims *d = &p->dims;
    long n_tok = 0;
    if (n_seq < 1 || n_seq > d->max_seq)
        return td_errf(err, errlen, "plan: %d sequences, capacity %d", n_seq, d->max_seq);
    for (int s = 0; s < n_seq; s++) {
        if (seqs[s].n_new < 1 || seqs[s].len_before < 0)
            return td_errf(err, errlen, "plan: sequence %d has %d rows after length %d", s,
                           seqs[s].n_new, seqs[s].len_before);
        if ((long)seqs[s].len_before + seqs[s].n_new > d->max_ctx)
            return td_errf(err, errlen, "plan: sequence %d would reach %ld tokens, max context %d",
                           s, (long)seqs[s].len_before + seqs[s].n_new, d->max_ctx);
        if (seqs[s].block && seqs[s].n_new > d->block)
            return td_errf(err, errlen, "plan: sequence %d is a block of %d rows, capacity %d", s,
                           seqs[s].n_new, d->block);
        if (d->max_blocks && (seqs[s].slot < 0 || seqs[s].slot >= d->slots))
            return td_errf(err, errlen, "plan: sequence %d names slot %d of %d", s, seqs[s].slot,
                           d->slots);
        n_tok += seqs[s].n_new;
    }
    if (n_tok > d->max_tok)
        return td_errf(err, errlen, "plan: %ld rows, capacity %d", n_tok, d->max_tok);
    p->n_tok = (int)n_tok;
    p->n_seq = n_seq;
    p->n_tok_pad = meta_bucket(p->n_tok, d->max_tok);
    p->n_seq_pad = meta_bucket(n_seq, d->max_seq);

    // sequences; pad sequences end where the last real one ends
    int t = 0;
    p->qo_indptr[0] = 0;
    p->kv_indptr[0] = 0;
    for (int s = 0; s < d->max_seq; s++) {
        int real = s < n_seq;
        p->slot[s] = real ? seqs[s].slot : -1;
        p->len_before[s] = real ? seqs[s].len_before : 0;
        p->block[s] = real && seqs[s].block ? 1 : 0;
        p->qo_indptr[s + 1] = p->qo_indptr[s] + (real ? seqs[s].n_new : 0);
        p->kv_indptr[s + 1] = p->kv_indptr[s] + (real ? seqs[s].len_before + seqs[s].n_new : 0);
    }
    // block tables: the state's row for the blocks each context reaches, -1 past them and in
    // every pad sequence's row, over the step's bucket of sequences (as swa_pos below)
    size_t NB = (size_t)d->max_blocks;
    for (int s = 0; NB && s < p->n_seq_pad; s++) {
        int used = s < n_seq ? used_blocks(d, p->kv_indptr[s + 1] - p->kv_indptr[s]) : 0;
        if (used) memcpy(p->blocks + s * NB, d->tables + (size_t)seqs[s].slot * NB, used * 4);
        memset(p->blocks + s * NB + used, 0xff, (NB - used) * 4); // -1
    }
    // rows
    p->swa_indptr[0] = 0;
    for (int s = 0; s < n_seq; s++) {
        int end = seqs[s].len_before + seqs[s].n_new, blk = p->block[s];
        for (int j = 0; j < seqs[s].n_new; j++, t++) {
            int pos = seqs[s].len_before + j, lo, hi;
            p->input_ids[t] = seqs[s].ids[j];
            p->positions[t] = pos;
            p->row_seq[t] = s;
            row_keys(d, pos, seqs[s].len_before, seqs[s].n_new, blk, &lo, &hi);
            p->swa_indptr[t + 1] = p->swa_indptr[t] + hi - lo;
            for (int k = 0; k < hi - lo; k++)
                p->swa_pos[p->swa_indptr[t] + k] = lo + k;
            p->swa_write[t] = blk ? -1 : ring_write(pos, end, d->swa_ring);
            p->vis_csa[t] = d->rate_csa ? (pos + 1) / d->rate_csa : 0;
            p->vis_hca[t] = d->rate_hca ? (pos + 1) / d->rate_hca : 0;
            p->emit_csa[t] = d->rate_csa && (pos + 1) % d->rate_csa == 0 ? p->vis_csa[t] - 1 : -1;
            p->emit_hca[t] = d->rate_hca && (pos + 1) % d->rate_hca == 0 ? p->vis_hca[t] - 1 : -1;
            p->write_csa[t] = d->rate_csa ? ring_write(pos, end, d->ring_csa) : -1;
            p->write_hca[t] = d->rate_hca ? ring_write(pos, end, d->ring_hca) : -1;
        }
    }
    // pad rows: zero length at the last real end, nothing written. The window keys are
    // rewritten over the step's bucket only: a graph of n_tok_pad rows reads no row past it, and
    // resetting them to max_tok cost 22 us per step on the host. The top-k region is the
    // indexer's to write (plan.h), never the builder's
    int np = p->n_tok_pad;
    for (; t < d->max_tok; t++) {
        p->input_ids[t] = 0;
        p->positions[t] = 0;
        p->row_seq[t] = -1;
        p->swa_indptr[t + 1] = p->swa_indptr[t];
        p->swa_write[t] = -1;
        p->vis_csa[t] = p->vis_hca[t] = 0;
        p->emit_csa[t] = p->emit_hca[t] = -1;
        p->write_csa[t] = p->write_hca[t] = -1;
    }
    for (size_t k = (size_t)p->swa_indptr[np]; k < (size_t)np * ((size_t)d->window + d->block); k++)
        p->swa_pos[k] = -1;
    // the rows whose logits the step returns: each sequence's last n_new - skip_logits rows
    int nl = 0;
    p->logit_indptr[0] = 0;
    for (int s = 0; s < d->max_seq; s++) {
        if (s < n_seq) {
            int skip = seqs[s].skip_logits < 0 ? 0 : seqs[s].skip_logits;
            if (skip > seqs[s].n_new) skip = seqs[s].n_new;
            for (int j = skip; j < seqs[s].n_new; j++)
                p->logit_rows[nl++] = p->qo_indptr[s] + j;
        }
        p->logit_indptr[s + 1] = nl;
    }
    p->n_logit = nl;
    for (int t = nl; t < d->max_tok; t++)
        p->logit_rows[t] = -1;
    return 0;
}

/* Block tables, over the step's bucket of sequences: a real sequence's first used_blocks entries
 * are blocks of the pool, distinct, and the rest -1; a pad sequence's all -1; a block the step
 * writes (one holding a position at or past its sequence's committed length) is in no other
 * sequence's table. Blocks read by several sequences (a shared prefix) are fine. p->owner marks
 * each block's sequence (2 s, + 1 when written) and is -1 again on return. */
static int check_blocks(const struct td_plan *p, char *err, size_t errlen) {
    const struct td_plan_dims *d = &p->dims;
    int NB = d->max_blocks, bad = 0, s = 0, b = 0, id = -1, other = -1;
    if (!NB) return 0;
    for (; !bad && s < p->n_seq_pad; s++) {
        const int32_t *row = p->blocks + (size_t)s * NB;
        int used = s < p->n_seq ? used_blocks(d, p->kv_indptr[s + 1] - p->kv_indptr[s]) : 0;
        int first_write = p->len_before[s] / d->hist_block;
        for (b = 0; !bad && b < used; b++) {
            id = row[b];
            if (id < 0 || id >= d->n_blocks) {
                bad = 2;
                break;
            }
            int mark = 2 * s + (b >= first_write), o = p->owner[id];
            if (o >= 0 && (o / 2 == s || (o & 1) || (mark & 1))) {
                bad = o / 2 == s ? 3 : 4, other = o / 2;
                break;
            }
            if (o < 0 || (mark & 1)) p->owner[id] = mark;
        }
        if (bad) break;
        // every entry past the context -1: against the row of -1s after the marks
        if (memcmp(row + b, p->owner + d->n_blocks, (size_t)(NB - b) * 4)) {
            while (row[b] == -1)
                b++;
            id = row[b], bad = 1;
            break;
        }
    }
    for (int r = 0; r < p->n_seq && r <= s; r++) // the marks back to -1
        for (int k = 0; k < NB; k++) {
            int x = p->blocks[(size_t)r * NB + k];
            if (x < 0) break;
            if (x < d->n_blocks) p->owner[x] = -1;
        }
    switch (bad) {
    case 1:
        return td_errf(err, errlen,
                       "plan: sequence %d's block table entry %d is %d past its context, not -1", s,
                       b, id);
    case 2:
        return td_errf(err, errlen,
                       "plan: sequence %d's block %d is %d, outside the pool of %d (a table that "
                       "ends before its context)",
                       s, b, id, d->n_blocks);
    case 3: return td_errf(err, errlen, "plan: sequence %d holds block %d twice", s, id);
    case 4:
        return td_errf(err, errlen,
                       "plan: block %d is written by one sequence and in sequence %d's and %d's "
                       "tables",
                       id, other, s);
    }
    return 0;
}

int meta_plan_validate(const struct td_plan *p, char *err, size_t errlen) {
    const struct td_plan_dims *d = &p->dims;
    struct layout l = plan_layout(d);
    const int32_t *m = p->mem;
#define AT_OFFSET(name, words)                                                                     \
    if (p->name != m + l.name)                                                                     \
        return td_errf(err, errlen, "plan: array %s is not at the offset the dims fix", #name);
    TD_PLAN_REGIONS(AT_OFFSET)
#undef AT_OFFSET
    if (p->n_seq < 1 || p->n_seq > p->n_seq_pad || p->n_seq_pad > d->max_seq ||
        p->n_tok < p->n_seq || p->n_tok > p->n_tok_pad || p->n_tok_pad > d->max_tok ||
        p->n_tok_pad != meta_bucket(p->n_tok, d->max_tok) ||
        p->n_seq_pad != meta_bucket(p->n_seq, d->max_seq))
        return td_errf(err, errlen, "plan: counts %d/%d rows, %d/%d sequences, capacity %d/%d",
                       p->n_tok, p->n_tok_pad, p->n_seq, p->n_seq_pad, d->max_tok, d->max_seq);
    if (p->qo_indptr[0] != 0 || p->kv_indptr[0] != 0 || p->swa_indptr[0] != 0)
        return td_errf(err, errlen, "plan: an indptr does not start at 0");
    for (int s = 0; s < d->max_seq; s++) {
        int q = p->qo_indptr[s + 1] - p->qo_indptr[s], kv = p->kv_indptr[s + 1] - p->kv_indptr[s];
        if (q < 0 || kv < 0)
            return td_errf(err, errlen, "plan: sequence %d has negative length (rows %d, kv %d)", s,
                           q, kv);
        if (s < p->n_seq) {
            if (q < 1) return td_errf(err, errlen, "plan: sequence %d has no rows", s);
            if (kv != p->len_before[s] + q || kv > d->max_ctx)
                return td_errf(err, errlen, "plan: sequence %d kv length %d, expected %d (max %d)",
                               s, kv, p->len_before[s] + q, d->max_ctx);
            if (p->slot[s] < 0) return td_errf(err, errlen, "plan: sequence %d has no slot", s);
            for (int r = 0; r < s; r++)
                if (p->slot[r] == p->slot[s])
                    return td_errf(err, errlen, "plan: sequences %d and %d share slot %d", r, s,
                                   p->slot[s]);
            if (p->block[s] != 0 && p->block[s] != 1)
                return td_errf(err, errlen, "plan: sequence %d block flag %d", s, p->block[s]);
            if (p->block[s] && (q > d->block || d->rate_csa || d->rate_hca))
                return td_errf(err, errlen, "plan: sequence %d block of %d rows, capacity %d", s, q,
                               d->block);
        } else if (q || kv || p->slot[s] != -1 || p->len_before[s] || p->block[s]) {
            return td_errf(err, errlen,
                           "plan: pad sequence %d is not inert (rows %d, kv %d, slot "
                           "%d)",
                           s, q, kv, p->slot[s]);
        }
    }
    if (check_blocks(p, err, errlen)) return -1;
    if (p->qo_indptr[p->n_seq] != p->n_tok)
        return td_errf(err, errlen, "plan: qo_indptr ends at %d, %d rows", p->qo_indptr[p->n_seq],
                       p->n_tok);
    for (int t = 0; t < d->max_tok; t++) {
        int n = p->swa_indptr[t + 1] - p->swa_indptr[t];
        if (n < 0) return td_errf(err, errlen, "plan: row %d has negative window length %d", t, n);
        if (t >= p->n_tok) {
            if (n || p->row_seq[t] != -1 || p->swa_write[t] != -1 || p->write_csa[t] != -1 ||
                p->write_hca[t] != -1 || p->emit_csa[t] != -1 || p->emit_hca[t] != -1 ||
                p->vis_csa[t] || p->vis_hca[t])
                return td_errf(err, errlen, "plan: pad row %d is not inert", t);
            continue;
        }
        int s = p->row_seq[t];
        if (s < 0 || s >= p->n_seq || t < p->qo_indptr[s] || t >= p->qo_indptr[s + 1])
            return td_errf(err, errlen,
                           "plan: row %d names sequence %d, but belongs to another "
                           "(stale token->sequence map?)",
                           t, s);
        int pos = p->positions[t], end = p->len_before[s] + p->qo_indptr[s + 1] - p->qo_indptr[s];
        if (pos != p->len_before[s] + t - p->qo_indptr[s])
            return td_errf(err, errlen, "plan: row %d position %d, expected %d", t, pos,
                           p->len_before[s] + t - p->qo_indptr[s]);
        int lo, hi, blk = p->block[s];
        row_keys(d, pos, p->len_before[s], end - p->len_before[s], blk, &lo, &hi);
        if (n != hi - lo)
            return td_errf(err, errlen, "plan: row %d window length %d, expected %d", t, n,
                           hi - lo);
        for (int k = 0; k < n; k++)
            if (p->swa_pos[p->swa_indptr[t] + k] != lo + k)
                return td_errf(err, errlen,
                               "plan: row %d window key %d is position %d, expected %d", t, k,
                               p->swa_pos[p->swa_indptr[t] + k], lo + k);
        if (p->swa_write[t] != (blk ? -1 : ring_write(pos, end, d->swa_ring)) ||
            p->write_csa[t] != (d->rate_csa ? ring_write(pos, end, d->ring_csa) : -1) ||
            p->write_hca[t] != (d->rate_hca ? ring_write(pos, end, d->ring_hca) : -1))
            return td_errf(err, errlen, "plan: row %d ring write slots %d/%d/%d are wrong", t,
                           p->swa_write[t], p->write_csa[t], p->write_hca[t]);
        if ((d->rate_csa &&
             (p->vis_csa[t] != (pos + 1) / d->rate_csa ||
              p->emit_csa[t] != ((pos + 1) % d->rate_csa ? -1 : p->vis_csa[t] - 1))) ||
            (d->rate_hca && (p->vis_hca[t] != (pos + 1) / d->rate_hca ||
                             p->emit_hca[t] != ((pos + 1) % d->rate_hca ? -1 : p->vis_hca[t] - 1))))
            return td_errf(err, errlen, "plan: row %d visible/emitted entries inconsistent", t);
    }
    for (size_t k = (size_t)p->swa_indptr[p->n_tok_pad];
         k < (size_t)p->n_tok_pad * ((size_t)d->window + d->block); k++)
        if (p->swa_pos[k] != -1)
            return td_errf(err, errlen, "plan: window slot %zu past the last range is not -1", k);
    if (p->logit_indptr[0] != 0 || p->n_logit < 0 || p->n_logit > p->n_tok ||
        p->logit_indptr[d->max_seq] != p->n_logit)
        return td_errf(err, errlen, "plan: logit_indptr does not span [0, %d)", p->n_logit);
    for (int s = 0; s < d->max_seq; s++) {
        int a = p->logit_indptr[s], b = p->logit_indptr[s + 1];
        if (b < a) return td_errf(err, errlen, "plan: sequence %d has a negative logits range", s);
        for (int i = a; i < b; i++) // a sequence's logits are a suffix of its own rows
            if (s >= p->n_seq || p->logit_rows[i] < p->qo_indptr[s] ||
                p->logit_rows[i] >= p->qo_indptr[s + 1] ||
                (i > a && p->logit_rows[i] != p->logit_rows[i - 1] + 1) ||
                (i == b - 1 && p->logit_rows[i] != p->qo_indptr[s + 1] - 1))
                return td_errf(err, errlen, "plan: logits row %d of sequence %d is %d", i, s,
                               p->logit_rows[i]);
    }
    for (int t = p->n_logit; t < d->max_tok; t++)
        if (p->logit_rows[t] != -1)
            return td_errf(err, errlen, "plan: logit_rows pad %d not -1", t);
    return 0;
}
