/* test_model.c: the weight mapping table and its refusals, on rewritten copies of the fixtures.
 *
 *   make build/tests/test_model && build/tests/test_model
 *
 * Each case copies a fixture's config.json and writes its tensors, altered, into a fresh
 * model.safetensors under a temporary directory, then expects td_model_load to succeed or to
 * fail with a message naming the tensor.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kernels/quant.h"
#include "model/backend.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/state.h"
#include "st_write.h"

static char root[64];

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    if (!a || !b) return -1;
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, a)) > 0)
        fwrite(buf, 1, k, b);
    fclose(a);
    fclose(b);
    return 0;
}

static int find(struct st_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return i;
    return -1;
}

/* write the case directory (fixture config + tensors) and try to load it */
static int load_case(const char *fixture, const struct st_tensor *t, int n, struct td_model *m,
                     char *err, size_t errlen) {
    char dir[128], from[256], path[256];
    static int k;
    snprintf(dir, sizeof dir, "%s/case%d", root, k++);
    mkdir(dir, 0700);
    snprintf(from, sizeof from, "tests/fixtures/%s/config.json", fixture);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(from, path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(path, t, n, 0);
    return td_model_load(m, dir, err, errlen);
}

static void expect_error(const char *name, const char *fixture, const struct st_tensor *t, int n,
                         const char *w1, const char *w2) {
    char err[1024] = "";
    struct td_model m;
    case_begin();
    int rc = load_case(fixture, t, n, &m, err, sizeof err);
    CHECK(rc == -1, "loaded, expected an error mentioning '%s'", w1);
    CHECK(strstr(err, w1) && (!w2 || strstr(err, w2)), "message '%s' lacks '%s'/'%s'", err, w1,
          w2 ? w2 : "");
    if (!rc) td_model_free(&m);
    if (getenv("TD_TEST_VERBOSE")) printf("  %s\n", err);
    case_end(name, "");
}

/* the tensors of a layer before its expert views, as an array (every member up to w1 is a
 * td_tensor or a struct of them) */
#define LAYER_TENSORS (offsetof(struct td_layer, w1) / sizeof(struct td_tensor))

static int same_shape(const struct td_tensor *a, const struct td_tensor *b) {
    if (!a->data != !b->data || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* --dummy-weights: every tensor the stored model has, with its shape, made on the backend */
static void test_dummy(void) {
    const char *fx[] = {"tests/fixtures/a_tiny_yarn", "tests/fixtures/b_plain_hc2",
                        "tests/fixtures/c_upstream_sharded"};
    char err[1024], name[96];
    const struct td_backend *cpu = td_backend_cpu();
    for (int f = 0; f < 3; f++) {
        struct td_model real = {0}, d = {0}, p1 = {0}, p2 = {0}, p3 = {0}, d2 = {0};
        case_begin();
        CHECK(!td_model_load(&real, fx[f], err, sizeof err), "%s", err);
        CHECK(!td_model_load_dummy(&d, fx[f], 7, err, sizeof err), "%s", err);
        if (check_case_failed) {
            case_end(fx[f], "");
            continue;
        }
        const struct td_config *c = &real.cfg;
        int bad = !same_shape(&real.embed, &d.embed) || !same_shape(&real.head, &d.head) ||
                  !same_shape(&real.norm, &d.norm) || !same_shape(&real.hc_head.fn, &d.hc_head.fn);
        for (int i = 0; i < c->n_layers; i++) {
            const struct td_tensor *a = (const struct td_tensor *)&real.layers[i],
                                   *b = (const struct td_tensor *)&d.layers[i];
            for (size_t j = 0; j < LAYER_TENSORS; j++)
                CHECK(same_shape(&a[j], &b[j]), "layer %d tensor %zu: presence or shape differs", i,
                      j);
            for (int e = 0; e < c->n_experts; e++)
                bad |= !same_shape(&real.layers[i].w1[e], &d.layers[i].w1[e]) ||
                       !same_shape(&real.layers[i].w2[e], &d.layers[i].w2[e]);
        }
        CHECK(!bad, "embedding, head, norm, hc_head or expert shapes differ");
        CHECK(d.st.n_entries == 0, "a dummy model read safetensors");
        // placed on the CPU: values made there; the same seed gives the same bits
        CHECK(!td_model_upload(&d, cpu, &p1, err, sizeof err), "%s", err);
        CHECK(!td_model_load_dummy(&d2, fx[f], 7, err, sizeof err) &&
                  !td_model_upload(&d2, cpu, &p2, err, sizeof err),
              "%s", err);
        td_model_free(&d2);
        CHECK(!td_model_load_dummy(&d2, fx[f], 8, err, sizeof err) &&
                  !td_model_upload(&d2, cpu, &p3, err, sizeof err),
              "%s", err);
        if (!check_case_failed) {
            const struct td_tensor *w = &p1.layers[0].wq_a, *w2 = &p2.layers[0].wq_a;
            size_t bytes = (size_t)td_tensor_numel(w) * td_dtype_size(w->dtype);
            CHECK(w->dtype == TD_DTYPE_BF16 && !memcmp(w->data, w2->data, bytes),
                  "same seed, different wq_a");
            CHECK(memcmp(w->data, p3.layers[0].wq_a.data, bytes), "another seed, same wq_a");
            double a = sqrt(3.0 / (double)w->shape[1]), sum = 0, sq = 0, mx = 0;
            int64_t n = td_tensor_numel(w);
            for (int64_t k = 0; k < n; k++) {
                double v = td_tensor_getf(w, k);
                sum += v, sq += v * v, mx = fabs(v) > mx ? fabs(v) : mx;
            }
            CHECK(mx <= a * 1.004 && fabs(sum / n) < 0.1 * a &&
                      fabs(sqrt(sq / n) - a / sqrt(3.0)) < 0.1 * a,
                  "wq_a: max %g mean %g rms %g, want within %g, std %g", mx, sum / n, sqrt(sq / n),
                  a, a / sqrt(3.0));
            for (int64_t k = 0; k < td_tensor_numel(&p1.norm); k++)
                CHECK(td_tensor_getf(&p1.norm, k) == 1.0f, "norm[%lld] is not 1", (long long)k);
            for (int k = 0; k < c->n_heads; k++)
                CHECK(td_tensor_getf(&p1.layers[0].sinks, k) == 0.0f, "a sink is not 0");
            for (int i = 0; i < c->n_layers; i++) { // hash routing: k distinct experts per token
                const struct td_tensor *h = &p1.layers[i].tid2eid;
                if (!h->data) continue;
                for (int64_t v = 0; v < h->shape[0]; v++)
                    for (int j = 1; j < h->shape[1]; j++)
                        CHECK(td_tensor_geti(h, v * h->shape[1] + j) !=
                                  td_tensor_geti(h, v * h->shape[1]),
                              "layer %d token %lld: repeated expert", i, (long long)v);
            }
            td_model_free(&p1);
            td_model_free(&p2);
            td_model_free(&p3);
        }
        td_model_free(&d2);
        td_model_free(&d);
        td_model_free(&real);
        snprintf(name, sizeof name, "dummy_weights/%s", fx[f] + strlen("tests/fixtures/"));
        case_end(name, "");
    }
}

/* dims from config.json whose product passes 64 bits (wq_b: 1024 heads x 2^30 head_dim rows of
 * 2^30 columns) are refused as too large, never wrapped into a small tensor */
static void test_dummy_too_large(void) {
    char dir[128], path[256], err[512] = "";
    struct td_model m = {0};
    case_begin();
    snprintf(dir, sizeof dir, "%s/dummy_huge", root);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = json_load_file("tests/fixtures/b_plain_hc2/config.json", 0, NULL);
    json_t *p = json_loads("{\"num_attention_heads\": 1024, \"head_dim\": 1073741824,"
                           " \"q_lora_rank\": 1073741824, \"partial_rotary_factor\": 0}",
                           0, NULL);
    CHECK(cfg && p && !mkdir(dir, 0700), "cannot write the config");
    if (!check_case_failed) {
        json_object_update(cfg, p);
        CHECK(!json_dump_file(cfg, path, 0), "cannot write %s", path);
    }
    json_decref(cfg);
    json_decref(p);
    if (!check_case_failed) {
        // config.json's widths are bounded now (65536), which refuses these dims first
        int rc = td_model_load_dummy(&m, dir, 3, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "head_dim") && !strchr(err, '\n'), "rc %d: '%s'", rc, err);
        if (!rc) td_model_free(&m);
    }
    // and a shape past 64 bits saturates (the dummy loader refuses it as too large)
    struct td_tensor t = {.ndim = 3, .shape = {1 << 30, 1 << 30, 1 << 30}};
    CHECK(td_tensor_numel(&t) > TD_MAX_NUMEL, "numel %lld", (long long)td_tensor_numel(&t));
    t.shape[2] = 3;
    CHECK(td_tensor_numel(&t) == 3LL << 60, "numel %lld", (long long)td_tensor_numel(&t));
    case_end("dummy_weights/too_large", "");
}

/* the Flash-shaped slice the GPU benchmark runs (bench/flash_slice): its config reads, its
 * layer kinds are HCA, CSA, HCA, CSA, and it has the parameters of V4-Flash's shapes */
static void test_flash_slice(void) {
    char err[512], extra[128] = "";
    struct td_model m = {0};
    case_begin();
    CHECK(!td_model_load_dummy(&m, "bench/flash_slice", 1, err, sizeof err), "%s", err);
    if (!check_case_failed) {
        const struct td_config *c = &m.cfg;
        CHECK(c->n_layers == 4 && c->attn[0] == TD_ATTN_HCA && c->attn[1] == TD_ATTN_CSA &&
                  c->attn[2] == TD_ATTN_HCA && c->attn[3] == TD_ATTN_CSA,
              "layer kinds");
        int64_t n = td_tensor_numel(&m.embed) + td_tensor_numel(&m.head);
        for (int i = 0; i < c->n_layers; i++) {
            const struct td_tensor *t = (const struct td_tensor *)&m.layers[i];
            for (size_t j = 0; j < LAYER_TENSORS; j++)
                n += t[j].data ? td_tensor_numel(&t[j]) : 0;
            for (int e = 0; e < c->n_experts; e++)
                n += td_tensor_numel(&m.layers[i].w1[e]) + td_tensor_numel(&m.layers[i].w3[e]) +
                     td_tensor_numel(&m.layers[i].w2[e]);
        }
        // 256 experts x 3 x 2048 x 4096 per layer: 25.8 G of the total
        CHECK(n > 26000000000LL && n < 28000000000LL, "%lld parameters", (long long)n);
        snprintf(extra, sizeof extra, "(%.2f G parameters)", n / 1e9);
    }
    td_model_free(&m);
    case_end("dummy_weights/flash_slice_config", extra);
}

/* the V4-Flash-depth benchmark (bench/flash_depth): 43 layers in V4-Flash's mix, the released
 * precision, its MTP layer and a 3-stage DSpark head in dspark/ made as dummies too (a dummy
 * target's drafters have no files: dspark_num_stages says how many stages); a head without that
 * key is refused by name */
static void test_flash_depth(void) {
    char err[512], extra[160] = "";
    struct td_model m = {0}, mtp = {0}, ds = {0};
    case_begin();
    CHECK(!td_model_load_dummy(&m, "bench/flash_depth", 1, err, sizeof err), "%s", err);
    if (!check_case_failed) {
        const struct td_config *c = &m.cfg;
        int csa = 0, hca = 0;
        for (int i = 0; i < c->n_layers; i++)
            csa += c->attn[i] == TD_ATTN_CSA, hca += c->attn[i] == TD_ATTN_HCA;
        CHECK(c->n_layers == 43 && csa == 21 && hca == 20 && c->dim == 4096 && c->n_heads == 64 &&
                  c->head_dim == 512 && c->n_experts_tok == 6,
              "%d layers (%d CSA, %d HCA), dim %d, %d x %d heads", c->n_layers, csa, hca, c->dim,
              c->n_heads, c->head_dim);
        CHECK(td_model_own_drafter(&m) == TD_OWN_MTP, "own drafter %d",
              (int)td_model_own_drafter(&m));
        CHECK(!td_model_load_mtp(&m, &mtp, err, sizeof err), "mtp: %s", err);
        CHECK(!check_case_failed && mtp.cfg.n_layers == 1 && mtp.layers[0].w1[0].ndim == 2,
              "the MTP layer");
        CHECK(
            !td_model_load_dspark(&m, "bench/flash_depth/dspark", 3, 3, 256, &ds, err, sizeof err),
            "dspark: %s", err);
        CHECK(!check_case_failed && ds.cfg.n_layers == 3 && ds.dspark.markov_w2.shape[0] == 129280,
              "the DSpark head");
        snprintf(extra, sizeof extra, "(%d routed experts a layer)", c->n_experts);
    }
    td_model_free(&ds);
    if (!check_case_failed) { // the stage count has nowhere else to come from
        int rc =
            td_model_load_dspark(&m, "bench/flash_depth/dspark", 0, 3, 256, &ds, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "dspark_num_stages"), "rc %d: %s", rc, err);
        if (!rc) td_model_free(&ds);
    }
    td_model_free(&mtp);
    td_model_free(&m);
    case_end("dummy_weights/flash_depth_drafters", extra);
}

/* a directory under root whose path is exactly len bytes long, made of components of at most
 * 200 bytes; out holds it */
static int deep_dir(char *out, size_t cap, size_t len) {
    size_t n = (size_t)snprintf(out, cap, "%s/deep", root);
    mkdir(out, 0700);
    while (n < len && n + 2 < cap) {
        size_t r = len - n - 1, k = r <= 200 ? r : r - 200 >= 2 ? 200 : 198; // "/" + k bytes
        out[n++] = '/';
        memset(out + n, 'd', k);
        n += k;
        out[n] = 0;
        if (mkdir(out, 0700) && errno != EEXIST) return -1;
    }
    return n == len ? 0 : -1;
}

/* the end of a long message (they start with the long path) */
static const char *tail(const char *s) {
    size_t n = strlen(s);
    return n > 160 ? s + n - 160 : s;
}

/* A model directory path past the old 1024-byte buffers loads (the path is joined whole), and
 * one past the kernel's PATH_MAX is refused as too long; neither reads another file. The
 * decoy is what a 1024-byte buffer made of DIR/config.json: DIR/config. */
static void test_long_path(void) {
    char dir[8192], path[8400], err[1024] = "";
    struct td_model m = {0};
    case_begin();
    size_t len = 1015; // DIR/config.json is 1027 bytes: the old buffer kept 1023 of them
    CHECK(!deep_dir(dir, sizeof dir, len), "cannot make a %zu-byte directory path", len);
    CHECK(!link_fixture("tests/fixtures/b_plain_hc2", "config.json", dir) &&
              !link_fixture("tests/fixtures/b_plain_hc2", "model.safetensors", dir),
          "cannot link the fixture");
    snprintf(path, sizeof path, "%s/config.", dir);
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs("{\"model_type\": \"decoy\"}", fp);
        fclose(fp);
    }
    if (!check_case_failed) {
        int rc = td_model_load(&m, dir, err, sizeof err);
        CHECK(rc == 0 || strstr(err, "too long"), "a %zu-byte model path: ...%s", len, tail(err));
        CHECK(!strstr(err, "decoy"), "read the truncated name: ...%s", tail(err));
        if (!rc) {
            CHECK(m.cfg.vocab == 300 && m.cfg.n_layers == 3, "another config was read");
            td_model_free(&m);
        }
    }
    // the engine's joins too: DIR/dspark/config.json is 1024 bytes, which the old buffer cut
    // to the decoy DIR/dspark/config.jso
    len = 1005;
    CHECK(!deep_dir(dir, sizeof dir, len), "cannot make a %zu-byte directory path", len);
    char ds[8300];
    snprintf(ds, sizeof ds, "%s/dspark", dir);
    mkdir(ds, 0700);
    CHECK(!link_fixture("tests/fixtures/b_plain_hc2", "config.json", dir) &&
              !link_fixture("tests/fixtures/b_plain_hc2", "model.safetensors", dir) &&
              !link_fixture("tests/fixtures/dspark_b/dspark", "config.json", ds) &&
              !link_fixture("tests/fixtures/dspark_b/dspark", "model.safetensors", ds),
          "cannot link the fixtures");
    snprintf(path, sizeof path, "%s/config.jso", ds);
    if ((fp = fopen(path, "w"))) {
        fputs("{\"decoy\": 1}", fp);
        fclose(fp);
    }
    if (!check_case_failed) {
        struct td_engine_params ep = td_engine_defaults();
        ep.model_dir = dir;
        ep.backend = "cpu";
        ep.draft = "dspark";
        ep.max_seqs = 1;
        ep.max_ctx = 64;
        ep.max_batch_tokens = 16;
        ep.max_cache_bytes = (size_t)1 << 28;
        struct td_engine *e = NULL;
        err[0] = 0;
        int rc = td_engine_init(&e, &ep, err, sizeof err);
        CHECK(rc == 0 || strstr(err, "too long"), "a %zu-byte model path: ...%s", len, tail(err));
        if (!rc) td_engine_free(e);
    }
    // past PATH_MAX nothing can be opened: refused with the reason, not truncated
    memset(dir, 'd', 5000);
    memcpy(dir, "/tmp/", 5);
    dir[5000] = 0;
    err[0] = 0;
    CHECK(td_model_load(&m, dir, err, sizeof err) == -1 && strstr(err, "too long") &&
              !strchr(err, '\n'),
          "a 5000-byte model path: '%s'", err);
    case_end("long_model_path", "");
}

