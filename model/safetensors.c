/* safetensors.c: open, validate and index memory-mapped safetensors files.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data section; offsets are relative to its start, end exclusive.
 *
 * Every shard is mapped whole (read-only, MAP_PRIVATE) and its header checked before any
 * entry points into it. All entries of all shards live in one array sorted by name. On any
 * failure the set is closed, so callers only ever see a complete set or a zeroed one.
 */
#include "safetensors.h"
#include "kernels/err.h"
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ull /* the reference implementation's limit (100 MB) */

typedef unsigned long long ull;

/* one tensor's byte range inside its shard's data section (for the overlap check) */
struct st_range {
    uint64_t begin, end; /* end exclusive */
    int entry;           /* index into st_set.entries */
};

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static enum td_dtype dtype_from_name(const char *s) {
    static const enum td_dtype all[] = {TD_DTYPE_F32,     TD_DTYPE_BF16, TD_DTYPE_F16,
                                        TD_DTYPE_I32,     TD_DTYPE_I64,  TD_DTYPE_F8_E4M3,
                                        TD_DTYPE_F8_E8M0, TD_DTYPE_I8};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, td_dtype_name(all[i])) == 0) return all[i];
    return TD_DTYPE_NONE;
}

// ----------------------------------------------------------------------------
// one header entry

/* Validates entry `name` of shard `shard` and appends it to set->entries (capacity reserved
 * by the caller). data/data_size describe the shard's data section. */
static int parse_entry(struct st_set *set, int shard, const char *name, json_t *v, const char *data,
                       uint64_t data_size, char *err, size_t errlen) {
    const char *path = set->maps[shard].path;

    if (!json_is_object(v))
        return td_errf(err, errlen, "entry for tensor \"%s\" is not an object in %s", name, path);

    json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return td_errf(err, errlen, "missing or non-string \"dtype\" for tensor \"%s\" in %s", name,
                       path);
    enum td_dtype dtype = dtype_from_name(json_string_value(jd));
    if (dtype == TD_DTYPE_NONE)
        return td_errf(err, errlen, "unsupported dtype \"%s\" for tensor \"%s\" in %s",
                       json_string_value(jd), name, path);

    json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js))
        return td_errf(err, errlen, "missing or non-array \"shape\" for tensor \"%s\" in %s", name,
                       path);
    size_t ndim = json_array_size(js);
    if (ndim > TD_MAX_DIMS)
        return td_errf(err, errlen, "shape has %zu dims (max %d) for tensor \"%s\" in %s", ndim,
                       TD_MAX_DIMS, name, path);

    /* numel saturates at UINT64_MAX; a zero dim makes it 0 regardless */
    int64_t shape[TD_MAX_DIMS] = {0};
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d))
            return td_errf(err, errlen, "shape[%zu] is not an integer for tensor \"%s\" in %s", i,
                           name, path);
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return td_errf(err, errlen, "negative dim %lld in shape for tensor \"%s\" in %s",
                           (long long)x, name, path);
        shape[i] = x;
        if (x != 0 && numel > UINT64_MAX / (uint64_t)x)
            overflow = 1;
        else
            numel *= (uint64_t)x;
    }
    for (size_t i = 0; i < ndim; i++)
        if (shape[i] == 0) numel = 0, overflow = 0;

    json_t *jo = json_object_get(v, "data_offsets");
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(jb) ||
        !json_is_integer(je) || json_integer_value(jb) < 0 || json_integer_value(je) < 0)
        return td_errf(err, errlen,
                       "missing or malformed \"data_offsets\" (want [begin, end], non-negative "
                       "integers) for tensor \"%s\" in %s",
                       name, path);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (begin > end)
        return td_errf(err, errlen, "data_offsets begin %llu > end %llu for tensor \"%s\" in %s",
                       (ull)begin, (ull)end, name, path);
    if (end > data_size)
        return td_errf(err, errlen,
                       "data_offsets end %llu is past the data section (%llu bytes) for tensor "
                       "\"%s\" in %s",
                       (ull)end, (ull)data_size, name, path);

    size_t esize = td_dtype_size(dtype);
    if (overflow || numel > UINT64_MAX / esize)
        return td_errf(err, errlen,
                       "size mismatch for tensor \"%s\" in %s: shape x %s overflows 64 bits, "
                       "actual %llu bytes",
                       name, path, td_dtype_name(dtype), (ull)(end - begin));
    if (numel * esize != end - begin)
        return td_errf(err, errlen,
                       "size mismatch for tensor \"%s\" in %s: expected %llu bytes (shape x %s), "
                       "actual %llu bytes (data_offsets)",
                       name, path, (ull)(numel * esize), td_dtype_name(dtype), (ull)(end - begin));

    struct st_entry *e = &set->entries[set->n_entries];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return td_errf(err, errlen, "out of memory reading %s", path);
    e->t.data = data + begin;
    e->t.dtype = dtype;
    e->t.ndim = (int)ndim;
    memcpy(e->t.shape, shape, sizeof shape);
    e->nbytes = (size_t)(end - begin);
    e->shard = shard;
    set->n_entries++;
    return 0;
}

