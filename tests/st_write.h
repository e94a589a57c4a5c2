/* st_write.h: the tests' safetensors writer: a fixture's tensors listed, edited (another dtype,
 * a tensor dropped or reshaped) and written back as a new file (header-only, static). */
#ifndef TD_TESTS_ST_WRITE_H
#define TD_TESTS_ST_WRITE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

/* one tensor of a file to write */
struct st_tensor {
    char name[160];
    enum td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    const void *data;
    size_t nbytes;
};

/* path = t[n] as safetensors, the header padded with spaces to a multiple of 8 bytes, plus one
 * when odd (any length is legal; an odd one leaves every tensor at an odd address). 0 or -1 */
static inline int st_write(const char *path, const struct st_tensor *t, int n, int odd) {
    size_t cap = 1 << 20, len = 0, off = 0;
    char *h = malloc(cap);
    if (!h) return -1;
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                i ? "," : "", t[i].name, td_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)t[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
                                off + t[i].nbytes);
        off += t[i].nbytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    size_t want = (len + 7) / 8 * 8 + (odd ? 1 : 0);
    while (len < want && len < cap)
        h[len++] = ' ';
    FILE *fp = fopen(path, "wb");
    uint64_t hl = len;
    int ok = fp && fwrite(&hl, 8, 1, fp) == 1 && fwrite(h, 1, len, fp) == len;
    for (int i = 0; ok && i < n; i++)
        ok = fwrite(t[i].data, 1, t[i].nbytes, fp) == t[i].nbytes;
    if (fp && fclose(fp)) ok = 0;
    free(h);
    return ok ? 0 : -1;
}

/* the tensors of an open set as an editable list (views into it); how many */
static inline int st_list(const struct st_set *set, struct st_tensor *out) {
    for (int i = 0; i < set->n_entries; i++) {
        const struct st_entry *e = &set->entries[i];
        snprintf(out[i].name, sizeof out[i].name, "%s", e->name);
        out[i].dtype = e->t.dtype;
        out[i].ndim = e->t.ndim;
        memcpy(out[i].shape, e->t.shape, sizeof out[i].shape);
        out[i].data = e->t.data;
        out[i].nbytes = e->nbytes;
    }
    return set->n_entries;
}

#endif
