/* test_drafter.c: the drafter registry (draft/drafter.h) and what "auto" picks.
 *
 *   make build/tests/test_drafter && build/tests/test_drafter     (from the repo root)
 *
 * registry_names: every name is found, with its kind and default draft tokens, in the order
 *     help and messages list them ("auto, none, ngram, random, mtp or dspark").
 * registry_rejects_unknown: an unknown name (or another case) is refused with every name listed;
 *     draft_init makes request drafters only.
 * auto_policy: draft_pick_auto is none on the CPU; on a device dspark when a DSpark config.json
 *     is there (dspark_dir, else model_dir/dspark/) or the checkpoint carries a DSpark head, else
 *     mtp when it carries an MTP layer, else none (a dspark_dir named beats the rest).
 * engine_auto_on_cpu: td_engine_init with draft "auto" on the CPU backend runs none, also for a
 *     model whose dspark/ loads (it does with "dspark"), and td_engine_draft says so.
 * engine_own_drafters: a checkpoint carrying its DSpark head (tests/embed_dspark.h) runs dspark
 *     with no folder, and refuses mtp; one carrying an MTP layer runs mtp and refuses dspark
 *     (no head, no folder); td_model_own_drafter says which each carries.
 */
#include <limits.h>
#include <sys/stat.h>

#include "check.h"
#include "draft/drafter.h"
#include "embed_dspark.h"
#include "engine/engine.h"
#include "model/model.h"

static const char *fx = "tests/fixtures/b_plain_hc2";            /* a model with no dspark/ */
static const char *dspark_fx = "tests/fixtures/dspark_b/dspark"; /* a DSpark drafter of it */

static void test_registry_names(void) {
    static const struct {
        const char *name;
        enum draft_kind kind;
        int tokens;
    } want[] = {
        {"auto", DRAFT_KIND_AUTO, 0},     {"none", DRAFT_KIND_NONE, 0},
        {"ngram", DRAFT_KIND_REQUEST, 3}, {"random", DRAFT_KIND_REQUEST, 3},
        {"mtp", DRAFT_KIND_MTP, 3},       {"dspark", DRAFT_KIND_DSPARK, 0},
    };
    int n = (int)(sizeof want / sizeof *want);
    case_begin();
    char err[256];
    for (int i = 0; i < n; i++) {
        const struct draft_info *di = draft_lookup(want[i].name, err, sizeof err);
        CHECK(di && !strcmp(di->name, want[i].name), "%s not found: %s", want[i].name, err);
        if (!di) continue;
        CHECK(di->kind == want[i].kind, "%s: kind %d, want %d", want[i].name, di->kind,
              want[i].kind);
        CHECK(di->default_tokens == want[i].tokens, "%s: %d default tokens, want %d", want[i].name,
              di->default_tokens, want[i].tokens);
        CHECK(!di->init == (di->kind != DRAFT_KIND_REQUEST),
              "%s: a constructor iff a request "
              "drafter",
              want[i].name);
        CHECK(draft_names[i] && !strcmp(draft_names[i], want[i].name), "draft_names[%d] is %s", i,
              draft_names[i] ? draft_names[i] : "NULL");
    }
    CHECK(!draft_names[n], "draft_names has more than %d names", n);
    char list[128];
    draft_names_join(list, sizeof list, ", ", " or ");
    CHECK(!strcmp(list, "auto, none, ngram, random, mtp or dspark"), "joined: '%s'", list);
    draft_names_join(list, sizeof list, " | ", " | ");
    CHECK(!strcmp(list, "auto | none | ngram | random | mtp | dspark"), "joined: '%s'", list);
    draft_names_join(list, 10, ", ", " or "); // cut, still terminated
    CHECK(!strcmp(list, "auto, non"), "cut: '%s'", list);
    case_end("registry_names", "");
}

static void test_registry_rejects_unknown(void) {
    case_begin();
    char err[256] = "";
    const char *bad[] = {"eagle", "NGRAM", "", "auto "};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[256];
        snprintf(want, sizeof want,
                 "unknown drafter '%s' (known: auto, none, ngram, random, mtp, dspark)", bad[i]);
        CHECK(!draft_lookup(bad[i], err, sizeof err), "'%s' found", bad[i]);
        CHECK(!strcmp(err, want), "'%s': message '%s'", bad[i], err);
    }
    CHECK(!draft_lookup(NULL, err, sizeof err) && strstr(err, "known: auto"), "NULL: '%s'", err);
    CHECK(!draft_lookup("eagle", NULL, 0), "no error buffer");
    // draft_init makes request drafters and nothing else
    struct td_drafter *d = draft_init("ngram", 300, err, sizeof err);
    CHECK(d && !strcmp(d->name, "ngram") && d->propose, "ngram: %s", d ? "" : err);
    draft_free(d);
    d = draft_init("random", 300, err, sizeof err);
    CHECK(d && !strcmp(d->name, "random"), "random: %s", d ? "" : err);
    draft_free(d);
    const char *not_request[] = {"auto", "none", "mtp", "dspark"};
    for (size_t i = 0; i < sizeof not_request / sizeof *not_request; i++) {
        err[0] = 0;
        d = draft_init(not_request[i], 300, err, sizeof err);
        CHECK(!d && strstr(err, "not a request drafter"), "draft_init(%s): '%s'", not_request[i],
              err);
        draft_free(d);
    }
    d = draft_init("eagle", 300, err, sizeof err);
    CHECK(!d && strstr(err, "unknown drafter 'eagle'"), "draft_init(eagle): '%s'", err);
    case_end("registry_rejects_unknown", "");
}

