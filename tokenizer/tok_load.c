/* tok_load.c: builds a struct tok from HF tokenizer.json (+ tokenizer_config.json).
 *
 * Every component is checked here, once: an unknown or unsupported "type" is refused with its
 * name and where it sits ("pre_tokenizer.pretokenizers[2]: Metaspace is not supported"), so
 * encoding never meets a configuration it cannot reproduce. Ids follow HF: an added token whose
 * content is in the model vocab takes that id, otherwise the id written in the file.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "kernels/err.h"
#include "model/fileio.h"
#include "tokenizer/tok_internal.h"

#define GPT2_PATTERN                                                                               \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *xstrndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

// ---------------------------------------------------------------- the id table

/* Ids must lie below 2 * (vocab entries + added tokens) + 1024. The id tables are as long as
 * the largest id, so one id of 2^30 in a tiny file would reserve gigabytes; real tokenizers
 * number their tokens densely (added tokens continue the vocab), and the slack keeps files with
 * holes in their ids loading. */
static size_t id_bound(json_t *root) {
    size_t n = json_object_size(json_object_get(json_object_get(root, "model"), "vocab")) +
               json_array_size(json_object_get(root, "added_tokens"));
    return 2 * n + 1024;
}

static int id_too_big(json_int_t id, size_t bound, const char *where, char *err, size_t errlen) {
    if ((uint64_t)id < bound) return 0;
    return td_errf(err, errlen,
                   "%s: id %lld is past the tokens the file holds (ids must be below %zu)", where,
                   (long long)id, bound);
}

/* a post-processor's token id: an integer in [0, INT32_MAX] (a wider one would wrap to another
 * token when narrowed); 0 with *out, or -1 with the message */
static int post_id(json_t *v, const char *where, int32_t *out, char *err, size_t errlen) {
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0 || id > INT32_MAX)
        return td_errf(err, errlen, "%s: post-processor id %lld is not a token id", where,
                       (long long)id);
    *out = (int32_t)id;
    return 0;
}

static int set_str(struct tok *t, int32_t id, const char *s, size_t n) {
    if (id < 0) return -1;
    if ((size_t)id >= t->id_cap) {
        size_t cap = t->id_cap ? t->id_cap : 1024;
        while (cap <= (size_t)id)
            cap *= 2;
        uint64_t *off = realloc(t->str_off, cap * sizeof *off);
        if (off) t->str_off = off;
        uint32_t *len = realloc(t->str_len, cap * sizeof *len);
        if (len) t->str_len = len;
        unsigned char *flag = realloc(t->flag, cap);
        if (flag) t->flag = flag;
        if (!off || !len || !flag) return -1;
        for (size_t i = t->id_cap; i < cap; i++) {
            t->str_len[i] = UINT32_MAX;
            t->flag[i] = 0;
        }
        t->id_cap = cap;
    }
    if (id >= t->n_vocab) t->n_vocab = id + 1;
    t->str_off[id] = t->strs.n;
    t->str_len[id] = (uint32_t)n;
    return tok_buf_put(&t->strs, s, n);
}

// ---------------------------------------------------------------- model

