/* policy.h: how many drafts each decoding sequence verifies this step (the adaptive draft
 * policy). A step of R rows costs T(R) seconds and commits, for each sequence s verifying d_s
 * drafts, 1 + m_s[0] + ... + m_s[d_s - 1] tokens on average, where m_s[j] is the chance that
 * drafts 1 .. j + 1 are all accepted (non-increasing in j). The policy picks the d_s that
 * maximise committed tokens per second, sum_s E_s(d_s) / T(R):
 *
 *   struct td_policy p;
 *   policy_init(&p);
 *   policy_observe(&p, 1, rows, seconds);  // after each step: drafted?, its rows, its wall time
 *   int d[2];                               // n = 2 sequences, m[s * stride + j], kmax[s]
 *   struct policy_step st = POLICY_STEP(0);  // no prompt rows, nothing else in the step
 *   if (policy_drafting(&p, 2, kmax, m, stride, &st))      // a model drafter: draft?
 *       policy_choose(&p, 2, kmax, m, stride, &st, d);     // how many each verifies
 *   policy_free(&p);
 *
 * For a total of R rows the best drafts are the R - n largest m_s[j] (each sequence's prefix,
 * since its m are non-increasing), so the choice scans R from n to n + sum kmax once. Prompt
 * rows share the step with the drafts (struct policy_step): a draft that takes a prompt's row
 * pushes that row to a later step, so it is charged a prompt row's cost (a plain step's cost
 * over its rows). Beside prompt rows a step's rate counts their time and not their progress, so
 * there the drafts maximise the surplus E - rho T over rho, the best rate of the sequences'
 * decode step alone: a draft is verified where its tokens come as fast as decoding gives them
 * (policy_decide in policy.c). T comes
 * from steps measured by row bucket (powers of two, a moving average each); a bucket never
 * measured costs what the next smaller measured one does, or for a drafting step with none
 * smaller what a plain step of its bucket does (optimistic, so a larger bucket is tried and
 * then known), and with nothing measured every draft is verified; while the bucket of
 * a step without drafts is unmeasured and others are, no draft is verified (that is tried too).
 * Given the same measurements the choice is the same: ties go to fewer rows, then to earlier
 * sequences.
 */
#ifndef TD_POLICY_H
#define TD_POLICY_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define POLICY_BUCKETS  20 /* row buckets 1, 2, 4, ... 2^19 */
#define POLICY_MAX_K    16 /* draft positions the acceptance counts hold (TD_MAX_DRAFT) */
#define POLICY_MEMORY   32 /* steps: the acceptance counts lose 1 / POLICY_MEMORY a step */
#define POLICY_SWITCH_W 8  /* proposals: the weight a catch-up's stretch is discounted against */

struct td_policy {
    /* seconds a step of the bucket takes (moving average; 0: not measured yet, the first step
       of a bucket being its warm-up), [0] for steps whose drafter was off (plain steps; a model
       drafter only caught up), [1] for steps with drafts on offer */
    double t[2][POLICY_BUCKETS];
    long n[2][POLICY_BUCKETS]; /* steps seen in each */
    /* a model drafter's catch-up (the rows it makes up when it drafts again after drafting
       nothing for a sequence): its drafting phases without one (moving average, seconds, and
       their count), the time the phases with one took beyond that and their rows (sums), and
       the drafting stretches (runs of steps that draft) seen end, their steps, and the current
       one's */
    double draft_phase, catch_s;
    long n_phase, catch_rows, n_catch, stretches, stretch_steps, stretch;
    /* every request's verified drafts: acc[j] of prop[j] at position j + 1 accepted, each
       count losing 1 / POLICY_MEMORY a step (policy_age), so that what the policy believes
       ages while it verifies nothing: the starts of answers, which a prompt phase's rounds
       are, accept about half as often as the rest (tandem-tiny, both drafters), and counts
       kept for good held a batch-16 run plain for its whole first wave */
    double acc[POLICY_MAX_K], prop[POLICY_MAX_K];
    /* the measuring knobs, set by policy_init from the environment: the steps over which the
       counts lose about 63% (TD_POLICY_MEMORY, POLICY_MEMORY), and the proposals a catch-up's
       stretch is discounted against (TD_POLICY_SWITCH_W, POLICY_SWITCH_W; 0: not at all) */
    double memory, switch_w;
    /* the proposals a position's aged counts keep at least (0: none, the default; from
       TD_POLICY_FLOOR=N at policy_init, measuring only): with a floor what was learnt stays a
       weak prior and the optimism it leaves is bounded. Without one, at batch 64 on tandem-tiny
       the counts of the prompt phase aged away over 130 plain steps, every estimate rose to
       about 1, and DSpark drafted again in the tail: a catch-up of 4608-5504 rows, 6.7-7.3 ms
       of a 130 ms run, for two drafting steps (H100, HumanEval, four runs alike) */
    double floor;
    /* never draft (TD_POLICY_PLAIN=1 at policy_init, measuring only): a drafter's run that
       decodes plainly throughout, so that what its presence alone costs a plain step (its
       target outputs, its host work) is the run's gap to --draft none */
    int plain;
    /* test seam: when set, the cost of a step of rows rows, instead of the measurements (and
       no catch-up costs anything) */
    double (*cost)(void *ctx, int drafting, int rows);
    void *cost_ctx;
    struct policy_cand *cand; /* scratch of policy_choose */
    int cap;
};