/* every logits row says token h->token */
struct force {
    int token;
};
static void force_token(void *ctx, int request, long position, float *row, int vocab) {
    (void)request, (void)position;
    for (int v = 0; v < vocab; v++)
        row[v] = v == ((struct force *)ctx)->token ? 10.0f : -10.0f;
}

/* b_plain_hc2 (linked) with generation_config.json = text (NULL: none) through td_engine_init;
 * with a forced first token, the request's finish and its generated count */
static int engine_with_gen(const char *text, int token, enum td_finish *why, int *n_gen, char *err,
                           size_t errlen) {
    static int k;
    char dir[128], path[256];
    snprintf(dir, sizeof dir, "%s/gen%d", root, k++);
    mkdir(dir, 0700);
    if (link_fixture("tests/fixtures/b_plain_hc2", "config.json", dir) ||
        link_fixture("tests/fixtures/b_plain_hc2", "model.safetensors", dir))
        return snprintf(err, errlen, "cannot link the fixture"), -2;
    if (text) {
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        FILE *fp = fopen(path, "w");
        fputs(text, fp);
        fclose(fp);
    }
    struct force f = {.token = token};
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = dir;
    ep.backend = "cpu";
    ep.max_seqs = 1;
    ep.max_ctx = 64;
    ep.max_batch_tokens = 16;
    ep.max_cache_bytes = (size_t)1 << 28;
    ep.logits_hook = force_token;
    ep.hook_ctx = &f;
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, errlen)) return -1;
    int32_t prompt[3] = {5, 6, 7};
    struct td_request_params rp = {
        .prompt = prompt,
        .n_prompt = 3,
        .max_tokens = 4,
        .sampling = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1},
        .ignore_eos = 0};
    int id = td_engine_submit(e, &rp, err, errlen), rc = 0;
    while (id >= 0 && (rc = td_engine_step(e, err, errlen)) > 0) {
    }
    const int32_t *toks;
    int nt = 0;
    enum td_req_status st;
    if (id >= 0) td_engine_output(e, id, &toks, &nt, &st, why, NULL);
    *n_gen = nt; // the generated tokens
    td_engine_free(e);
    return id < 0 || rc < 0 ? -2 : 0;
}

