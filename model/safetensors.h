/* safetensors.h: memory-mapped safetensors, single file or sharded.
 *
 *   struct st_set set;
 *   char err[512];
 *   if (st_set_open(&set, "models/tandem-tiny", err, sizeof err) != 0) { puts(err); return -1; }
 *   const struct st_entry *e = st_set_find(&set, "norm.weight");   // NULL: no such tensor
 *   int64_t dim = e ? e->t.shape[0] : -1;                          // e->t: a view into the mapping
 *   st_set_close(&set);
 *
 * A model directory holds either model.safetensors.index.json (whose
 * "weight_map" names the shards) or exactly one model.safetensors. Every
 * header is validated on open: header length within the file, JSON well
 * formed, known dtype, shape x dtype size equal to the data range, ranges
 * inside the data section and not overlapping, tensor names unique across
 * shards. Failures return -1 with a one-line message in err; nothing leaks.
 */
#ifndef TD_SAFETENSORS_H
#define TD_SAFETENSORS_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct st_entry {
    char *name;         /* owned */
    struct td_tensor t; /* data points into the mapping */
    size_t nbytes;
    int shard; /* index into st_set.maps */
};

struct st_map {
    char *path; /* owned */
    void *base; /* mmap base, NULL if empty */
    size_t size;
};

struct st_set {
    struct st_map *maps; /* [n_maps] */
    int n_maps;
    struct st_entry *entries; /* [n_entries], sorted by name */
    int n_entries;
};

/* Open one .safetensors file (path) as a set of one shard. */
int st_set_open_file(struct st_set *set, const char *path, char *err, size_t errlen);

/* Open a model directory (index json or model.safetensors). */
int st_set_open(struct st_set *set, const char *dir, char *err, size_t errlen);

/* NULL when absent. Binary search. */
const struct st_entry *st_set_find(const struct st_set *set, const char *name);

void st_set_close(struct st_set *set);

#ifdef __cplusplus
}
#endif
#endif