static int load_model(struct tok *t, json_t *m, size_t bound, char *err, size_t errlen) {
    if (!json_is_object(m))
        return td_errf(err, errlen, "tokenizer.json has no \"model\"%s%s", "", "");
    const char *type = jstr(m, "type");
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (type ? strcmp(type, "BPE") : !merges)
        return td_errf(err, errlen, "model: %s is not supported (only BPE)%s",
                       type ? type : "(untyped)", "");
    if (!json_is_object(vocab))
        return td_errf(err, errlen, "model.vocab is not an object%s%s", "", "");
    if (!json_is_array(merges))
        return td_errf(err, errlen, "model.merges is not an array%s%s", "", "");
    json_t *dropout = json_object_get(m, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return td_errf(err, errlen,
                       "model: BPE dropout is not supported (it makes encoding "
                       "random)%s%s",
                       "", "");

    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id > INT32_MAX / 2)
            return td_errf(err, errlen, "model.vocab[\"%s\"] is not a token id%s", key, "");
        char where[96];
        snprintf(where, sizeof where, "model.vocab[\"%.64s\"]", key);
        if (id_too_big(id, bound, where, err, errlen)) return -1;
        size_t n = strlen(key);
        if (tok_map_set(&t->vocab, key, n, (int32_t)id, 0) || set_str(t, (int32_t)id, key, n))
            return td_errf(err, errlen, "out of memory loading the vocab%s%s", "", "");
    }

    const char *unk = jstr(m, "unk_token");
    t->unk_id = -1;
    if (unk) {
        const struct tok_map_slot *e = tok_map_get(&t->vocab, unk, strlen(unk));
        if (!e) return td_errf(err, errlen, "model.unk_token '%s' is not in the vocab%s", unk, "");
        t->unk_id = e->val;
    }
    t->fuse_unk = jbool(m, "fuse_unk", 0);
    t->byte_fallback = jbool(m, "byte_fallback", 0);
    t->ignore_merges = jbool(m, "ignore_merges", 0);
    const char *pre = jstr(m, "continuing_subword_prefix"), *suf = jstr(m, "end_of_word_suffix");
    if (pre && *pre && !(t->subword_prefix = strdup(pre))) return -1;
    if (suf && *suf && !(t->word_suffix = strdup(suf))) return -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        const struct tok_map_slot *e = tok_map_get(&t->vocab, name, 6);
        t->byte_fallback_id[b] = e ? e->val : -1;
    }

    // merges: rank = position; "a b" strings (lines starting "#version" skipped) or [a, b]
    size_t plen = t->subword_prefix ? strlen(t->subword_prefix) : 0;
    struct tok_buf cat = {0};
    size_t i, rank = 0;
    json_t *mg;
    json_array_foreach(merges, i, mg) {
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(mg)) {
            const char *s = json_string_value(mg);
            if (!strncmp(s, "#version", 8)) continue;
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                tok_buf_free(&cat);
                return td_errf(err, errlen,
                               "model.merges[%zu] '%s' is not two tokens separated by one "
                               "space",
                               i, s);
            }
            a = s;
            na = (size_t)(sp - s);
            b = sp + 1;
            nb = strlen(b);
        } else if (json_is_array(mg) && json_array_size(mg) == 2 &&
                   json_is_string(json_array_get(mg, 0)) && json_is_string(json_array_get(mg, 1))) {
            a = json_string_value(json_array_get(mg, 0));
            b = json_string_value(json_array_get(mg, 1));
            na = strlen(a);
            nb = strlen(b);
        } else {
            tok_buf_free(&cat);
            return td_errf(err, errlen, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]",
                           i);
        }
        const struct tok_map_slot *ea = tok_map_get(&t->vocab, a, na);
        const struct tok_map_slot *eb = tok_map_get(&t->vocab, b, nb);
        cat.n = 0;
        size_t skip = nb >= plen ? plen : 0; // the merged token drops b's subword prefix
        int oom = tok_buf_put(&cat, a, na) || tok_buf_put(&cat, b + skip, nb - skip);
        const struct tok_map_slot *ec = oom ? NULL : tok_map_get(&t->vocab, cat.p, cat.n);
        if (!ea || !eb || !ec) {
            td_errf(err, errlen, "model.merges[%zu]: '%.*s' is not in the vocab", i,
                    (int)(!ea   ? na
                          : !eb ? nb
                                : cat.n),
                    !ea   ? a
                    : !eb ? b
                          : cat.p);
            tok_buf_free(&cat);
            return -1;
        }
        if (tok_merges_set(&t->merges, ea->val, eb->val, (int32_t)rank, ec->val)) {
            tok_buf_free(&cat);
            return td_errf(err, errlen, "out of memory loading merges%s%s", "", "");
        }
        rank++;
    }
    tok_buf_free(&cat);
    return 0;
}

