/* norm_rope_ref.c: the norm_rope op on the host (see norm_rope.h), as the three ops it fuses. */
#include "norm_rope.h"

#include "compress.h"
#include "rmsnorm.h"
#include "rope.h"

void norm_rope_ref(const struct norm_rope_args *a) {
    rmsnorm_ref(a->x, a->x, a->w, a->w_dtype, a->n * a->n_vec, a->d, a->eps);
    rope_rows_ref(a->x, a->n, a->n_vec, a->d, a->rot_dim, a->positions, a->inv_freq, a->attn_factor,
                  0);
    if (a->ring) ring_store_ref(a->ring, a->x, a->write, &a->rows, a->ring_rows, a->n_vec * a->d);
}

void norm_rope_parts_ref(const struct norm_rope_args *a, int m) {
    for (int i = 0; i < m; i++)
        norm_rope_ref(&a[i]);
}