// ----------------------------------------------------------------------------
// one shard

static int cmp_range(const void *a, const void *b) {
    const struct st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* entries [first, set->n_entries) belong to one shard whose data section starts at data */
static int check_overlap(struct st_set *set, int first, const char *data, char *err,
                         size_t errlen) {
    int n = set->n_entries - first;
    if (n < 2) return 0;
    struct st_range *r = malloc((size_t)n * sizeof *r);
    if (!r) return td_errf(err, errlen, "out of memory");
    for (int i = 0; i < n; i++) {
        const struct st_entry *e = &set->entries[first + i];
        r[i].begin = (uint64_t)((const char *)e->t.data - data);
        r[i].end = r[i].begin + e->nbytes;
        r[i].entry = first + i;
    }
    qsort(r, (size_t)n, sizeof *r, cmp_range);

    /* empty tensors occupy no bytes and can sit anywhere */
    int rc = 0, last = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        if (r[i].begin == r[i].end) continue;
        if (last >= 0 && r[i].begin < r[last].end)
            rc = td_errf(err, errlen,
                         "tensors \"%s\" [%llu, %llu) and \"%s\" [%llu, %llu) overlap in %s",
                         set->entries[r[last].entry].name, (ull)r[last].begin, (ull)r[last].end,
                         set->entries[r[i].entry].name, (ull)r[i].begin, (ull)r[i].end,
                         set->maps[set->entries[r[i].entry].shard].path);
        if (last < 0 || r[i].end > r[last].end) last = i;
    }
    free(r);
    return rc;
}

/* Parses and validates the header of the already mapped shard. */
static int parse_header(struct st_set *set, int shard, char *err, size_t errlen) {
    const struct st_map *m = &set->maps[shard];
    const unsigned char *p = m->base;

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > m->size - 8)
        return td_errf(err, errlen, "header length %llu is past the end of %s (%zu bytes)",
                       (ull)hlen, m->path, m->size);
    if (hlen > ST_MAX_HEADER)
        return td_errf(err, errlen, "header length %llu in %s is absurd (max %llu)", (ull)hlen,
                       m->path, ST_MAX_HEADER);
    const char *data = (const char *)p + 8 + hlen;
    uint64_t data_size = m->size - 8 - hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return td_errf(err, errlen, "malformed JSON header in %s: %s (line %d, column %d)", m->path,
                       jerr.text, jerr.line, jerr.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return td_errf(err, errlen, "header is not a JSON object in %s", m->path);
    }

    size_t count = json_object_size(root);
    if (count > (size_t)(INT_MAX - set->n_entries)) {
        json_decref(root);
        return td_errf(err, errlen, "too many tensors in %s", m->path);
    }
    if (count > 0) {
        size_t want = (size_t)set->n_entries + count;
        struct st_entry *grown = realloc(set->entries, want * sizeof *grown);
        if (!grown) {
            json_decref(root);
            return td_errf(err, errlen, "out of memory reading %s", m->path);
        }
        set->entries = grown;
    }

    int first = set->n_entries, rc = 0;
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (strcmp(name, "__metadata__") == 0) continue;
        rc = parse_entry(set, shard, name, v, data, data_size, err, errlen);
        if (rc) break;
    }
    json_decref(root);
    if (rc) return rc;
    return check_overlap(set, first, data, err, errlen);
}