/* generation_config.json's EOS ids stop generation; ids outside the vocabulary and malformed
 * files are refused in one line naming the file; a missing file is no error */
static void test_generation_config(void) {
    char err[512] = "";
    enum td_finish why = TD_FINISH_NONE;
    int n = 0;
    case_begin();
    CHECK(!engine_with_gen("{\"eos_token_id\": [1, 7]}", 7, &why, &n, err, sizeof err) &&
              why == TD_FINISH_EOS && n == 1,
          "EOS 7 from generation_config.json: rc/why %d, %d tokens (%s)", why, n, err);
    CHECK(!engine_with_gen(NULL, 7, &why, &n, err, sizeof err) && why == TD_FINISH_LENGTH && n == 4,
          "no generation_config.json: why %d, %d tokens (%s)", why, n, err);
    const struct {
        const char *text, *want;
    } bad[] = {
        {.text = "{\"eos_token_id\": 4294967586}",
         .want = "4294967586"},                                  // 2^32 + 290 (was EOS 290)
        {.text = "{\"eos_token_id\": [1, 300]}", .want = "300"}, // vocab 300
        {.text = "{\"eos_token_id\": -1}", .want = "-1"},
        {.text = "{\"eos_token_id\": [1, \"2\"]}", .want = "eos_token_id[1]"},
        {.text = "{\"eos_token_id\": 1.5}", .want = "eos_token_id"},
        {.text = "{\"eos_token_id\": [1, 2", .want = "malformed"},
        {.text = "[1, 2]", .want = "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        int rc = engine_with_gen(bad[i].text, 7, &why, &n, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "generation_config.json") && strstr(err, bad[i].want) &&
                  !strchr(err, '\n'),
              "'%s': rc %d, message '%s' (want '%s')", bad[i].text, rc, err, bad[i].want);
    }
    case_end("generation_config_eos", "");
}

