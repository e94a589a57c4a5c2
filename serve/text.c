/* text.c: stop strings and hold-back over generated text (text.h). */
#include "serve/text.h"

#include <string.h>

int stop_find(const char *text, size_t n, size_t from, char *const *stops, int n_stops,
              size_t *at) {
    int best = -1;
    size_t best_at = 0;
    for (int s = 0; s < n_stops; s++) {
        size_t k = strlen(stops[s]);
        if (!k || k > n) continue;
        for (size_t i = from; i + k <= n && (best < 0 || i < best_at); i++)
            if (text[i] == stops[s][0] && !memcmp(text + i, stops[s], k)) {
                best = s, best_at = i;
                break;
            }
    }
    if (best >= 0) *at = best_at;
    return best;
}

size_t stop_holdback(const char *text, size_t n, char *const *stops, int n_stops) {
    size_t hold = 0;
    for (int s = 0; s < n_stops; s++) {
        size_t k = strlen(stops[s]);
        for (size_t j = k > 0 ? k - 1 : 0; j > hold; j--) // suffix of length j == prefix?
            if (j <= n && !memcmp(text + n - j, stops[s], j)) {
                hold = j;
                break;
            }
    }
    return n - hold;
}

int stop_tokens_kept(const size_t *ends, int n_tokens, size_t m) {
    for (int i = 0; i < n_tokens; i++)
        if (ends[i] >= m) return i + 1;
    return n_tokens;
}