/* a "Sequence" component: each element of node[key] through add, named where.key[i] */
typedef int (*tok_adder)(struct tok *t, json_t *n, const char *where, char *err, size_t errlen);

static int add_sequence(struct tok *t, json_t *node, const char *key, const char *where,
                        tok_adder add, char *err, size_t errlen) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(node, key), i, c) {
        char w[256];
        snprintf(w, sizeof w, "%s.%s[%zu]", where, key, i);
        if (add(t, c, w, err, errlen)) return -1;
    }
    return 0;
}

/* a Replace component (normalizer or decoder): pattern.String or pattern.Regex, and content */
static int parse_replace(json_t *n, const char *where, struct tok_re *re, char **str,
                         size_t *str_len, char *err, size_t errlen) {
    json_t *pat = json_object_get(n, "pattern");
    const char *lit = jstr(pat, "String"), *rx = jstr(pat, "Regex"), *content = jstr(n, "content");
    if ((!lit && !rx) || !content)
        return td_errf(err, errlen, "%s: Replace needs pattern.String|Regex and content%s", where,
                       "");
    if (tok_re_compile(re, lit ? lit : rx, strlen(lit ? lit : rx), lit != NULL, err, errlen))
        return -1;
    *str = strdup(content);
    *str_len = strlen(content);
    return 0;
}

// ---------------------------------------------------------------- normalizers

static int add_norm(struct tok *t, json_t *n, const char *where, char *err, size_t errlen) {
    if (!n || json_is_null(n)) return 0;
    const char *type = jstr(n, "type");
    if (!type) return td_errf(err, errlen, "%s has no type%s", where, "");
    if (!strcmp(type, "Sequence"))
        return add_sequence(t, n, "normalizers", where, add_norm, err, errlen);
    struct tok_norm x = {0};
    if (!strcmp(type, "NFC"))
        x.kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD"))
        x.kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC"))
        x.kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD"))
        x.kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase"))
        x.kind = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "Strip")) {
        x.kind = TOK_NORM_STRIP;
        x.a = jbool(n, "strip_left", 1);
        x.b = jbool(n, "strip_right", 1);
    } else if (!strcmp(type, "Prepend") || !strcmp(type, "Append")) {
        x.kind = type[0] == 'P' ? TOK_NORM_PREPEND : TOK_NORM_APPEND;
        const char *s = jstr(n, type[0] == 'P' ? "prepend" : "append");
        if (!s) return td_errf(err, errlen, "%s: %s has no string", where, type);
        x.str = strdup(s);
        x.str_len = strlen(s);
    } else if (!strcmp(type, "Replace")) {
        x.kind = TOK_NORM_REPLACE;
        if (parse_replace(n, where, &x.re, &x.str, &x.str_len, err, errlen)) return -1;
    } else {
        return td_errf(err, errlen, "%s: normalizer %s is not supported", where, type);
    }
    struct tok_norm *v = realloc(t->norm, (t->n_norm + 1) * sizeof *v);
    if (!v) {
        free(x.str);
        tok_re_free(&x.re);
        return td_errf(err, errlen, "out of memory%s%s", "", "");
    }
    t->norm = v;
    t->norm[t->n_norm++] = x;
    return 0;
}

// ---------------------------------------------------------------- pre-tokenizers

static int parse_behavior(const char *s, enum tok_split_behavior *b) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (s && !strcmp(s, names[i])) {
            *b = (enum tok_split_behavior)i;
            return 0;
        }
    return -1;
}