/* generation_config.json or dspark/config.json a FIFO (opening it for reading would wait for a
 * writer forever): td_engine_init refuses at once, naming the file */
static void test_fifo_configs(void) {
    const char *names[] = {"generation_config.json", "dspark/config.json"};
    for (int i = 0; i < 2; i++) {
        char dir[128], path[256], err[512] = "", name[64];
        snprintf(name, sizeof name, "fifo_%s", i ? "dspark_config" : "generation_config");
        case_begin();
        snprintf(dir, sizeof dir, "%s/fifo%d", root, i);
        snprintf(path, sizeof path, "%s/dspark", dir);
        CHECK(!mkdir(dir, 0700) && !mkdir(path, 0700), "mkdir");
        CHECK(!link_fixture("tests/fixtures/b_plain_hc2", "config.json", dir) &&
                  !link_fixture("tests/fixtures/b_plain_hc2", "model.safetensors", dir) &&
                  !link_fixture("tests/fixtures/dspark_b/dspark", "model.safetensors", path),
              "cannot link the fixtures");
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        CHECK(!mkfifo(path, 0600), "mkfifo %s", path);
        if (!check_case_failed) {
            struct td_engine_params ep = td_engine_defaults();
            ep.model_dir = dir;
            ep.backend = "cpu";
            ep.draft = i ? "dspark" : "none";
            ep.max_seqs = 1;
            ep.max_ctx = 64;
            ep.max_batch_tokens = 16;
            ep.max_cache_bytes = (size_t)1 << 28;
            struct td_engine *e = NULL;
            case_deadline(name, 10);
            int rc = td_engine_init(&e, &ep, err, sizeof err);
            case_deadline(NULL, 0);
            CHECK(rc == -1 && strstr(err, names[i]) && strstr(err, "not a regular file"),
                  "rc %d: '%s'", rc, err);
            if (!rc) td_engine_free(e);
        }
        case_end(name, "");
    }
}

/* every tensor of t[n] whose name holds "sink" restored as BF16 (its fp32 values cut to bf16),
 * into bufs[] (freed by the caller); how many */
static int sinks_to_bf16(struct st_tensor *t, int n, uint16_t **bufs) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!strstr(t[i].name, "sink")) continue;
        int64_t h = t[i].shape[0];
        uint16_t *b = bufs[k++] = malloc((size_t)h * 2);
        for (int64_t j = 0; j < h; j++) {
            float x = td_load_f32(t[i].data, t[i].dtype, j);
            uint32_t u;
            memcpy(&u, &x, 4);
            b[j] = (uint16_t)(u >> 16);
        }
        t[i].dtype = TD_DTYPE_BF16, t[i].data = b, t[i].nbytes = (size_t)h * 2;
    }
    return k;
}

/* l's sinks are aligned fp32 (what the CPU attention reads) equal to the stored bf16 values */
static int sinks_ok(const struct td_layer *l, const struct td_tensor *stored) {
    if (l->sinks.dtype != TD_DTYPE_F32 || (uintptr_t)l->sinks.data % 4) return 0;
    for (int64_t j = 0; j < stored->shape[0]; j++)
        if (((const float *)l->sinks.data)[j] != td_tensor_getf(stored, j)) return 0;
    return 1;
}

/* sinks stored BF16 reach the CPU attention as fp32, in the target, its MTP layer and a DSpark
 * drafter's stages (all bound by bind_layer) */
static void test_sinks_bf16(const struct st_set *hb) {
    char err[1024] = "", name[64], dir[128], path[256];
    struct td_model m = {0}, mtp = {0}, ds = {0}, tgt = {0};
    struct st_set ms, dsf;
    uint16_t *bufs[16];
    int nb = 0;
    case_begin();
    struct st_tensor *t = calloc(512, sizeof *t);
    int n = st_list(hb, t);
    nb += sinks_to_bf16(t, n, bufs + nb);
    int loaded = !load_case("b_plain_hc2", t, n, &m, err, sizeof err);
    CHECK(loaded, "target: %s", err);
    for (int i = 0; loaded && i < m.cfg.n_layers; i++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.sinks", i);
        CHECK(sinks_ok(&m.layers[i], td_model_tensor(&m, name)), "target layer %d", i);
    }
    if (loaded) td_model_free(&m);
    // the MTP layer, from a copy of its fixture with mtp.0.attn.attn_sink in BF16
    CHECK(!st_set_open(&ms, "tests/fixtures/mtp_b_plain_hc2", err, sizeof err), "%s", err);
    if (!check_case_failed) {
        n = st_list(&ms, t);
        nb += sinks_to_bf16(t, n, bufs + nb);
        loaded = !load_case("mtp_b_plain_hc2", t, n, &m, err, sizeof err);
        int has_mtp = loaded && !td_model_load_mtp(&m, &mtp, err, sizeof err);
        CHECK(has_mtp, "mtp: %s", err);
        if (has_mtp)
            CHECK(sinks_ok(&mtp.layers[0], td_model_tensor(&m, "mtp.0.attn.attn_sink")),
                  "the MTP layer's sinks");
        if (has_mtp) td_model_free(&mtp);
        if (loaded) td_model_free(&m);
        st_set_close(&ms);
    }
    // a DSpark drafter's two stages
    CHECK(!td_model_load(&tgt, "tests/fixtures/b_plain_hc2", err, sizeof err) &&
              !st_set_open(&dsf, "tests/fixtures/dspark_b/dspark", err, sizeof err),
          "%s", err);
    if (!check_case_failed) {
        n = st_list(&dsf, t);
        nb += sinks_to_bf16(t, n, bufs + nb);
        snprintf(dir, sizeof dir, "%s/dspark_bf16_sinks", root);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(!mkdir(dir, 0700) && !st_write(path, t, n, 0), "cannot write %s", path, 0);
        CHECK(!td_model_load_dspark(&tgt, dir, 2, 2, 8, &ds, err, sizeof err), "dspark: %s", err);
        for (int i = 0; !check_case_failed && i < 2; i++) {
            snprintf(name, sizeof name, "mtp.%d.attn.attn_sink", i);
            CHECK(sinks_ok(&ds.layers[i], td_model_tensor(&ds, name)), "DSpark stage %d", i);
        }
        if (ds.layers) td_model_free(&ds);
        st_set_close(&dsf);
    }
    td_model_free(&tgt);
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    free(t);
    case_end("sinks_bf16_bound_as_fp32", "");
}