static void test_auto_policy(void) {
    static const struct {
        int on_device;
        const char *model, *dspark_dir;
        int own; /* td_model_own_drafter */
        const char *want;
    } cases[] = {
        {1, "tests/fixtures/dspark_b", NULL, TD_OWN_NONE, "dspark"}, // the model's dspark/
        {0, "tests/fixtures/dspark_b", NULL, TD_OWN_NONE, "none"},   // on the CPU: never
        {1, "tests/fixtures/b_plain_hc2", NULL, TD_OWN_NONE, "none"},
        {1, "tests/fixtures/b_plain_hc2", "tests/fixtures/dspark_b/dspark", TD_OWN_NONE, "dspark"},
        {0, "tests/fixtures/b_plain_hc2", "tests/fixtures/dspark_b/dspark", TD_OWN_NONE, "none"},
        {1, "tests/fixtures/dspark_b", "tests/fixtures/nonexistent", TD_OWN_NONE,
         "none"}, // dir beats dspark/
        {1, "tests/fixtures/dspark_b", "tests/fixtures/dspark_b", TD_OWN_NONE,
         "none"}, // config.json not there
        // what the checkpoint carries in its own files: its DSpark head (V4-Flash-0731), else its
        // MTP layer (V4-Flash), after a dspark/ beside it; never on the CPU
        {1, "tests/fixtures/b_plain_hc2", NULL, TD_OWN_DSPARK, "dspark"},
        {0, "tests/fixtures/b_plain_hc2", NULL, TD_OWN_DSPARK, "none"},
        {1, "tests/fixtures/b_plain_hc2", NULL, TD_OWN_MTP, "mtp"},
        {0, "tests/fixtures/b_plain_hc2", NULL, TD_OWN_MTP, "none"},
        {1, "tests/fixtures/dspark_b", NULL, TD_OWN_MTP, "dspark"},
        {1, "tests/fixtures/b_plain_hc2", "tests/fixtures/nonexistent", TD_OWN_DSPARK, "none"},
    };
    case_begin();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct draft_info *di =
            draft_pick_auto(cases[i].on_device, cases[i].model, cases[i].dspark_dir, cases[i].own);
        CHECK(di && !strcmp(di->name, cases[i].want),
              "case %zu (device %d, %s, %s, own %d): %s, want %s", i, cases[i].on_device,
              cases[i].model, cases[i].dspark_dir ? cases[i].dspark_dir : "NULL", cases[i].own,
              di ? di->name : "NULL", cases[i].want);
    }
    case_end("auto_policy", "");
}

/* td_engine_init on the CPU with draft d (max_draft k): 0 and the drafter it runs in *ran and
 * its draft tokens in *k_out, or -1 with the message in err */
static int engine_draft(const char *model, const char *d, int k, const char **ran, int *k_out,
                        char *err, size_t errlen) {
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = model;
    ep.backend = "cpu";
    ep.draft = d;
    ep.max_draft = k;
    ep.max_seqs = 1;
    ep.max_ctx = 64;
    ep.max_batch_tokens = 16;
    ep.max_cache_bytes = (size_t)1 << 28;
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, errlen)) return -1;
    static char name[32];
    snprintf(name, sizeof name, "%s", td_engine_draft(e));
    *ran = name;
    *k_out = td_engine_draft_tokens(e);
    td_engine_free(e);
    return 0;
}