/* Maps the file at path as a new shard of set and indexes its tensors. */
static int add_shard(struct st_set *set, const char *path, char *err, size_t errlen) {
    struct st_map *maps = realloc(set->maps, (size_t)(set->n_maps + 1) * sizeof *maps);
    if (!maps) return td_errf(err, errlen, "out of memory opening %s", path);
    set->maps = maps;
    struct st_map *m = &maps[set->n_maps];
    memset(m, 0, sizeof *m);
    m->path = strdup(path);
    if (!m->path) return td_errf(err, errlen, "out of memory opening %s", path);
    int shard = set->n_maps++;

    size_t size = 0;
    int fd = td_file_open(path, 0, &size, err, errlen); // a regular file, or refused at once
    if (fd < 0) return -1;
    if (size < 8) {
        close(fd);
        return td_errf(err, errlen, "%s is too short for safetensors (%zu bytes, need at least 8)",
                       path, size);
    }
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED) return td_errf(err, errlen, "cannot mmap %s: %s", path, strerror(e));
    m->base = base;
    m->size = size;
    return parse_header(set, shard, err, errlen);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const struct st_entry *)a)->name, ((const struct st_entry *)b)->name);
}

/* Sorts all entries by name and rejects names that occur twice. */
static int finalize(struct st_set *set, char *err, size_t errlen) {
    if (set->n_entries > 1)
        qsort(set->entries, (size_t)set->n_entries, sizeof *set->entries, cmp_entry);
    for (int i = 1; i < set->n_entries; i++) {
        const struct st_entry *a = &set->entries[i - 1], *b = &set->entries[i];
        if (strcmp(a->name, b->name) == 0)
            return td_errf(err, errlen, "duplicate tensor \"%s\" in %s and %s", a->name,
                           set->maps[a->shard].path, set->maps[b->shard].path);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// sets

int st_set_open_file(struct st_set *set, const char *path, char *err, size_t errlen) {
    memset(set, 0, sizeof *set);
    if (add_shard(set, path, err, errlen) || finalize(set, err, errlen)) {
        st_set_close(set);
        return -1;
    }
    return 0;
}

/* a weight_map entry's shard name and the entry's place in the map */
struct shard_ref {
    const char *name;
    size_t first;
};

static int cmp_shard_ref(const void *a, const void *b) {
    const struct shard_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->first > y->first) - (x->first < y->first);
}

static int cmp_shard_first(const void *a, const void *b) {
    const struct shard_ref *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

/* shard names of refs[n] -> the distinct ones in out[], in order of first mention; their count.
 * Sorting makes it O(n log n): a weight map of 100,000 shards took 30 s compared pairwise. */
static int distinct_shards(struct shard_ref *refs, size_t n, const char **out) {
    qsort(refs, n, sizeof *refs, cmp_shard_ref);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(refs[i].name, refs[k - 1].name) != 0) refs[k++] = refs[i];
    qsort(refs, k, sizeof *refs, cmp_shard_first);
    for (size_t i = 0; i < k; i++)
        out[i] = refs[i].name;
    return (int)k;
}

/* a shard name must stay inside the model directory */
static int shard_name_ok(const char *s) {
    return s[0] != '\0' && strchr(s, '/') == NULL && strstr(s, "..") == NULL;
}

/* Opens every shard the index names once, then checks index and shards agree. */
static int open_index(struct st_set *set, const char *dir, const char *index, char *err,
                      size_t errlen) {
    json_t *root = td_json_load(index, JSON_REJECT_DUPLICATES, err, errlen);
    if (!root) return -1;

    const char **shards = NULL;    /* [n_shards], strings owned by root */
    struct shard_ref *refs = NULL; /* [n_refs] */
    size_t n_refs = 0;
    int n_shards = 0, rc = 0;
    json_t *wm = json_object_get(root, "weight_map");
    const char *name;
    json_t *v;

    if (!json_is_object(root)) {
        rc = td_errf(err, errlen, "%s is not a JSON object", index);
        goto out;
    }
    if (!json_is_object(wm)) {
        rc = td_errf(err, errlen, "missing or non-object \"weight_map\" in %s", index);
        goto out;
    }
    if (json_object_size(wm) == 0) {
        rc = td_errf(err, errlen, "\"weight_map\" in %s is empty", index);
        goto out;
    }
    if (json_object_size(wm) > INT_MAX) {
        rc = td_errf(err, errlen, "too many tensors in %s", index);
        goto out;
    }
    shards = malloc(json_object_size(wm) * sizeof *shards);
    refs = malloc(json_object_size(wm) * sizeof *refs);
    if (!shards || !refs) {
        rc = td_errf(err, errlen, "out of memory reading %s", index);
        goto out;
    }

    /* every entry's shard name, checked; then the distinct names in order of first mention */
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            rc = td_errf(err, errlen, "weight_map entry for tensor \"%s\" is not a string in %s",
                         name, index);
            goto out;
        }
        const char *s = json_string_value(v);
        if (!shard_name_ok(s)) {
            rc = td_errf(err, errlen,
                         "invalid shard name \"%s\" for tensor \"%s\" in %s (want a plain file "
                         "name)",
                         s, name, index);
            goto out;
        }
        refs[n_refs].name = s;
        refs[n_refs].first = n_refs;
        n_refs++;
    }
    n_shards = distinct_shards(refs, n_refs, shards);

    for (int k = 0; k < n_shards; k++) {
        char *path = path_join(dir, shards[k]);
        if (!path) {
            rc = td_errf(err, errlen, "out of memory");
            goto out;
        }
        rc = add_shard(set, path, err, errlen);
        free(path);
        if (rc) goto out;
    }
    rc = finalize(set, err, errlen);
    if (rc) goto out;

    /* shard k is set->maps[k]; every listed tensor is where the index says */
    json_object_foreach(wm, name, v) {
        const char *s = json_string_value(v);
        const struct st_entry *e = st_set_find(set, name);
        if (!e) {
            rc = td_errf(err, errlen, "tensor \"%s\" listed in %s is missing from shard %s", name,
                         index, s);
            goto out;
        }
        if (strcmp(shards[e->shard], s) != 0) {
            rc = td_errf(err, errlen, "tensor \"%s\" is in shard %s but %s says %s", name,
                         shards[e->shard], index, s);
            goto out;
        }
    }
    for (int i = 0; i < set->n_entries; i++) {
        const struct st_entry *e = &set->entries[i];
        if (!json_object_get(wm, e->name)) {
            rc = td_errf(err, errlen, "tensor \"%s\" in shard %s is not listed in %s", e->name,
                         shards[e->shard], index);
            goto out;
        }
    }