/* the logits of ids[0..n) through model dir on the CPU, one call; 0 or -1 with err */
static int logits_of(const char *dir, const int32_t *ids, int n, float *out, char *err,
                     size_t errlen) {
    struct td_model m, placed = {0};
    struct td_state st;
    const struct td_backend *b = td_backend_cpu();
    if (td_model_load(&m, dir, err, errlen)) return -1;
    const struct td_model *run = &m; // FP8 / FP4 weights run from their F32 decode
    int rc = td_model_needs_placing(&m, b) ? td_model_upload(&m, b, &placed, err, errlen) : 0;
    if (!rc && td_model_needs_placing(&m, b)) run = &placed;
    if (!rc) rc = td_state_init(&st, &m.cfg, 1, n, n, (size_t)1 << 30, b, err, errlen);
    if (!rc) {
        struct td_plan_seq q = {.slot = td_state_seq_alloc(&st), .n_new = n, .ids = ids};
        rc = td_forward_seqs(run, &st, &q, 1, out, NULL, err, errlen);
        td_state_free(&st);
    }
    td_model_free(&placed);
    td_model_free(&m);
    return rc;
}

/* --dummy-weights of a released-precision config: the matrices the release quantizes are made
 * as packed Q8 / Q4 (fill_quant) and, placed on the CPU, run as their exact decode with about
 * the 1/sqrt(fan-in) scale of the other matrices; the model runs and its logits are finite */
static void test_dummy_released(void) {
    char err[512] = "";
    struct td_model m, cpu;
    case_begin();
    CHECK(!td_model_load_dummy(&m, "tests/fixtures/c_released", 7, err, sizeof err), "%s", err);
    CHECK(!check_case_failed && !td_model_upload(&m, td_backend_cpu(), &cpu, err, sizeof err), "%s",
          err);
    if (check_case_failed) {
        case_end("dummy/released_precision", err);
        return;
    }
    const struct td_layer *l = &cpu.layers[cpu.cfg.n_layers - 1];
    const struct td_tensor *ts[3] = {&l->wq_b, &l->w1[0], &l->gate};
    const char *what[3] = {"wq_b (FP8)", "expert 0 w1 (FP4)", "router (bf16)"};
    char extra[160] = "";
    for (int j = 0; j < 3; j++) {
        int64_t n = td_tensor_numel(ts[j]), in = ts[j]->shape[1];
        double sq = 0;
        for (int64_t i = 0; i < n; i++) {
            float v = td_tensor_getf(ts[j], i);
            sq += (double)v * v;
        }
        double rms = sqrt(sq / n) * sqrt((double)in); // 1 for std 1/sqrt(fan-in)
        CHECK(rms > 0.5 && rms < 2.0, "%s: rms %.3g / sqrt(fan-in)", what[j], rms);
        size_t k = strlen(extra);
        snprintf(extra + k, sizeof extra - k, "%s%s %.2f",
                 j ? ", " : "(rms x sqrt(fan-in): ", what[j], rms);
    }
    strncat(extra, ")", sizeof extra - strlen(extra) - 1);
    CHECK(ts[0]->dtype == TD_DTYPE_F32 && ts[1]->dtype == TD_DTYPE_F32,
          "the quantized matrices were not decoded (%s, %s)", td_dtype_name(ts[0]->dtype),
          td_dtype_name(ts[1]->dtype));
    struct td_state st;
    int32_t ids[8] = {1, 5, 9, 2, 77, 3, 100, 4};
    float *lg = malloc((size_t)8 * m.cfg.vocab * sizeof *lg);
    CHECK(!td_state_init(&st, &m.cfg, 1, 8, 8, (size_t)1 << 30, td_backend_cpu(), err, sizeof err),
          "%s", err);
    if (!check_case_failed) {
        struct td_plan_seq q = {.slot = td_state_seq_alloc(&st), .n_new = 8, .ids = ids};
        CHECK(!td_forward_seqs(&cpu, &st, &q, 1, lg, NULL, err, sizeof err), "%s", err);
        for (long i = 0; !check_case_failed && i < 8L * m.cfg.vocab; i++)
            CHECK(isfinite(lg[i]), "logit %ld is %g", i, lg[i]);
        td_state_free(&st);
    }
    free(lg);
    td_model_free(&cpu);
    td_model_free(&m);
    case_end("dummy/released_precision", extra);
}

/* a "device" for the placement's fail-closed sizing: host memory behind a device's interface,
 * with a free-memory figure the test sets and every allocation counted */
static size_t fake_free;
static int fake_allocs;
static void *fake_alloc(size_t bytes) {
    fake_allocs++;
    return calloc(1, bytes ? bytes : 1);
}
static size_t fake_free_bytes(void) {
    return fake_free;
}

/* A placement is sized whole before anything is allocated: a model that does not fit is
 * refused with the figures and nothing placed; with exactly enough it is placed, and the bytes
 * it took are the bytes the sizing counted. On a device (2 GiB kept), and on the host (512 MiB
 * kept: the CPU places dummy weights and decoded checkpoints in fp32, which for a large config
 * is more than the machine has, and used to allocate until the OOM killer came) */
