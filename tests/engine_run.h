/* engine_run.h: an engine's steps until its requests are done, and their tokens (tests) */
#ifndef TD_TESTS_ENGINE_RUN_H
#define TD_TESTS_ENGINE_RUN_H

#include <stdint.h>
#include <string.h>

#include "engine/engine.h"

/* steps e (at most 400) until every request is done, then request ids[q]'s tokens into
 * out + q * stride and their count into n_out[q]; ok 0 runs nothing. 0 when all ended, else -1
 * (a step's error in err) */
static inline int engine_drain(struct td_engine *e, int ok, const int *ids, int nq, int32_t *out,
                               int stride, int *n_out, char *err, size_t errlen) {
    int n = 1;
    for (int s = 0; ok && n > 0 && s < 400; s++)
        n = td_engine_step(e, err, errlen);
    for (int q = 0; ok && !n && q < nq; q++) {
        const int32_t *t;
        td_engine_output(e, ids[q], &t, &n_out[q], NULL, NULL, NULL);
        if (n_out[q] > stride) n_out[q] = stride;
        memcpy(out + (size_t)q * stride, t, (size_t)n_out[q] * sizeof *t);
    }
    return ok && !n ? 0 : -1;
}

#endif