static int add_pre(struct tok *t, json_t *p, const char *where, char *err, size_t errlen) {
    if (!p || json_is_null(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) return td_errf(err, errlen, "%s has no type%s", where, "");
    if (!strcmp(type, "Sequence"))
        return add_sequence(t, p, "pretokenizers", where, add_pre, err, errlen);
    if (t->n_pre == TOK_MAX_PRE)
        return td_errf(err, errlen, "%s: more than 16 pre-tokenizers%s", where, "");
    if (t->n_pre && t->pre[t->n_pre - 1].kind == TOK_PRE_BYTE_LEVEL)
        return td_errf(err, errlen,
                       "%s: %s after ByteLevel is not supported (ByteLevel must come "
                       "last)",
                       where, type);
    struct tok_pre x = {0};
    if (!strcmp(type, "Split")) {
        x.kind = TOK_PRE_SPLIT;
        json_t *pat = json_object_get(p, "pattern");
        const char *lit = jstr(pat, "String"), *rx = jstr(pat, "Regex");
        if (!lit && !rx)
            return td_errf(err, errlen, "%s: Split needs pattern.String or .Regex%s", where, "");
        if (parse_behavior(jstr(p, "behavior"), &x.behavior))
            return td_errf(err, errlen, "%s: Split behavior '%s' is unknown", where,
                           jstr(p, "behavior") ? jstr(p, "behavior") : "(none)");
        x.invert = jbool(p, "invert", 0);
        if (tok_re_compile(&x.re, lit ? lit : rx, strlen(lit ? lit : rx), lit != NULL, err, errlen))
            return -1;
    } else if (!strcmp(type, "Whitespace")) {
        // HF: split(Invert(\w+|[^\w\s]+), Removed)
        x.kind = TOK_PRE_SPLIT;
        x.behavior = TOK_SPLIT_REMOVED;
        x.invert = 1;
        const char *rx = "\\w+|[^\\w\\s]+";
        if (tok_re_compile(&x.re, rx, strlen(rx), 0, err, errlen)) return -1;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        x.kind = TOK_PRE_WS_SPLIT;
    } else if (!strcmp(type, "Digits")) {
        x.kind = TOK_PRE_DIGITS;
        x.a = jbool(p, "individual_digits", 0);
    } else if (!strcmp(type, "ByteLevel")) {
        x.kind = TOK_PRE_BYTE_LEVEL;
        x.a = jbool(p, "add_prefix_space", 1);
        x.b = jbool(p, "use_regex", 1);
        if (x.b && tok_re_compile(&x.re, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, err, errlen))
            return -1;
        t->byte_level = 1;
    } else {
        return td_errf(err, errlen, "%s: pre-tokenizer %s is not supported", where, type);
    }
    t->pre[t->n_pre++] = x;
    return 0;
}

// ---------------------------------------------------------------- post-processors

static int push_ids(int32_t **v, size_t *n, int32_t id) {
    int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p) return -1;
    *v = p;
    p[(*n)++] = id;
    return 0;
}