static void test_place_sizing(int on_device) {
    char err[512] = "";
    struct td_model m, dev;
    case_begin();
    CHECK(!td_model_load(&m, "tests/fixtures/c_released", err, sizeof err), "%s", err);
    struct td_backend fake = *td_backend_cpu();
    if (on_device) fake.name = "fake-device", fake.on_device = 1;
    fake.alloc = fake_alloc;
    fake.free_bytes = fake_free_bytes;
    size_t headroom = on_device ? (size_t)2 << 30 : (size_t)512 << 20, need = 0;
    // placed once with room to spare: what it takes
    fake_free = SIZE_MAX, fake_allocs = 0;
    CHECK(!td_model_upload(&m, &fake, &dev, err, sizeof err), "%s", err);
    need = dev.placed_bytes;
    CHECK(need > 0 && fake_allocs > 0, "nothing was placed");
    enum td_dtype dense = on_device ? TD_DTYPE_Q8 : TD_DTYPE_F32,
                  experts = on_device ? TD_DTYPE_Q4 : TD_DTYPE_F32;
    CHECK(dev.layers[0].wq_b.dtype == dense && dev.layers[0].ex_dtype == experts,
          "the placed copy holds %s / %s", td_dtype_name(dev.layers[0].wq_b.dtype),
          td_dtype_name(dev.layers[0].ex_dtype));
    td_model_free(&dev);
    // one byte short: refused before any allocation, with the figures
    fake_free = need + headroom - 1, fake_allocs = 0;
    err[0] = 0;
    CHECK(td_model_upload(&m, &fake, &dev, err, sizeof err) && strstr(err, "do not fit") &&
              strstr(err, fake.name) && fake_allocs == 0,
          "one byte short: rc, %d allocations, \"%s\"", fake_allocs, err);
    char refused[512];
    snprintf(refused, sizeof refused, "%s", err);
    // exactly enough: placed
    fake_free = need + headroom, fake_allocs = 0;
    CHECK(!td_model_upload(&m, &fake, &dev, err, sizeof err), "exactly enough: %s", err);
    CHECK(check_case_failed || dev.placed_bytes == need, "placed %zu bytes, sized %zu",
          dev.placed_bytes, need);
    td_model_free(&dev);
    td_model_free(&m);
    case_end(on_device ? "place/sized_before_anything_is_placed"
                       : "place/host_sized_before_anything_is_placed",
             refused);
}

/* A checkpoint in DeepSeek's released precision (tools/make_quant_fixtures.py --released: FP8
 * dense linears with 128x128 e8m0 scales, FP4 routed experts with per-32 scales, the rest as
 * released) gives the bits of the same model stored as the F32 decode of its weights; each way
 * a quantized weight or its scale can be wrong is refused by name */
static void test_released(void) {
    const char *q = "tests/fixtures/c_released", *ref = "tests/fixtures/c_released/ref";
    char err[1024] = "";
    case_begin();
    int32_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = (i * 37 + 11) % 384;
    float *a = malloc(64 * 384 * sizeof *a), *b = malloc(64 * 384 * sizeof *b);
    CHECK(!logits_of(q, ids, 64, a, err, sizeof err), "the released checkpoint: %s", err);
    CHECK(!logits_of(ref, ids, 64, b, err, sizeof err), "its F32 decode: %s", err);
    CHECK(!check_case_failed && !memcmp(a, b, 64 * 384 * sizeof *a),
          "the logits differ from the F32 decode's");
    case_end("released/fp8_fp4_equals_its_f32_decode", "(64 positions, bit for bit)");

    // the loaded views are not runnable weights: the forward refuses them, and says why
    case_begin();
    struct td_model m;
    struct td_state st;
    CHECK(!td_model_load(&m, q, err, sizeof err), "%s", err);
    CHECK(m.quantized > 0, "no quantized views");
    CHECK(!td_state_init(&st, &m.cfg, 1, 8, 8, (size_t)1 << 30, td_backend_cpu(), err, sizeof err),
          "%s", err);
    if (!check_case_failed) {
        struct td_plan_seq sq = {.slot = td_state_seq_alloc(&st), .n_new = 8, .ids = ids};
        err[0] = 0;
        CHECK(td_forward_seqs(&m, &st, &sq, 1, a, NULL, err, sizeof err) &&
                  strstr(err, "FP8/FP4 weights as loaded"),
              "the unplaced model ran (%s)", err);
        td_state_free(&st);
    }
    td_model_free(&m);
    free(a), free(b);
    case_end("released/unplaced_views_refused", err);

    struct st_set rs;
    if (st_set_open(&rs, q, err, sizeof err)) {
        report("released/open", err);
        return;
    }
    struct st_tensor *t = calloc((size_t)rs.n_entries + 2, sizeof *t);
    int n = st_list(&rs, t), i = find(t, n, "layers.0.attn.wq_b.scale");
    uint8_t nan_scale[1] = {255};
    t[i].data = nan_scale;
    expect_error("released/nan_scale_byte", "c_released", t, n, "layers.0.attn.wq_b.scale",
                 "255 (NaN)");
    n = st_list(&rs, t), i = find(t, n, "layers.0.attn.wq_b.scale");
    t[i] = t[--n];
    expect_error("released/missing_scale", "c_released", t, n, "layers.0.attn.wq_b.weight",
                 "its scale layers.0.attn.wq_b.scale is missing");
    n = st_list(&rs, t), i = find(t, n, "layers.0.ffn.experts.0.w1.scale");
    t[i].shape[1] = 1, t[i].nbytes /= 2;
    expect_error("released/fp4_scale_shape", "c_released", t, n,
                 "expected F8_E8M0 [32, 2] (the per-32 scale", "got F8_E8M0 [32, 1]");
    n = st_list(&rs, t), i = find(t, n, "layers.0.attn.wq_b.weight");
    t[i].shape[1] = 16, t[i].nbytes /= 2;
    expect_error("released/fp8_weight_shape", "c_released", t, n, "layers.0.attn.wq_b.weight",
                 "expected F8_E4M3 [128, 32]");
    n = st_list(&rs, t), i = find(t, n, "layers.0.ffn.experts.0.w1.weight");
    t[i].shape[1] = 64, t[i].nbytes *= 2;
    expect_error("released/fp4_weight_unpacked", "c_released", t, n,
                 "layers.0.ffn.experts.0.w1.weight", "expected I8 [32, 32]");
    n = st_list(&rs, t);
    t[n] = t[find(t, n, "layers.0.attn.wq_b.scale")];
    snprintf(t[n].name, sizeof t[n].name, "layers.0.attn.wq_z.scale");
    n++;
    expect_error("released/scale_without_weight", "c_released", t, n, "unexpected tensor",
                 "layers.0.attn.wq_z.scale");
    // a released shard cut short (a download that stopped): refused at open, by file, before any
    // tensor is read; and through the command line with exit status 1 and that one line
    {
        char dir[160], path[200], from[200], err[1024] = "";
        struct td_model m;
        case_begin();
        snprintf(dir, sizeof dir, "%s/released_truncated", root);
        mkdir(dir, 0700);
        snprintf(from, sizeof from, "tests/fixtures/c_released/config.json");
        snprintf(path, sizeof path, "%s/config.json", dir);
        copy_file(from, path);
        snprintf(from, sizeof from, "tests/fixtures/c_released/model.safetensors");
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        copy_file(from, path);
        struct stat sb;
        CHECK(!stat(path, &sb) && !truncate(path, sb.st_size - 4096), "cannot cut %s", path);
        int rc = td_model_load(&m, dir, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "model.safetensors"), "loaded, or no file named: '%s'", err);
        if (!rc) td_model_free(&m);
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "%s generate --model %s --backend cpu --prompt-ids '1 2' --max-tokens 1 "
                 ">/dev/null 2>%s/stderr.txt",
                 getenv("TD_TANDEM") ? getenv("TD_TANDEM") : "bin/tandem", dir, dir);
        int st = system(cmd);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0, "tandem generate exited %d on it",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        snprintf(path, sizeof path, "%s/stderr.txt", dir);
        FILE *fe = fopen(path, "r");
        char line[1024] = "";
        if (fe) {
            if (!fgets(line, sizeof line, fe)) line[0] = 0;
            fclose(fe);
        }
        CHECK(strstr(line, "tandem: ") && strstr(line, "past the data section"),
              "tandem generate said '%s'", line);
        case_end("released/truncated_shard", err);
    }
    free(t);
    st_set_close(&rs);
}