out:
    free(refs);
    free(shards);
    json_decref(root);
    return rc;
}

int st_set_open(struct st_set *set, const char *dir, char *err, size_t errlen) {
    memset(set, 0, sizeof *set);
    struct stat st;
    int rc;

    char *index = path_join(dir, "model.safetensors.index.json");
    if (!index) return td_errf(err, errlen, "out of memory");
    if (stat(index, &st) == 0) {
        rc = open_index(set, dir, index, err, errlen);
        free(index);
        if (rc) st_set_close(set);
        return rc;
    }
    free(index);

    char *single = path_join(dir, "model.safetensors");
    if (!single) return td_errf(err, errlen, "out of memory");
    if (stat(single, &st) == 0) {
        rc = st_set_open_file(set, single, err, errlen);
        free(single);
        return rc;
    }
    free(single);
    return td_errf(err, errlen, "no model.safetensors or model.safetensors.index.json in %s", dir);
}

const struct st_entry *st_set_find(const struct st_set *set, const char *name) {
    int lo = 0, hi = set->n_entries - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(set->entries[mid].name, name);
        if (c == 0) return &set->entries[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

void st_set_close(struct st_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_entries; i++)
        free(set->entries[i].name);
    free(set->entries);
    for (int i = 0; i < set->n_maps; i++) {
        if (set->maps[i].base) munmap(set->maps[i].base, set->maps[i].size);
        free(set->maps[i].path);
    }
    free(set->maps);
    memset(set, 0, sizeof *set);
}