static int add_post(struct tok *t, json_t *p, const char *where, char *err, size_t errlen) {
    if (!p || json_is_null(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) return td_errf(err, errlen, "%s has no type%s", where, "");
    if (!strcmp(type, "ByteLevel")) return 0; // offsets only
    if (!strcmp(type, "Sequence"))
        return add_sequence(t, p, "processors", where, add_post, err, errlen);
    if (t->n_post_prefix || t->n_post_suffix)
        return td_errf(err, errlen, "%s: a second %s adding tokens is not supported", where, type);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(p, "cls"), *sep = json_object_get(p, "sep");
        json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
        if (!json_is_integer(ci) || !json_is_integer(si))
            return td_errf(err, errlen, "%s: %s needs cls and sep as [token, id]", where, type);
        int32_t c = 0, e = 0;
        if (post_id(ci, where, &c, err, errlen) || post_id(si, where, &e, err, errlen)) return -1;
        if (push_ids(&t->post_prefix, &t->n_post_prefix, c) ||
            push_ids(&t->post_suffix, &t->n_post_suffix, e))
            return td_errf(err, errlen, "out of memory%s%s", "", "");
        return 0;
    }
    if (strcmp(type, "TemplateProcessing"))
        return td_errf(err, errlen, "%s: post-processor %s is not supported", where, type);
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    size_t i;
    json_t *piece;
    int seen_a = 0;
    json_array_foreach(single, i, piece) {
        json_t *sp = json_object_get(piece, "SpecialToken"),
               *sq = json_object_get(piece, "Sequence");
        if (sq) {
            const char *id = jstr(sq, "id");
            if (seen_a || !id || strcmp(id, "A"))
                return td_errf(err, errlen, "%s: TemplateProcessing single must hold one $A%s",
                               where, "");
            seen_a = 1;
            continue;
        }
        const char *name = jstr(sp, "id");
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return td_errf(err, errlen, "%s: special token '%s' is not in special_tokens", where,
                           name ? name : "(none)");
        size_t k;
        json_t *idv;
        json_array_foreach(ids, k, idv) {
            int32_t id = 0;
            if (post_id(idv, where, &id, err, errlen)) return -1;
            int r = seen_a ? push_ids(&t->post_suffix, &t->n_post_suffix, id)
                           : push_ids(&t->post_prefix, &t->n_post_prefix, id);
            if (r) return td_errf(err, errlen, "out of memory%s%s", "", "");
        }
    }
    if (!seen_a)
        return td_errf(err, errlen, "%s: TemplateProcessing single has no $A%s", where, "");
    return 0;
}

// ---------------------------------------------------------------- decoders

static int add_dec(struct tok *t, json_t *d, const char *where, char *err, size_t errlen) {
    if (!d || json_is_null(d)) return 0;
    const char *type = jstr(d, "type");
    if (!type) return td_errf(err, errlen, "%s has no type%s", where, "");
    t->has_decoder = 1;
    if (!strcmp(type, "Sequence"))
        return add_sequence(t, d, "decoders", where, add_dec, err, errlen);
    struct tok_dec x = {0};
    if (!strcmp(type, "ByteLevel"))
        x.kind = TOK_DEC_BYTE_LEVEL;
    else if (!strcmp(type, "ByteFallback"))
        x.kind = TOK_DEC_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse"))
        x.kind = TOK_DEC_FUSE;
    else if (!strcmp(type, "Strip")) {
        x.kind = TOK_DEC_STRIP;
        const char *c = jstr(d, "content");
        if (!c || !*c)
            return td_errf(err, errlen, "%s: Strip needs a content character%s", where, "");
        tok_utf8_next((const unsigned char *)c, strlen(c), &x.cp);
        // HF's are usize; bounded here so that the int counts and their sums cannot overflow
        static const char *keys[2] = {"start", "stop"};
        int *dst[2] = {&x.a, &x.b};
        for (int k = 0; k < 2; k++) {
            json_t *v = json_object_get(d, keys[k]);
            json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;
            if (n < 0 || n > TOK_STRIP_MAX)
                return td_errf(err, errlen, "%s: Strip %s %lld is out of range (0..%d)", where,
                               keys[k], (long long)n, TOK_STRIP_MAX);
            *dst[k] = (int)n;
        }
    } else if (!strcmp(type, "Replace")) {
        x.kind = TOK_DEC_REPLACE;
        if (parse_replace(d, where, &x.re, &x.str, &x.str_len, err, errlen)) return -1;
    } else {
        return td_errf(err, errlen, "%s: decoder %s is not supported", where, type);
    }
    struct tok_dec *v = realloc(t->dec, (t->n_dec + 1) * sizeof *v);
    if (!v) {
        free(x.str);
        tok_re_free(&x.re);
        return td_errf(err, errlen, "out of memory%s%s", "", "");
    }
    t->dec = v;
    t->dec[t->n_dec++] = x;
    return 0;
}

// ---------------------------------------------------------------- added tokens

