/* test_mtp.c: the engine's MTP drafter against the PyTorch reference (tools/mtp_ref.py).
 *
 *   make build/tests/test_mtp && build/tests/test_mtp
 *
 * tests/fixtures/mtp_tiny (tools/make_drafter_fixtures.py, HF + the reference in fp32 on
 * models/tandem-tiny): the target's greedy bonus token after the prompt, the MTP catch-up
 * logits over the prompt rows (last 8), and a k = 3 greedy chain with recycled streams: its
 * drafts and its last step's logits. The C side runs the same on the CPU: fp32 math against
 * fp32 math, so the budget is max|d| <= 1e-3 * max(1, max|ref row|), and the drafts must be the
 * same tokens.
 */
#include <jansson.h>
#include <stdint.h>

#include "check.h"
#include "draft/mtp.h"
#include "engine/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/state.h"

int main(void) {
    char err[512];
    const char *fx = "tests/fixtures/mtp_tiny";
    struct td_model m;
    struct st_set ref;
    if (td_model_load(&m, "models/tandem-tiny", err, sizeof err) ||
        st_set_open_file(&ref, "tests/fixtures/mtp_tiny/mtp.safetensors", err, sizeof err)) {
        printf("FAIL mtp fixtures: %s\n", err);
        return 1;
    }
    json_t *js = json_load_file("tests/fixtures/mtp_tiny/mtp.json", 0, NULL);
    int32_t ids[256];
    int n = 0;
    FILE *fp = fopen("tests/fixtures/mtp_tiny/ids.txt", "r");
    while (fp && n < 255 && fscanf(fp, "%d", &ids[n]) == 1)
        n++;
    if (fp) fclose(fp);
    int V = m.cfg.vocab, bonus_ref = (int)json_integer_value(json_object_get(js, "bonus"));
    (void)fx;
    const struct td_backend *b = td_backend_cpu();
    struct td_state st;
    struct draft_mtp *d = NULL;
    case_begin();
    CHECK(!td_state_init(&st, &m.cfg, 2, 256, 16, (size_t)1 << 30, b, err, sizeof err), "%s", err);
    CHECK(!draft_mtp_init(&d, &m, &m, b, 2, 256, 64, 3, 0, (size_t)1 << 30, err, sizeof err), "%s",
          err);
    if (check_case_failed) {
        case_end("mtp_init", "");
        return 1;
    }
    float *lg = malloc((size_t)n * V * sizeof(float));
    int slot = td_state_seq_alloc(&st);
    struct td_plan_seq q = {slot, 0, n, ids, 0, 0};
    struct td_plan p;
    struct td_plan_dims dims = td_state_plan_dims(&st, 64, 2);
    CHECK(!meta_plan_init(&p, &dims, err, sizeof err) &&
              !meta_plan_build(&p, &q, 1, err, sizeof err),
          "%s", err);
    struct td_forward_io io = {NULL, draft_mtp_hidden(d), NULL, NULL, 0};
    CHECK(!td_forward_ex(&m, &st, &p, &io, lg, NULL, err, sizeof err), "%s", err);
    int bonus = 0;
    for (int v = 1; v < V; v++)
        if (lg[(size_t)(n - 1) * V + v] > lg[(size_t)(n - 1) * V + bonus]) bonus = v;
    CHECK(bonus == bonus_ref, "target bonus %d, reference %d", bonus, bonus_ref);
    case_end("mtp/target_bonus", "");

    int32_t next[256], drafts[3];
    memcpy(next, ids + 1, (size_t)(n - 1) * sizeof(int32_t));
    next[n - 1] = bonus;
    float *qd = malloc((size_t)3 * V * sizeof(float));
    struct td_sampling greedy = {0.0f, 0, 1.0f, 0};
    // catch-up only: the logits of every prompt row
    case_begin();
    draft_mtp_set_all_logits(d, 1);
    struct mtp_rows r = {slot, 0, n, 0, next, 0, &greedy, drafts, qd, 0};
    CHECK(!draft_mtp_run(d, &r, 1, err, sizeof err), "%s", err);
    const struct st_entry *cl = st_set_find(&ref, "catchup_logits");
    CHECK(cl && cl->t.shape[0] == 8 && cl->t.shape[1] == V, "catchup_logits missing");
    double worst = 0;
    if (!check_case_failed) {
        float *want = malloc((size_t)8 * V * sizeof(float));
        td_tensor_read_f32(&cl->t, 0, (int64_t)8 * V, want);
        worst = rel_row_err(draft_mtp_logits(d) + (size_t)(n - 8) * V, want, 8, V, NULL);
        CHECK(worst <= 1e-3, "catch-up logits off by %.3g relative", worst);
        free(want);
    }
    char extra[96];
    snprintf(extra, sizeof extra, "(worst %.2e over the last 8 rows)", worst);
    case_end("mtp/catchup_logits_match_reference", extra);

    // a fresh sequence in the slot: catch up and draft k = 3 greedily (the engine's way: only the
    // last catch-up row meets the head)
    case_begin();
    draft_mtp_set_all_logits(d, 0);
    r = (struct mtp_rows){slot, 0, n, 0, next, 3, &greedy, drafts, qd, 0};
    CHECK(!draft_mtp_run(d, &r, 1, err, sizeof err), "%s", err);
    json_t *jd = json_object_get(js, "drafts");
    CHECK(r.n_drafts == 3, "%d drafts", r.n_drafts);
    for (int j = 0; j < 3 && j < r.n_drafts; j++)
        CHECK(drafts[j] == (int)json_integer_value(json_array_get(jd, (size_t)j)),
              "draft %d is %d, reference %lld", j, drafts[j],
              (long long)json_integer_value(json_array_get(jd, (size_t)j)));
    const struct st_entry *ch = st_set_find(&ref, "chain_logits");
    if (ch) {
        float *want = malloc((size_t)V * sizeof(float));
        td_tensor_read_f32(&ch->t, (int64_t)2 * V, V, want);
        worst = rel_row_err(draft_mtp_logits(d), want, 1, V, NULL);
        CHECK(worst <= 1e-3, "last chain step's logits off by %.3g", worst);
        free(want);
    }
    snprintf(extra, sizeof extra, "(drafts %d %d %d, last step worst %.2e)", drafts[0], drafts[1],
             drafts[2], worst);
    case_end("mtp/chain_k3_matches_reference", extra);

    free(lg);
    free(qd);
    meta_plan_free(&p);
    draft_mtp_free(d);
    td_state_free(&st);
    st_set_close(&ref);
    json_decref(js);
    td_model_free(&m);
    return check_failures ? 1 : 0;
}