/* the MTP layer of a rewritten mtp_c_upstream_sharded must be refused with w1 (and w2) */
static void expect_mtp_error(const char *name, const struct st_tensor *t, int n, const char *w1,
                             const char *w2) {
    char err[1024] = "";
    struct td_model m, mtp;
    case_begin();
    int rc = load_case("mtp_c_upstream_sharded", t, n, &m, err, sizeof err);
    CHECK(!rc, "the target: %s", err);
    if (!rc) {
        int r2 = td_model_load_mtp(&m, &mtp, err, sizeof err);
        CHECK(r2 == -1, "loaded, expected an error mentioning '%s'", w1);
        CHECK(strstr(err, w1) && (!w2 || strstr(err, w2)), "message '%s' lacks '%s'/'%s'", err, w1,
              w2 ? w2 : "");
        if (!r2) td_model_free(&mtp);
        td_model_free(&m);
    }
    if (getenv("TD_TEST_VERBOSE")) printf("  %s\n", err);
    case_end(name, "");
}

/* The MTP layer in the target's files: a tensor of it missing, mis-shaped or extra (in mtp.0, or
 * a stage past num_nextn_predict_layers) is refused by name with the expected and stored dtype
 * and shape; quantized as the release stores it (FP8 e_proj with its 128x128 scale, FP4 routed
 * experts with per-32 scales) it loads through the target's decode, exactly */
static void test_mtp_layer(void) {
    char err[1024] = "";
    struct st_set ms;
    if (st_set_open(&ms, "tests/fixtures/mtp_c_upstream_sharded", err, sizeof err)) {
        report("mtp/open", err);
        return;
    }
    struct st_tensor *t = calloc(2 * (size_t)ms.n_entries, sizeof *t); // room for the scales
    int n = st_list(&ms, t), i = find(t, n, "mtp.0.hnorm.weight");
    t[i] = t[--n];
    expect_mtp_error("mtp/missing_tensor", t, n, "missing tensor mtp.0.hnorm.weight",
                     "expected F32/BF16/F16 [64]");
    n = st_list(&ms, t), i = find(t, n, "mtp.0.e_proj.weight");
    t[i].shape[1] = 32, t[i].nbytes /= 2;
    expect_mtp_error("mtp/misshaped_tensor", t, n,
                     "tensor mtp.0.e_proj.weight: expected F32/BF16/F16 [64, 64]",
                     "got BF16 [64, 32]");
    n = st_list(&ms, t);
    t[n] = t[find(t, n, "mtp.0.enorm.weight")];
    snprintf(t[n++].name, sizeof t->name, "mtp.0.enorm.bias");
    expect_mtp_error("mtp/extra_tensor", t, n, "unexpected tensor mtp.0.enorm.bias (F32 [64])",
                     "not part of its MTP layer (mtp.0)");
    n = st_list(&ms, t);
    t[n] = t[find(t, n, "mtp.0.enorm.weight")];
    snprintf(t[n++].name, sizeof t->name, "mtp.1.enorm.weight");
    expect_mtp_error("mtp/extra_layer_past_nextn", t, n, "unexpected tensor mtp.1.enorm.weight",
                     NULL);

    // quantized: e_proj FP8 (codes all but NaN's), every routed expert FP4
    case_begin();
    n = st_list(&ms, t);
    uint8_t *bytes = malloc(1 << 20), *p = bytes;
    float *want[32];
    int nw = 0;
    for (int j = 0, n0 = n; j < n0; j++) {
        int fp8 = !strcmp(t[j].name, "mtp.0.e_proj.weight");
        int fp4 = !strncmp(t[j].name, "mtp.0.ffn.experts.", 18);
        if ((!fp8 && !fp4) || nw == 32) continue;
        int out = (int)t[j].shape[0], in = (int)t[j].shape[1];
        size_t nq = fp4 ? (size_t)out * in / 2 : (size_t)out * in;
        size_t ns =
            fp4 ? (size_t)out * (in / 32) : (size_t)((out + 127) / 128) * ((in + 127) / 128);
        uint8_t *q = p, *sc = p + nq;
        p += nq + ns;
        for (size_t k = 0; k < nq; k++)
            q[k] = fp4 ? (uint8_t)(k * 37 + 5)
                       : (uint8_t)((k * 29 + 3) % 254 == 127 ? 126 : (k * 29 + 3) % 254);
        for (size_t k = 0; k < ns; k++)
            sc[k] = (uint8_t)(122 + k % 9);
        want[nw] = malloc((size_t)out * in * sizeof(float));
        if (fp4)
            dequant_fp4_ref(want[nw], q, sc, out, in);
        else
            dequant_fp8_ref(want[nw], q, sc, out, in);
        nw++;
        t[n] = t[j];
        snprintf(t[n].name, sizeof t->name, "%.*s.scale", (int)strlen(t[j].name) - 7, t[j].name);
        t[n].dtype = TD_DTYPE_F8_E8M0;
        t[n].shape[0] = fp4 ? out : (out + 127) / 128;
        t[n].shape[1] = fp4 ? in / 32 : (in + 127) / 128;
        t[n].data = sc;
        t[n++].nbytes = ns;
        t[j].dtype = fp4 ? TD_DTYPE_I8 : TD_DTYPE_F8_E4M3;
        t[j].shape[1] = fp4 ? in / 2 : in;
        t[j].data = q;
        t[j].nbytes = nq;
    }
    struct td_model m, mtp;
    int rc = load_case("mtp_c_upstream_sharded", t, n, &m, err, sizeof err);
    CHECK(!rc, "the target: %s", err);
    int r2 = rc ? -1 : td_model_load_mtp(&m, &mtp, err, sizeof err);
    CHECK(rc || !r2, "the quantized MTP layer: %s", err);
    struct td_model placed = {0};
    if (!r2) { // loaded as views, run from the CPU's placed copy: the exact decode
        CHECK(mtp.quantized > 0, "the MTP layer's FP8/FP4 weights were not kept as views");
        r2 = td_model_upload(&mtp, td_backend_cpu(), &placed, err, sizeof err);
        CHECK(!r2, "placing the MTP layer: %s", err);
        if (r2) td_model_free(&mtp);
    }
    if (!r2) {
        // the decoded tensors, in the order they were quantized (the file's, sorted by name)
        int w = 0;
        for (int j = 0; j < n && !check_case_failed; j++) {
            const char *nm = t[j].name;
            if (t[j].dtype != TD_DTYPE_F8_E4M3 && t[j].dtype != TD_DTYPE_I8) continue;
            const struct td_tensor *got = &placed.mtp_eproj;
            int e = -1, k = 0;
            if (sscanf(nm, "mtp.0.ffn.experts.%d.w%d", &e, &k) == 2)
                got = k == 1   ? &placed.layers[0].w1[e]
                      : k == 2 ? &placed.layers[0].w2[e]
                               : &placed.layers[0].w3[e];
            int64_t cnt = td_tensor_numel(got);
            CHECK(got->dtype == TD_DTYPE_F32 && !memcmp(got->data, want[w], (size_t)cnt * 4),
                  "%s is not its exact decode", nm);
            w++;
        }
        CHECK(check_case_failed || w == nw, "%d of %d quantized tensors checked", w, nw);
        td_model_free(&placed);
        td_model_free(&mtp);
    }
    if (!rc) td_model_free(&m);
    char extra[64];
    snprintf(extra, sizeof extra, "(%d quantized weights)", nw);
    case_end("mtp/quantized_layer_loads_decoded", extra);
    for (int j = 0; j < nw; j++)
        free(want[j]);
    free(bytes);
    free(t);
    st_set_close(&ms);
}

