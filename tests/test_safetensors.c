/* test_safetensors.c: the safetensors loader on valid and broken files, single and sharded.
 *
 *   make build/tests/test_safetensors && build/tests/test_safetensors
 *
 * Every file is written from C into a mkdtemp directory under /tmp (removed at the end).
 * Headers are written with ' for " to keep the JSON readable, and padded with spaces to a
 * multiple of 8 bytes so the data section is aligned. Prints "OK <case>" or
 * "FAIL <case>: <why>" per case; exits 0 iff all pass. TD_TEST_VERBOSE=1 also prints each
 * expected error message.
 */
#include "model/safetensors.h"
#include "check.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char root[64]; /* the mkdtemp directory */

// ----------------------------------------------------------------------------
// helpers

/* root/rel, in a static buffer good until the next call */
static const char *at(const char *fmt, ...) {
    static char buf[512], rel[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

static int write_bytes(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = (na == 0 || fwrite(a, 1, na, f) == na) && (nb == 0 || fwrite(b, 1, nb, f) == nb);
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int write_text(const char *path, const char *s) {
    char *q = strdup(s);
    for (char *p = q; *p; p++)
        if (*p == '\'') *p = '"';
    int rc = write_bytes(path, q, strlen(q), NULL, 0);
    free(q);
    return rc;
}

/* u64 little-endian header length, header (' -> ") padded with spaces to 8, then data */
static int write_st(const char *path, const char *header, const void *data, size_t n) {
    size_t len = strlen(header), padded = (len + 7) & ~(size_t)7;
    unsigned char *buf = malloc(8 + padded);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    for (size_t i = 0; i < padded; i++)
        buf[8 + i] = i < len ? (unsigned char)header[i] : ' ';
    for (size_t i = 0; i < len; i++)
        if (buf[8 + i] == '\'') buf[8 + i] = '"';
    int rc = write_bytes(path, buf, 8 + padded, data, n);
    free(buf);
    return rc;
}

/* a raw header length followed by arbitrary bytes */
static int write_hlen(const char *path, uint64_t hlen, const char *body) {
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(hlen >> (8 * i));
    return write_bytes(path, len, 8, body, strlen(body));
}

static void rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
            rm_rf(sub);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int set_is_zero(const struct st_set *s) {
    return s->maps == NULL && s->n_maps == 0 && s->entries == NULL && s->n_entries == 0;
}

/* open (a file, or a directory when dir) must fail with `want` in a one-line message */
static void expect_fail(const char *name, const char *path, int dir, const char *want) {
    struct st_set set;
    char err[512] = "", why[700];
    memset(&set, 0x5a, sizeof set); /* open must not trust what it is given */
    int rc = dir ? st_set_open(&set, path, err, sizeof err)
                 : st_set_open_file(&set, path, err, sizeof err);
    const char *bad = NULL;
    if (rc != -1)
        bad = "open succeeded";
    else if (!set_is_zero(&set))
        bad = "set not zeroed after failure";
    else if (err[0] == '\0' || strchr(err, '\n'))
        bad = "message empty or not one line";
    else if (!strstr(err, want))
        bad = "message lacks the expected word";
    st_set_close(&set);
    st_set_close(&set);
    if (getenv("TD_TEST_VERBOSE")) printf("  %s: %s\n", name, err);
    if (bad) {
        snprintf(why, sizeof why, "%s (want \"%s\", got \"%s\")", bad, want, err);
        report(name, why);
    } else {
        report(name, NULL);
    }
}

/* writes root/NAME.safetensors from header + data and expects failure */
static void bad_file(const char *name, const char *header, const void *data, size_t n,
                     const char *want) {
    const char *path = at("%s.safetensors", name);
    if (write_st(path, header, data, n)) {
        report(name, "cannot write test file");
        return;
    }
    expect_fail(name, path, 0, want);
}

static int same_bits(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

// ----------------------------------------------------------------------------
// valid files

static void test_dtype_names(void) {
    char why[600] = "";
    REQUIRE(strcmp(td_dtype_name(TD_DTYPE_F32), "F32") == 0);
    REQUIRE(strcmp(td_dtype_name(TD_DTYPE_BF16), "BF16") == 0);
    REQUIRE(strcmp(td_dtype_name(TD_DTYPE_F16), "F16") == 0);
    REQUIRE(strcmp(td_dtype_name(TD_DTYPE_I32), "I32") == 0);
    REQUIRE(strcmp(td_dtype_name(TD_DTYPE_I64), "I64") == 0);
    REQUIRE(strcmp(td_dtype_name(TD_DTYPE_NONE), "NONE") == 0);
done:
    report("dtype_names", why[0] ? why : NULL);
}

/* all 65536 halves against an independent ldexp formulation */
static void test_f16_exhaustive(void) {
    char why[600] = "";
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
        float got = td_f16_to_f32((uint16_t)h), want;
        if (exp == 31 && mant != 0) {
            if (!isnan(got)) {
                snprintf(why, sizeof why, "0x%04x should be nan", h);
                break;
            }
            continue;
        }
        if (exp == 31)
            want = INFINITY;
        else if (exp == 0)
            want = (float)ldexp(mant, -24);
        else
            want = (float)ldexp(1024 + mant, exp - 25);
        if (sign) want = -want;
        if (!same_bits(got, want)) {
            snprintf(why, sizeof why, "0x%04x gave %g, want %g", h, got, want);
            break;
        }
    }
    report("f16_exhaustive", why[0] ? why : NULL);
}

static void test_single_file(void) {
    char why[600] = "", err[512] = "";
    struct st_set set = {0};
    unsigned char data[88] = {0};
    const float a[6] = {0, 1.5f, 3, 4.5f, 6, 7.5f}, g = 42.0f;
    const int64_t e[2] = {-5, (int64_t)1 << 40};
    const int32_t d[3] = {-1, 7, 2147483647};
    const uint16_t b[4] = {0x3F80, 0xC000, 0x3F00, 0x4049};
    /* 1, -2, min subnormal, max subnormal, min normal, max, inf, -inf, nan, -0, 0.333251953125 */
    const uint16_t c[11] = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x0400, 0x7BFF,
                            0x7C00, 0xFC00, 0x7E00, 0x8000, 0x3555};
    memcpy(data + 0, a, 24);
    memcpy(data + 24, e, 16);
    memcpy(data + 40, d, 12);
    memcpy(data + 52, b, 8);
    memcpy(data + 60, c, 22);
    memcpy(data + 84, &g, 4);
    const char *hdr = "{'__metadata__': {'format': 'pt', 'note': 'ignored'},"
                      " 'a': {'dtype': 'F32', 'shape': [2, 3], 'data_offsets': [0, 24]},"
                      " 'e': {'dtype': 'I64', 'shape': [2], 'data_offsets': [24, 40]},"
                      " 'd': {'dtype': 'I32', 'shape': [3], 'data_offsets': [40, 52]},"
                      " 'b': {'dtype': 'BF16', 'shape': [4], 'data_offsets': [52, 60]},"
                      " 'c': {'dtype': 'F16', 'shape': [11], 'data_offsets': [60, 82]},"
                      " 'f': {'dtype': 'F32', 'shape': [0, 3], 'data_offsets': [82, 82]},"
                      " 'g': {'dtype': 'F32', 'shape': [], 'data_offsets': [84, 88]}}";
    const char *path = at("single.safetensors");
    REQUIRE(write_st(path, hdr, data, sizeof data) == 0);
    if (st_set_open_file(&set, path, err, sizeof err) != 0) {
        snprintf(why, sizeof why, "open failed: %s", err);
        goto done;
    }
    REQUIRE(set.n_maps == 1 && set.n_entries == 7);
    for (int i = 0; i < 7; i++)
        REQUIRE(set.entries[i].name[0] == "abcdefg"[i]);

    const struct st_entry *ea = st_set_find(&set, "a");
    REQUIRE(ea && ea->t.dtype == TD_DTYPE_F32 && ea->t.ndim == 2);
    REQUIRE(ea->t.shape[0] == 2 && ea->t.shape[1] == 3 && ea->nbytes == 24 && ea->shard == 0);
    size_t hdr_bytes = (strlen(hdr) + 7) & ~(size_t)7;
    REQUIRE((const char *)ea->t.data == (const char *)set.maps[0].base + 8 + hdr_bytes);
    for (int i = 0; i < 6; i++)
        REQUIRE(td_tensor_getf(&ea->t, i) == a[i]);

    const struct st_entry *eb = st_set_find(&set, "b");
    REQUIRE(eb && eb->t.dtype == TD_DTYPE_BF16 && eb->nbytes == 8);
    REQUIRE(td_tensor_getf(&eb->t, 0) == 1.0f && td_tensor_getf(&eb->t, 1) == -2.0f);
    REQUIRE(td_tensor_getf(&eb->t, 2) == 0.5f && td_tensor_getf(&eb->t, 3) == 3.140625f);

    const struct st_entry *ec = st_set_find(&set, "c");
    REQUIRE(ec && ec->t.dtype == TD_DTYPE_F16 && td_tensor_numel(&ec->t) == 11);
    float cf[11];
    td_tensor_read_f32(&ec->t, 0, 11, cf);
    REQUIRE(cf[0] == 1.0f && cf[1] == -2.0f);
    REQUIRE(cf[2] == 0x1p-24f && cf[3] == 1023 * 0x1p-24f && cf[4] == 0x1p-14f);
    REQUIRE(cf[5] == 65504.0f && isinf(cf[6]) && cf[6] > 0 && isinf(cf[7]) && cf[7] < 0);
    REQUIRE(isnan(cf[8]) && cf[9] == 0.0f && signbit(cf[9]) && cf[10] == 0.333251953125f);
    float part[3];
    td_tensor_read_f32(&ec->t, 2, 3, part);
    REQUIRE(part[0] == cf[2] && part[1] == cf[3] && part[2] == cf[4]);

    const struct st_entry *ed = st_set_find(&set, "d");
    REQUIRE(ed && ed->t.dtype == TD_DTYPE_I32);
    REQUIRE(td_tensor_geti(&ed->t, 0) == -1 && td_tensor_geti(&ed->t, 1) == 7);
    REQUIRE(td_tensor_geti(&ed->t, 2) == 2147483647);
    td_tensor_read_f32(&ed->t, 0, 2, part);
    REQUIRE(part[0] == -1.0f && part[1] == 7.0f);

    const struct st_entry *ee = st_set_find(&set, "e");
    REQUIRE(ee && ee->t.dtype == TD_DTYPE_I64 && ee->t.shape[0] == 2);
    REQUIRE(td_tensor_geti(&ee->t, 0) == -5 && td_tensor_geti(&ee->t, 1) == ((int64_t)1 << 40));

    const struct st_entry *ef = st_set_find(&set, "f");
    REQUIRE(ef && ef->nbytes == 0 && ef->t.ndim == 2 && td_tensor_numel(&ef->t) == 0);

    const struct st_entry *eg = st_set_find(&set, "g");
    REQUIRE(eg && eg->t.ndim == 0 && td_tensor_numel(&eg->t) == 1 &&
            td_tensor_getf(&eg->t, 0) == g);

    REQUIRE(st_set_find(&set, "__metadata__") == NULL);
    REQUIRE(st_set_find(&set, "zz") == NULL && st_set_find(&set, "") == NULL);
    REQUIRE(st_set_find(&set, "0") == NULL && st_set_find(&set, "a.b") == NULL);
done:
    st_set_close(&set);
    if (!why[0] && !set_is_zero(&set)) snprintf(why, sizeof why, "close did not zero the set");
    st_set_close(&set); /* a second close is harmless */
    report("single_file_all_dtypes", why[0] ? why : NULL);
}

static void test_empty_set_ops(void) {
    char why[600] = "";
    struct st_set set;
    memset(&set, 0, sizeof set);
    REQUIRE(st_set_find(&set, "x") == NULL);
    st_set_close(&set);
    st_set_close(NULL);
    REQUIRE(set_is_zero(&set));
done:
    report("zeroed_set_close_and_find", why[0] ? why : NULL);
}

/* a header with only __metadata__ and one empty tensor, and no data at all */
static void test_metadata_and_empty(void) {
    char why[600] = "", err[512] = "";
    struct st_set set = {0};
    const char *path = at("meta.safetensors");
    REQUIRE(write_st(path,
                     "{'__metadata__': {'format': 'pt'},"
                     " 'empty': {'dtype': 'BF16', 'shape': [4, 0], 'data_offsets': [0, 0]}}",
                     NULL, 0) == 0);
    if (st_set_open_file(&set, path, err, sizeof err) != 0) {
        snprintf(why, sizeof why, "open failed: %s", err);
        goto done;
    }
    REQUIRE(set.n_entries == 1 && strcmp(set.entries[0].name, "empty") == 0);
    REQUIRE(set.entries[0].nbytes == 0 && td_tensor_numel(&set.entries[0].t) == 0);
done:
    st_set_close(&set);
    report("metadata_and_empty_tensor", why[0] ? why : NULL);
}

/* model directory holding model.safetensors only */
static void test_dir_single(void) {
    char why[600] = "", err[512] = "";
    struct st_set set = {0};
    const float x[2] = {3, 4};
    REQUIRE(mkdir(at("single_dir"), 0700) == 0);
    REQUIRE(write_st(at("single_dir/model.safetensors"),
                     "{'w': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}}", x, 8) == 0);
    if (st_set_open(&set, at("single_dir"), err, sizeof err) != 0) {
        snprintf(why, sizeof why, "open failed: %s", err);
        goto done;
    }
    const struct st_entry *e = st_set_find(&set, "w");
    REQUIRE(set.n_maps == 1 && e && td_tensor_getf(&e->t, 1) == 4.0f);
done:
    st_set_close(&set);
    report("dir_with_model_safetensors", why[0] ? why : NULL);
}

// ----------------------------------------------------------------------------
// sharded directories

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

/* dir/SHARD1 = {x F32[2], y BF16[2]} (+ extra1), dir/SHARD2 = {z I64[1]} (+ extra2),
 * dir/model.safetensors.index.json = index (' -> ") */
static int make_sharded(const char *dir, const char *extra1, const char *extra2,
                        const char *index) {
    unsigned char d1[32] = {0}, d2[16] = {0};
    const float x[2] = {1, 2};
    const uint16_t y[2] = {0x4040, 0xBF80}; /* 3, -1 */
    const int64_t z = 99;
    char h1[512], h2[512];
    memcpy(d1, x, 8);
    memcpy(d1 + 8, y, 4);
    memcpy(d2, &z, 8);
    snprintf(h1, sizeof h1,
             "{'x': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},"
             " 'y': {'dtype': 'BF16', 'shape': [2], 'data_offsets': [8, 12]}%s}",
             extra1);
    snprintf(h2, sizeof h2, "{'z': {'dtype': 'I64', 'shape': [1], 'data_offsets': [0, 8]}%s}",
             extra2);
    if (mkdir(at("%s", dir), 0700) != 0) return -1;
    if (write_st(at("%s/" SHARD1, dir), h1, d1, sizeof d1) != 0) return -1;
    if (write_st(at("%s/" SHARD2, dir), h2, d2, sizeof d2) != 0) return -1;
    return write_text(at("%s/model.safetensors.index.json", dir), index);
}

static const char *good_index = "{'metadata': {'total_size': 20}, 'weight_map': {"
                                "'x': '" SHARD1 "', 'y': '" SHARD1 "', 'z': '" SHARD2 "'}}";

static void test_sharded(void) {
    char why[600] = "", err[512] = "";
    struct st_set set = {0};
    REQUIRE(make_sharded("sharded", "", "", good_index) == 0);
    if (st_set_open(&set, at("sharded"), err, sizeof err) != 0) {
        snprintf(why, sizeof why, "open failed: %s", err);
        goto done;
    }
    REQUIRE(set.n_maps == 2 && set.n_entries == 3);
    const struct st_entry *x = st_set_find(&set, "x"), *y = st_set_find(&set, "y");
    const struct st_entry *z = st_set_find(&set, "z");
    REQUIRE(x && y && z && st_set_find(&set, "w") == NULL);
    REQUIRE(strstr(set.maps[x->shard].path, SHARD1) && strstr(set.maps[z->shard].path, SHARD2));
    REQUIRE(x->shard == y->shard && x->shard != z->shard);
    REQUIRE(td_tensor_getf(&x->t, 1) == 2.0f && td_tensor_getf(&y->t, 0) == 3.0f);
    REQUIRE(td_tensor_getf(&y->t, 1) == -1.0f && td_tensor_geti(&z->t, 0) == 99);
done:
    st_set_close(&set);
    report("sharded_index_two_shards", why[0] ? why : NULL);
}

static void bad_sharded(const char *name, const char *extra1, const char *extra2, const char *index,
                        const char *want) {
    if (make_sharded(name, extra1, extra2, index) != 0) {
        report(name, "cannot write test files");
        return;
    }
    expect_fail(name, at("%s", name), 1, want);
}

static void test_bad_sharded(void) {
    const char *dup = ", 'x': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}";
    bad_sharded("dup_across_shards", "", dup, good_index, "duplicate tensor \"x\"");
    bad_sharded("index_missing_shard", "", "",
                "{'weight_map': {'x': '" SHARD1 "', 'y': '" SHARD1 "', 'z': '" SHARD2
                "', 'q': 'model-00003-of-00003.safetensors'}}",
                "model-00003-of-00003.safetensors");
    bad_sharded("index_tensor_absent_from_shard", "", "",
                "{'weight_map': {'x': '" SHARD1 "', 'y': '" SHARD1 "', 'z': '" SHARD2
                "', 'w': '" SHARD2 "'}}",
                "\"w\" listed in");
    bad_sharded("index_names_wrong_shard", "", "",
                "{'weight_map': {'x': '" SHARD2 "', 'y': '" SHARD1 "', 'z': '" SHARD2 "'}}",
                "tensor \"x\" is in shard");
    bad_sharded("shard_tensor_not_in_index",
                ", 'extra': {'dtype': 'I32', 'shape': [1], 'data_offsets': [12, 16]}", "",
                good_index, "\"extra\" in shard");
    bad_sharded("index_shard_with_dotdot", "", "", "{'weight_map': {'x': '../" SHARD1 "'}}",
                "invalid shard name");
    bad_sharded("index_shard_with_slash", "", "", "{'weight_map': {'x': 'sub/" SHARD1 "'}}",
                "invalid shard name");
    bad_sharded("index_no_weight_map", "", "", "{'metadata': {}}", "weight_map");
    bad_sharded("index_weight_map_not_strings", "", "", "{'weight_map': {'x': 1}}", "not a string");
    bad_sharded("index_malformed_json", "", "", "{'weight_map': ", "malformed JSON");
    bad_sharded("bad_header_in_shard", "",
                ", 'q': {'dtype': 'F8_E5M2', 'shape': [8], 'data_offsets': [8, 16]}", good_index,
                SHARD2);

    if (mkdir(at("empty_dir"), 0700) != 0)
        report("no_model_file", "cannot mkdir");
    else
        expect_fail("no_model_file", at("empty_dir"), 1, "no model.safetensors");
    expect_fail("missing_dir", at("does_not_exist"), 1, "no model.safetensors");
}

/* FIFOs where the loader expects files (an open for reading would wait for a writer forever),
 * and an index past the JSON size limit: refused at once, naming the file */
static void test_special_files(void) {
    struct {
        const char *name, *fifo; /* the case; the file made a FIFO (in a sharded dir) */
    } fifos[] = {
        {.name = "fifo_model_safetensors", .fifo = "model.safetensors"},
        {.name = "fifo_index_json", .fifo = "model.safetensors.index.json"},
        {.name = "fifo_shard", .fifo = SHARD2},
    };
    for (size_t i = 0; i < sizeof fifos / sizeof *fifos; i++) {
        const char *dir = fifos[i].name;
        if (make_sharded(dir, "", "", good_index) != 0) {
            report(fifos[i].name, "cannot write test files");
            continue;
        }
        if (i == 0) unlink(at("%s/model.safetensors.index.json", dir)); // the single-file layout
        unlink(at("%s/%s", dir, fifos[i].fifo));
        if (mkfifo(at("%s/%s", dir, fifos[i].fifo), 0600) != 0) {
            report(fifos[i].name, "cannot mkfifo");
            continue;
        }
        case_deadline(fifos[i].name, 10);
        expect_fail(fifos[i].name, at("%s", dir), 1, "not a regular file");
        case_deadline(NULL, 0);
    }
    // a 65 MiB index (sparse): past the 64 MiB any JSON file may have, refused unread
    if (make_sharded("index_too_large", "", "", good_index) != 0 ||
        truncate(at("index_too_large/model.safetensors.index.json"), (off_t)65 << 20) != 0)
        report("index_too_large", "cannot write test files");
    else
        expect_fail("index_too_large", at("index_too_large"), 1, "64 MiB");
}

/* an index naming 100,000 distinct shards, none present: the missing-shard error comes at
 * once (finding the distinct names was quadratic: 26-35 s before the first open) */
static void test_many_shards(void) {
    char why[600] = "", err[512] = "";
    struct st_set set;
    const int n = 100000;
    size_t cap = (size_t)n * 48 + 64, len = 0;
    char *text = malloc(cap);
    REQUIRE(text && mkdir(at("many_shards"), 0700) == 0);
    len += (size_t)snprintf(text + len, cap - len, "{\"weight_map\": {");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s\"t%d\": \"s%d.safetensors\"",
                                i ? ", " : "", i, i);
    len += (size_t)snprintf(text + len, cap - len, "}}");
    REQUIRE(write_bytes(at("many_shards/model.safetensors.index.json"), text, len, NULL, 0) == 0);
    case_deadline("index_100k_distinct_shards", 30);
    clock_t t0 = clock();
    int rc = st_set_open(&set, at("many_shards"), err, sizeof err);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    case_deadline(NULL, 0);
    REQUIRE(rc == -1 && strstr(err, "cannot open") && strstr(err, "/s0.safetensors"));
    if (s > 2.0) snprintf(why, sizeof why, "took %.1f s of CPU (limit 2)", s);
done:
    free(text);
    if (getenv("TD_TEST_VERBOSE")) printf("  %s\n", err);
    report("index_100k_distinct_shards", why[0] ? why : NULL);
}

// ----------------------------------------------------------------------------
// broken single files

static void test_bad_files(void) {
    const float z[8] = {0};
    const char *ok_entry = "'ok': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}";
    char hdr[512];

    write_bytes(at("short.safetensors"), "\x01\x00\x00\x00\x00", 5, NULL, 0);
    expect_fail("file_shorter_than_8", at("short.safetensors"), 0, "too short");
    write_bytes(at("zero.safetensors"), "", 0, NULL, 0);
    expect_fail("file_empty", at("zero.safetensors"), 0, "too short");
    expect_fail("file_missing", at("nope.safetensors"), 0, "cannot open");
    mkdir(at("a_dir.safetensors"), 0700);
    expect_fail("file_is_directory", at("a_dir.safetensors"), 0, "not a regular file");

    write_hlen(at("hlen_past.safetensors"), 1000, "{'a': 1}            ");
    expect_fail("header_length_past_end", at("hlen_past.safetensors"), 0, "header length 1000");
    write_hlen(at("hlen_huge.safetensors"), 0xFFFFFFFFFFFFFFF0ull, "{}");
    expect_fail("header_length_huge", at("hlen_huge.safetensors"), 0, "header length");

    /* header length 150 MB inside a sparse 160 MB file: in range but absurd */
    const char *sparse = at("hlen_absurd.safetensors");
    if (write_hlen(sparse, 150000000, "{") == 0 && truncate(sparse, 160000000) == 0)
        expect_fail("header_length_absurd", sparse, 0, "absurd");
    else
        report("header_length_absurd", "cannot write sparse file");

    /* data section cut short: header promises 32 bytes, file holds 12 */
    bad_file("truncated_data_section",
             "{'t': {'dtype': 'F32', 'shape': [8], 'data_offsets': [0, 32]}}", z, 12,
             "past the data section");

    bad_file("malformed_json", "{'a': {'dtype': 'F32', ", z, 32, "malformed JSON");
    bad_file("header_is_array", "[1, 2, 3]", z, 32, "not a JSON object");
    bad_file("header_with_nul", "{'a\\u0000b': {}}", z, 32, "malformed JSON");
    bad_file("entry_not_object", "{'a': 5}", z, 32, "not an object");
    bad_file("duplicate_key_in_header",
             "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},"
             " 'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}}",
             z, 32, "duplicate");
    bad_file("missing_dtype", "{'a': {'shape': [2], 'data_offsets': [0, 8]}}", z, 32,
             "\"dtype\" for tensor \"a\"");
    bad_file("dtype_not_string", "{'a': {'dtype': 5, 'shape': [2], 'data_offsets': [0, 8]}}", z, 32,
             "dtype");
    snprintf(hdr, sizeof hdr,
             "{%s, 'x': {'dtype': 'F8_E5M2', 'shape': [8], 'data_offsets': [8, 16]}}", ok_entry);
    bad_file("unsupported_dtype", hdr, z, 32, "unsupported dtype \"F8_E5M2\" for tensor \"x\"");
    bad_file("missing_shape", "{'a': {'dtype': 'F32', 'data_offsets': [0, 8]}}", z, 32,
             "\"shape\"");
    bad_file("shape_not_list", "{'a': {'dtype': 'F32', 'shape': 2, 'data_offsets': [0, 8]}}", z, 32,
             "\"shape\"");
    bad_file("shape_dim_not_int", "{'a': {'dtype': 'F32', 'shape': [2.0], 'data_offsets': [0, 8]}}",
             z, 32, "shape[0]");
    bad_file("too_many_dims",
             "{'a': {'dtype': 'F32', 'shape': [1, 1, 1, 1, 2], 'data_offsets': [0, 8]}}", z, 32,
             "5 dims");
    bad_file("negative_dim", "{'a': {'dtype': 'F32', 'shape': [-2], 'data_offsets': [0, 8]}}", z,
             32, "negative dim");
    bad_file("missing_data_offsets", "{'a': {'dtype': 'F32', 'shape': [2]}}", z, 32,
             "data_offsets");
    bad_file("data_offsets_one_value", "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8]}}",
             z, 32, "data_offsets");
    bad_file("data_offsets_negative",
             "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [-8, 0]}}", z, 32,
             "data_offsets");
    bad_file("size_mismatch", "{'a': {'dtype': 'F32', 'shape': [3], 'data_offsets': [0, 8]}}", z,
             32, "expected 12 bytes");
    bad_file("size_overflow",
             "{'a': {'dtype': 'I64', 'shape': [4294967296, 4294967296, 4294967296],"
             " 'data_offsets': [0, 8]}}",
             z, 32, "overflows");
    bad_file("offset_past_end", "{'a': {'dtype': 'F32', 'shape': [16], 'data_offsets': [0, 64]}}",
             z, 32, "past the data section");
    bad_file("begin_after_end", "{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [16, 8]}}", z,
             32, "begin 16 > end 8");
    bad_file("overlapping_ranges",
             "{'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]},"
             " 'b': {'dtype': 'F32', 'shape': [4], 'data_offsets': [8, 24]}}",
             z, 32, "overlap");
    bad_file("range_inside_another",
             "{'big': {'dtype': 'F32', 'shape': [8], 'data_offsets': [0, 32]},"
             " 'c': {'dtype': 'F32', 'shape': [1], 'data_offsets': [24, 28]},"
             " 'small': {'dtype': 'F32', 'shape': [1], 'data_offsets': [8, 12]}}",
             z, 32, "overlap");
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/td_test_st_XXXXXX");
    if (!mkdtemp(root)) {
        printf("FAIL setup: mkdtemp failed\n");
        return 1;
    }
    test_dtype_names();
    test_f16_exhaustive();
    test_single_file();
    test_empty_set_ops();
    test_metadata_and_empty();
    test_dir_single();
    test_sharded();
    test_bad_sharded();
    test_special_files();
    test_many_shards();
    test_bad_files();
    rm_rf(root);
    return check_failures ? 1 : 0;
}