static int load_added(struct tok *t, json_t *list, size_t bound, char *err, size_t errlen) {
    if (json_is_null(list) || !list) return 0;
    if (!json_is_array(list))
        return td_errf(err, errlen, "added_tokens is not an array%s%s", "", "");
    t->added = calloc(json_array_size(list) + 1, sizeof *t->added);
    if (!t->added) return td_errf(err, errlen, "out of memory%s%s", "", "");
    size_t i;
    json_t *a;
    struct tok_buf nb = {0};
    json_array_foreach(list, i, a) {
        const char *content = jstr(a, "content");
        json_t *idv = json_object_get(a, "id");
        if (!content || !json_is_integer(idv) || json_integer_value(idv) < 0 ||
            json_integer_value(idv) > INT32_MAX / 2) {
            tok_buf_free(&nb);
            return td_errf(err, errlen, "added_tokens[%zu] needs content and a non-negative id", i);
        }
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (id_too_big(json_integer_value(idv), bound, where, err, errlen)) {
            tok_buf_free(&nb);
            return -1;
        }
        size_t n = strlen(content);
        if (!n) continue; // HF ignores empty added tokens
        struct tok_added *x = &t->added[t->n_added];
        const struct tok_map_slot *e = tok_map_get(&t->vocab, content, n);
        x->id = e ? e->val : (int32_t)json_integer_value(idv);
        x->content = xstrndup(content, n);
        x->len = n;
        x->special = jbool(a, "special", 0);
        x->lstrip = jbool(a, "lstrip", 0);
        x->rstrip = jbool(a, "rstrip", 0);
        x->single_word = jbool(a, "single_word", 0);
        x->normalized = jbool(a, "normalized", !x->special);
        if (!x->content) {
            tok_buf_free(&nb);
            return td_errf(err, errlen, "out of memory%s%s", "", "");
        }
        t->n_added++;
        // the pattern: normalized tokens match their normalized form, which is also what
        // decoding gives back (HF's normalized_cache)
        const char *pat = content;
        size_t pn = n;
        if (x->normalized && t->n_norm) {
            if (tok_normalize(t, content, n, &nb, err, errlen)) {
                tok_buf_free(&nb);
                return -1;
            }
            pat = nb.p;
            pn = nb.n;
        }
        x->pattern = xstrndup(pat, pn);
        x->pattern_len = pn;
        if (!x->pattern || set_str(t, x->id, pat, pn) ||
            tok_trie_add(x->normalized ? &t->trie_norm : &t->trie_raw, pat, pn,
                         (int32_t)(t->n_added - 1))) {
            tok_buf_free(&nb);
            return td_errf(err, errlen, "out of memory%s%s", "", "");
        }
        t->flag[x->id] |= TOK_FLAG_ADDED | (x->special ? TOK_FLAG_SPECIAL : 0);
    }
    tok_buf_free(&nb);
    return 0;
}

// ---------------------------------------------------------------- byte-level alphabet

static void init_byte_alphabet(struct tok *t) {
    // GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100..
    int n = 0;
    for (int i = 0; i < 0x144; i++)
        t->char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = printable ? (uint32_t)b : 0x100u + (uint32_t)n++;
        t->byte_utf8_n[b] = (unsigned char)tok_utf8_put(t->byte_utf8[b], cp);
        t->char_byte[cp] = (int16_t)b;
    }
}

static void init_byte_ids(struct tok *t) {
    for (int b = 0; b < 256; b++) {
        const char *s = t->byte_utf8[b];
        size_t n = t->byte_utf8_n[b];
        const struct tok_map_slot *e = NULL;
        if (!t->subword_prefix && !t->word_suffix) e = tok_map_get(&t->vocab, s, n);
        t->byte_id[b] = e ? e->val : -1;
    }
}

/* why a file's text is not a JSON object: jansson's reason with its line, or the JSON type of a
 * top level that parsed (jansson's error is empty then, "line -1: ") */