/* The rows of a step beside its n verify groups' anchors. With r drafts it feeds
 * n + fixed + r + min(prompt, room - r) rows, r at most max_drafts (<= room). */
struct policy_step {
    int fixed;      /* rows no draft takes (groups whose drafts are all verified) */
    int prompt;     /* prompt rows waiting for the step */
    int room;       /* rows the drafts and the prompts share */
    int max_drafts; /* drafts at most (the prompts keep the rest of room) */
    double extra;   /* seconds a drafting step costs beside its table's (policy_switch_cost:
                       the catch-up that drafting again starts) */
};
/* a step of fixed other rows and no prompts */
#define POLICY_STEP(fixed_rows)                                                                    \
    ((struct policy_step){.fixed = (fixed_rows), .room = 1 << 28, .max_drafts = 1 << 28})

void policy_init(struct td_policy *p);
void policy_free(struct td_policy *p);

/* the bucket of a step of rows rows: the power of two at or above it */
int policy_bucket(int rows);

/* a step of rows rows took seconds; drafting: its drafter made drafts (table [1]) */
void policy_observe(struct td_policy *p, int drafting, int rows, double seconds);

/* a drafter phase that drafted took seconds and made up rows rows of catch-up: without one
 * it is the phases' baseline; with one, its time beyond the baseline is the rows' cost (a
 * phase's own time over its rows priced a few rows caught up beside a round's drafting work
 * as hundreds of microseconds each) */
void policy_observe_drafter(struct td_policy *p, long rows, double seconds);

/* a round verified drafts 1 .. verified and accepted 1 .. accepted of them */
void policy_observe_round(struct td_policy *p, int verified, int accepted);

/* a step went by: the acceptance counts lose 1 / memory (never below the floor) */
void policy_age(struct td_policy *p);

/* the measured cost of a row of catch-up (seconds; 0: none measured) */
double policy_catch_row(const struct td_policy *p);

/* the decision for the next step was to draft or not (the drafting stretches' lengths) */
void policy_decided(struct td_policy *p, int drafting);

/* What drafting again costs a step when it starts a catch-up of rows rows: their measured cost
 * over the mean drafting stretch (a switch pays once for the steps that draft after it; at
 * batch 32 on tandem-tiny a stretch was one or two steps of 650-1130 us after a catch-up of
 * 1.4-1.6 ms), a stretch shortened by the evidence the acceptance estimates rest on: with
 * position 1's aged proposals a and POLICY_SWITCH_W = w, over h * a / (a + w) steps, at least
 * one. Estimates that have aged to almost nothing are optimistic, and such a decision drafted
 * again at batch 64 behind a catch-up of 4608-5504 rows (6.7-7.3 ms, priced at a third of it
 * over a mean stretch of 3) for two steps (H100, DSpark, HumanEval, four runs alike). 0 with
 * the test seam or nothing measured. */
double policy_switch_cost(const struct td_policy *p, long rows);

/* the modelled cost of a step of rows rows (seconds; 0 when nothing is measured) */
double policy_cost(const struct td_policy *p, int drafting, int rows);

/* d[s] in 0 .. kmax[s] for n sequences, from m[s * stride + j] (s's chance that its drafts
 * 1 .. j + 1 are all accepted; made non-increasing here) beside the step's other rows st, at
 * the drafting steps' costs. Returns the drafts chosen in all. */
int policy_choose(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                  const struct policy_step *st, int *d);

/* Whether the next step should draft at all (a model drafter's round costs whatever it
 * verifies): 1 when its best rate beats a plain step's, n / cost(plain). A table never measured
 * for the step's rows is tried first (drafting before plain). */
int policy_drafting(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                    const struct policy_step *st);

/* A request's m[j], j < k: the chance that its drafts 1 .. j + 1 are all accepted, from its own
 * counts (acc_r[j] of prop_r[j] drafts at position j + 1 accepted) with eight proposals' weight
 * of every request's (acc[j] of prop[j], td_policy's aged counts; before any, 1: a position
 * never verified is tried), the latter raised by an optimism bonus that shrinks as a position
 * is verified and grows while it is not (with the log of the rounds, and as the counts age): a
 * position whose first trials failed is tried again, so that an early streak of rejections
 * cannot switch it off for good. */
void policy_estimates(const long *acc_r, const long *prop_r, const double *acc, const double *prop,
                      long rounds, int k, float *m);

/* the cost tables, one line a measured bucket (TD_POLICY_TRACE) */
void policy_trace(const struct td_policy *p, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