int main(void) {
    char err[1024];
    snprintf(root, sizeof root, "/tmp/td_model_XXXXXX");
    if (!mkdtemp(root)) return 1;
    struct st_set hb, cu;
    if (st_set_open(&hb, "tests/fixtures/b_plain_hc2", err, sizeof err) ||
        st_set_open(&cu, "tests/fixtures/c_upstream_sharded", err, sizeof err)) {
        printf("FAIL open fixtures: %s\n", err);
        return 1;
    }
    struct st_tensor *t = calloc((size_t)cu.n_entries + hb.n_entries + 4, sizeof *t);
    int n;

    // the unchanged rewrite loads, and a stored mtp.* tensor is kept for the drafters
    struct td_model m;
    case_begin();
    n = st_list(&hb, t);
    float mtp[64 * 64];
    memset(mtp, 0, sizeof mtp);
    t[n++] = (struct st_tensor){.name = "mtp.0.e_proj.weight",
                                .dtype = TD_DTYPE_F32,
                                .ndim = 2,
                                .shape = {64, 64},
                                .data = mtp,
                                .nbytes = sizeof mtp};
    CHECK(!load_case("b_plain_hc2", t, n, &m, err, sizeof err), "%s", err);
    if (!check_case_failed) {
        CHECK(td_model_tensor(&m, "mtp.0.e_proj.weight") != NULL, "mtp tensor not kept");
        CHECK(m.head.data == m.embed.data, "tied head is not the embedding");
        CHECK(m.layers[0].sh_b1.data && m.layers[0].sh_w1.dtype == TD_DTYPE_F16,
              "shared expert bias / F16 weight not bound");
        td_model_free(&m);
    }
    case_end("load_hf_layout_with_mtp", "");

    case_begin();
    CHECK(!td_model_load(&m, "tests/fixtures/c_upstream_sharded", err, sizeof err), "%s", err);
    if (!check_case_failed) {
        CHECK(td_model_tensor(&m, "mtp.0.enorm.weight") != NULL, "mtp tensor not kept");
        CHECK(m.layers[1].tid2eid.dtype == TD_DTYPE_I32, "upstream tid2eid is not int32");
        CHECK(m.cfg.mtp_attn[0] == TD_ATTN_SLIDING && m.cfg.attn[2] == TD_ATTN_HCA,
              "legacy compress_ratios not folded");
        td_model_free(&m);
    }
    case_end("load_upstream_sharded", "");

    n = st_list(&hb, t);
    int i = find(t, n, "model.layers.1.self_attn.kv_norm.weight");
    t[i] = t[--n];
    expect_error("missing_tensor", "b_plain_hc2", t, n, "missing tensor",
                 "model.layers.1.self_attn.kv_norm.weight");

    n = st_list(&hb, t);
    i = find(t, n, "model.layers.0.self_attn.q_a_proj.weight");
    t[i].shape[1] = 63;
    t[i].nbytes = 32 * 63 * 2;
    expect_error("misshaped_tensor", "b_plain_hc2", t, n, "expected F32/BF16/F16 [32, 64]",
                 "got BF16 [32, 63]");

    n = st_list(&hb, t);
    i = find(t, n, "model.layers.0.mlp.gate.tid2eid");
    t[i].dtype = TD_DTYPE_F32; // same bytes as the I64 table: [300, 6] F32
    t[i].shape[1] *= 2;
    expect_error("wrong_dtype", "b_plain_hc2", t, n, "tid2eid", "expected I32/I64");

    n = st_list(&hb, t);
    t[n++] = (struct st_tensor){.name = "model.layers.7.mlp.gate.weight",
                                .dtype = TD_DTYPE_F32,
                                .ndim = 2,
                                .shape = {8, 8},
                                .data = mtp,
                                .nbytes = 256};
    expect_error("unexpected_tensor", "b_plain_hc2", t, n, "unexpected tensor",
                 "model.layers.7.mlp.gate.weight");

    n = st_list(&hb, t);
    i = find(t, n, "model.layers.0.mlp.gate.tid2eid");
    int64_t *bad = malloc(t[i].nbytes);
    memcpy(bad, t[i].data, t[i].nbytes);
    bad[5] = 6; // 6 experts: ids 0..5
    t[i].data = bad;
    expect_error("tid2eid_out_of_range", "b_plain_hc2", t, n, "tid2eid", "not an expert id");
    free(bad);

    n = st_list(&cu, t);
    i = find(t, n, "layers.2.ffn.experts.3.w2.weight");
    t[i] = t[--n];
    expect_error("upstream_missing_expert", "c_upstream_sharded", t, n, "missing tensor",
                 "layers.2.ffn.experts.3.w2.weight");

    n = st_list(&cu, t);
    i = find(t, n, "layers.1.attn.indexer.compressor.ape");
    t[i] = t[--n];
    expect_error("upstream_missing_indexer_ape", "c_upstream_sharded", t, n, "missing tensor",
                 "indexer.compressor.ape");

    case_begin();
    CHECK(td_model_load(&m, root, err, sizeof err) == -1 && strstr(err, "config.json"),
          "a directory without config.json: '%s'", err);
    case_end("missing_config", "");

    test_dummy();
    test_flash_slice();
    test_flash_depth();
    test_dummy_too_large();
    test_long_path();
    test_generation_config();
    test_fifo_configs();
    test_sinks_bf16(&hb);
    test_released();
    test_place_sizing(1);
    test_place_sizing(0);
    test_dummy_released();
    test_mtp_layer();

    st_set_close(&hb);
    st_set_close(&cu);
    free(t);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) return 1;
    return check_failures ? 1 : 0;
}