static int not_object(const char *file, json_t *v, const json_error_t *je, char *err,
                      size_t errlen) {
    if (!v) return td_errf(err, errlen, "%s: line %d: %s", file, je->line, je->text);
    const char *type = "a number";
    switch (json_typeof(v)) {
    case JSON_ARRAY: type = "an array"; break;
    case JSON_STRING: type = "a string"; break;
    case JSON_TRUE: type = "true"; break;
    case JSON_FALSE: type = "false"; break;
    case JSON_NULL: type = "null"; break;
    default: break;
    }
    return td_errf(err, errlen, "%s: the top level is %s, not an object", file, type);
}

// ---------------------------------------------------------------- tokenizer_config.json

static int32_t config_token(struct tok *t, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    const char *s = json_is_string(v) ? json_string_value(v) : jstr(v, "content");
    return s ? tok_id(t, s, strlen(s)) : -1;
}

static int load_config(struct tok *t, const char *config_json, char *err, size_t errlen) {
    t->bos_id = t->eos_id = t->pad_id = -1;
    if (!config_json) return 0;
    json_error_t je;
    json_t *cfg = json_loads(config_json, JSON_DECODE_ANY, &je);
    if (!json_is_object(cfg)) {
        not_object("tokenizer_config.json", cfg, &je, err, errlen);
        json_decref(cfg);
        return -1;
    }
    t->bos_id = config_token(t, cfg, "bos_token");
    t->eos_id = config_token(t, cfg, "eos_token");
    t->pad_id = config_token(t, cfg, "pad_token");
    const char *tpl = jstr(cfg, "chat_template");
    if (tpl && !(t->chat_template = strdup(tpl))) {
        json_decref(cfg);
        return td_errf(err, errlen, "out of memory%s%s", "", "");
    }
    json_decref(cfg);
    return 0;
}

// ---------------------------------------------------------------- entry points

