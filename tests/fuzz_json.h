/* fuzz_json.h: a JSON-aware libFuzzer mutator for the targets whose input is JSON text
 * (fuzz_config, fuzz_engine, fuzz_tokjson). Include it once in the target's file.
 *
 * Byte mutations of JSON text mostly break the syntax, and some values cannot be reached by them
 * at all: libFuzzer learns the operands of integer compares in instrumented code, but not those
 * of float compares or of jansson's number parsing (an uninstrumented library). So half of the
 * mutations parse the input and change one node in place: a number becomes a boundary value
 * (0, -1, 2^31 - 1, 2^63 - 1, 2^63 as a real, 1e308, ...) or moves by one, any value becomes one
 * of another type, an object member is removed, an array element is removed or doubled; then
 * the tree is written back compactly. The other half, and any input that is not JSON, get
 * libFuzzer's own mutations (with the target's dictionary). Bytes after a NUL are kept as they
 * are (fuzz_tokjson's tokenizer_config.json), the JSON before it is what is mutated.
 */
#ifndef TD_FUZZ_JSON_H
#define TD_FUZZ_JSON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

#define FJ_MAX_NODES 4096

/* a node of the tree, by where it hangs: parent[key] or parent[index] */
struct fj_slot {
    json_t *parent;
    const char *key; /* NULL: an array element */
    size_t index;
    json_t *value;
};

static size_t fj_collect(json_t *v, struct fj_slot *s, size_t n) {
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (n == FJ_MAX_NODES) break;
            s[n++] = (struct fj_slot){.parent = v, .key = k, .index = 0, .value = x};
            n = fj_collect(x, s, n);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v) && n < FJ_MAX_NODES; i++) {
            s[n++] = (struct fj_slot){
                .parent = v, .key = NULL, .index = i, .value = json_array_get(v, i)};
            n = fj_collect(json_array_get(v, i), s, n);
        }
    }
    return n;
}

static uint64_t fj_next(uint64_t *r) {
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    return *r;
}

static json_t *fj_boundary(uint64_t r) {
    static const json_int_t ints[] = {
        0,         -1,       1,          2,          3,           255,        256,
        65536,     1048576,  2147483647, 2147483648, -2147483649, 4294967296, 9007199254740993,
        INT64_MAX, INT64_MIN};
    static const double reals[] = {
        0.5,    -0.0,         1.5,    1e-320, 1e308,
        -1e308, 2147483648.0, 0x1p63, 0x1p64}; // 0x1p63: what 2^63 - 1 is as a double
    size_t ni = sizeof ints / sizeof ints[0], nr = sizeof reals / sizeof reals[0];
    r %= ni + nr;
    return r < ni ? json_integer(ints[r]) : json_real(reals[r - ni]);
}

/* a value of some type, for replacing a node */
static json_t *fj_any(uint64_t r) {
    switch (r % 8) {
    case 0: return json_null();
    case 1: return json_true();
    case 2: return json_false();
    case 3: return json_string("");
    case 4: return json_array();
    case 5: return json_object();
    default: return fj_boundary(r >> 3);
    }
}

/* one structural mutation of root; 0 if nothing was changed */
static int fj_mutate(json_t *root, uint64_t *r) {
    static struct fj_slot s[FJ_MAX_NODES];
    size_t n = fj_collect(root, s, 0);
    if (!n) return 0;
    struct fj_slot *p = &s[fj_next(r) % n];
    unsigned what = (unsigned)(fj_next(r) % 8);
    json_t *nv = NULL;
    if (what == 0) { // remove the node
        return p->key ? !json_object_del(p->parent, p->key)
                      : !json_array_remove(p->parent, p->index);
    }
    if (what == 1 && !p->key) // double an array element
        return !json_array_insert_new(p->parent, p->index, json_deep_copy(p->value));
    if (json_is_integer(p->value) && what <= 4) {
        json_int_t v = json_integer_value(p->value);
        json_int_t d = what == 2 ? 1 : -1;
        nv = what <= 3 && !(v == INT64_MAX && d > 0) && !(v == INT64_MIN && d < 0)
                 ? json_integer(v + d)
                 : fj_boundary(fj_next(r));
    } else if (json_is_number(p->value) && what <= 5) {
        nv = fj_boundary(fj_next(r));
    } else {
        nv = fj_any(fj_next(r));
    }
    if (!nv) return 0;
    return p->key ? !json_object_set_new(p->parent, p->key, nv)
                  : !json_array_set_new(p->parent, p->index, nv);
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_n = nul ? (size_t)(nul - data) : size;
    json_t *root = NULL;
    if (fj_next(&r) & 1) root = json_loadb((const char *)data, json_n, JSON_DECODE_ANY, NULL);
    if (!root) return LLVMFuzzerMutate(data, size, max_size);
    int changed = 0;
    for (unsigned k = 1 + (unsigned)(fj_next(&r) % 3); k; k--)
        changed |= fj_mutate(root, &r);
    char *text = changed ? json_dumps(root, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(root);
    size_t tn = text ? strlen(text) : 0, rest = size - json_n;
    if (!text || tn + rest > max_size) {
        free(text);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    memmove(data + tn, data + json_n, rest); // the NUL and what follows it
    memcpy(data, text, tn);
    free(text);
    return tn + rest;
}

#endif