static void test_engine_auto_on_cpu(void) {
    char dir[] = "/tmp/td_drafter_XXXXXX", ds[64], err[1024] = "";
    case_begin();
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(ds, sizeof ds, "%s/dspark", dir);
    CHECK(!mkdir(ds, 0700) && !link_fixture(fx, "config.json", dir) &&
              !link_fixture(fx, "model.safetensors", dir) &&
              !link_fixture(dspark_fx, "config.json", ds) &&
              !link_fixture(dspark_fx, "model.safetensors", ds),
          "cannot link the fixtures");
    const char *ran = NULL;
    int k = -1;
    if (!check_case_failed) {
        // the model's dspark/ is a working drafter: asked for, it runs
        CHECK(!engine_draft(dir, "dspark", 0, &ran, &k, err, sizeof err), "dspark: %s", err);
        CHECK(ran && !strcmp(ran, "dspark") && k > 0, "dspark asked for, %s (k %d) runs",
              ran ? ran : "NULL", k);
        // auto on the CPU leaves it, with or without draft tokens asked for
        for (int kk = 0; kk <= 3; kk += 3) {
            ran = NULL;
            CHECK(!engine_draft(dir, "auto", kk, &ran, &k, err, sizeof err), "auto: %s", err);
            CHECK(ran && !strcmp(ran, "none") && k == 0, "auto (k %d) on the cpu runs %s (k %d)",
                  kk, ran ? ran : "NULL", k);
        }
    }
    ran = NULL;
    CHECK(!engine_draft(fx, "auto", 0, &ran, &k, err, sizeof err), "auto, no dspark/: %s", err);
    CHECK(ran && !strcmp(ran, "none"), "auto with no dspark/ runs %s", ran ? ran : "NULL");
    // the names the engine runs are the registry's
    const char *named[] = {"none", "ngram", "random", "mtp"};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++) {
        ran = NULL;
        int rc = engine_draft(i == 3 ? "tests/fixtures/mtp_b_plain_hc2" : fx, named[i], 2, &ran, &k,
                              err, sizeof err);
        CHECK(!rc && ran && !strcmp(ran, named[i]), "%s: runs %s (%s)", named[i],
              ran ? ran : "NULL", rc ? err : "");
    }
    CHECK(engine_draft(fx, "eagle", 0, &ran, &k, err, sizeof err) &&
              !strcmp(err, "unknown drafter 'eagle' (known: auto, none, ngram, random, mtp, "
                           "dspark)"),
          "an unknown drafter: '%s'", err);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) case_fail("cannot remove %s", dir);
    case_end("engine_auto_on_cpu", "");
}

static void test_engine_own_drafters(void) {
    char dir[] = "/tmp/td_drafter_XXXXXX", out[64], err[1024] = "";
    case_begin();
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(out, sizeof out, "%s/embedded", dir);
    CHECK(!embed_dspark(out, "tests/fixtures/c_upstream_sharded", "tests/fixtures/dspark_c/dspark",
                        NULL, 0, NULL, NULL, err, sizeof err),
          "%s", err);
    const char *ran = NULL;
    int k = -1;
    if (!check_case_failed) {
        // dspark with no dspark/ beside it, and no --dspark-dir: the checkpoint's own head
        CHECK(!engine_draft(out, "dspark", 0, &ran, &k, err, sizeof err), "dspark: %s", err);
        CHECK(ran && !strcmp(ran, "dspark") && k == 6, "dspark asked for: %s (k %d) runs",
              ran ? ran : "NULL", k);
        ran = NULL;
        CHECK(!engine_draft(out, "auto", 0, &ran, &k, err, sizeof err), "auto: %s", err);
        CHECK(ran && !strcmp(ran, "none"), "auto on the cpu runs %s", ran ? ran : "NULL");
        CHECK(engine_draft(out, "mtp", 2, &ran, &k, err, sizeof err) &&
                  strstr(err, "DSpark head") && strstr(err, "not an MTP layer"),
              "mtp on a DSpark head: '%s'", err);
    }
    // its MTP layer: mtp runs, dspark has nothing to run
    const char *mtp_fx = "tests/fixtures/mtp_c_upstream_sharded";
    ran = NULL;
    CHECK(!engine_draft(mtp_fx, "mtp", 2, &ran, &k, err, sizeof err) && ran &&
              !strcmp(ran, "mtp") && k == 2,
          "mtp: %s (%s)", ran ? ran : "NULL", err);
    CHECK(engine_draft(mtp_fx, "dspark", 0, &ran, &k, err, sizeof err) &&
              strstr(err, "mtp_c_upstream_sharded/dspark/config.json") &&
              strstr(err, "carries no DSpark head of its own"),
          "dspark on an MTP checkpoint with no dspark/: '%s'", err);
    struct td_model m;
    const struct {
        const char *dir;
        enum td_own_drafter want;
    } own[] = {
        {out, TD_OWN_DSPARK}, {mtp_fx, TD_OWN_MTP}, {"tests/fixtures/b_plain_hc2", TD_OWN_NONE}};
    for (size_t i = 0; !check_case_failed && i < sizeof own / sizeof *own; i++) {
        const char *d = own[i].dir;
        CHECK(!td_model_load(&m, d, err, sizeof err), "%s: %s", d, err);
        if (check_case_failed) break;
        CHECK(td_model_own_drafter(&m) == own[i].want, "%s carries %d, want %d", d,
              td_model_own_drafter(&m), own[i].want);
        td_model_free(&m);
    }
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) case_fail("cannot remove %s", dir);
    case_end("engine_own_drafters", "");
}

int main(void) {
    test_registry_names();
    test_registry_rejects_unknown();
    test_auto_policy();
    test_engine_auto_on_cpu();
    test_engine_own_drafters();
    return check_failures ? 1 : 0;
}