int tok_load_mem(struct tok **out, const char *json, size_t len, const char *config_json, char *err,
                 size_t errlen) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL | JSON_DECODE_ANY, &je);
    if (!json_is_object(root)) {
        not_object("tokenizer.json", root, &je, err, errlen);
        json_decref(root);
        return -1;
    }
    struct tok *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return td_errf(err, errlen, "out of memory%s%s", "", "");
    }
    init_byte_alphabet(t);
    int rc = -1;
    json_t *trunc = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if (trunc && !json_is_null(trunc)) {
        td_errf(err, errlen, "truncation is not supported (set it to null)%s%s", "", "");
        goto done;
    }
    if (pad && !json_is_null(pad)) {
        td_errf(err, errlen, "padding is not supported (set it to null)%s%s", "", "");
        goto done;
    }
    size_t bound = id_bound(root);
    if (load_model(t, json_object_get(root, "model"), bound, err, errlen) ||
        add_norm(t, json_object_get(root, "normalizer"), "normalizer", err, errlen) ||
        add_pre(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", err, errlen) ||
        add_post(t, json_object_get(root, "post_processor"), "post_processor", err, errlen) ||
        add_dec(t, json_object_get(root, "decoder"), "decoder", err, errlen) ||
        load_added(t, json_object_get(root, "added_tokens"), bound, err, errlen) ||
        load_config(t, config_json, err, errlen))
        goto done;
    init_byte_ids(t);
    t->norm_ascii_same = 1;
    for (size_t i = 0; i < t->n_norm; i++)
        t->norm_ascii_same &= t->norm[i].kind <= TOK_NORM_NFKD;
    for (size_t i = 0; i < t->n_post_prefix + t->n_post_suffix; i++) {
        int32_t id =
            i < t->n_post_prefix ? t->post_prefix[i] : t->post_suffix[i - t->n_post_prefix];
        if (id < 0 || id >= t->n_vocab || t->str_len[id] == UINT32_MAX) {
            td_errf(err, errlen, "post_processor adds id %d, which no token has", id);
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(root);
    if (rc)
        tok_free(t);
    else
        *out = t;
    return rc;
}

#define TOK_JSON_MAX   (256u << 20) /* tokenizer.json; the largest real ones are tens of MB */
#define TOK_CONFIG_MAX (16u << 20)  /* tokenizer_config.json (a chat template or two) */

int tok_load(struct tok **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    char path[TD_PATH_MAX], msg[512];
    size_t n = 0, cn = 0;
    struct stat st;
    if (td_path_join(path, sizeof path, dir, "tokenizer.json", err, errlen)) return -1;
    char *json = td_file_read(path, TOK_JSON_MAX, &n, err, errlen), *cfg = NULL;
    if (!json) return -1;
    // an absent tokenizer_config.json is fine, one that is there and cannot be read is not
    if (td_path_join(path, sizeof path, dir, "tokenizer_config.json", err, errlen) ||
        ((lstat(path, &st) == 0 || errno != ENOENT) &&
         !(cfg = td_file_read(path, TOK_CONFIG_MAX, &cn, err, errlen)))) {
        free(json);
        return -1;
    }
    int rc = tok_load_mem(out, json, n, cfg, msg, sizeof msg);
    if (rc &&
        (!strncmp(msg, "tokenizer.json: ", 16) || !strncmp(msg, "tokenizer_config.json: ", 23)))
        td_errf(err, errlen, "%s/%s", dir, msg); // the message names its file: add the directory
    else if (rc)
        td_errf(err, errlen, "%s/tokenizer.json: %s", dir, msg);
    free(json);
    free(cfg);
    return rc;
}

void tok_free(struct tok *t) {
    if (!t) return;
    free(t->str_off);
    free(t->str_len);
    free(t->flag);
    tok_buf_free(&t->strs);
    tok_map_free(&t->vocab);
    tok_merges_free(&t->merges);
    free(t->subword_prefix);
    free(t->word_suffix);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].pattern);
    }
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    for (size_t i = 0; i < t->n_norm; i++) {
        free(t->norm[i].str);
        tok_re_free(&t->norm[i].re);
    }
    free(t->norm);
    for (size_t i = 0; i < t->n_pre; i++)
        tok_re_free(&t->pre[i].re);
    free(t->post_prefix);
    free(t->post_suffix);
    for (size_t i = 0; i < t->n_dec; i++) {
        free(t->dec[i].str);
        tok_re_free(&t->dec[i].re);
    }
    free(t->dec);
    free(t->chat_template);
    tok_map_free(&t->cache);
    tok_buf_free(&t->cache_ids);
    for (int i = 0; i < TOK_MAX_PRE; i++) {
        free(t->spans[i].v);
        tok_buf_free(&t->scratch[i]);
    }
    free(t->span_tmp.v);
    free(t->span_add[0].v);
    free(t->span_add[1].v);
    tok_buf_free(&t->word);
    tok_buf_free(&t->nbuf);
    tok_buf_free(&t->ntmp);
    free(t->sym);
    free(t->heap);
    free(t);
}

// ---------------------------------------------------------------- accessors

int32_t tok_n_vocab(const struct tok *t) {
    return t->n_vocab;
}

int32_t tok_id(const struct tok *t, const char *s, size_t n) {
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, s, n)) return t->added[i].id;
    const struct tok_map_slot *e = tok_map_get(&t->vocab, s, n);
    return e ? e->val : -1;
}

const char *tok_str(const struct tok *t, int32_t id, size_t *n) {
    if (id < 0 || id >= t->n_vocab || t->str_len[id] == UINT32_MAX) return NULL;
    if (n) *n = t->str_len[id];
    return t->strs.p + t->str_off[id];
}

int tok_is_special(const struct tok *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flag[id] & TOK_FLAG_SPECIAL);
}

int32_t tok_bos(const struct tok *t) {
    return t->bos_id;
}
int32_t tok_eos(const struct tok *t) {
    return t->eos_id;
}
const char *tok_chat_template(const struct tok *t) {
    return t->chat_template;
}
