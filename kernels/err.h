/* err.h: the two kinds of error (STYLE.md 9.4), for every room above kernels/.
 *
 * Recoverable (bad input, a file that does not load, a step that does not fit): a one-line
 * message into the caller's buffer and -1 back, so a caller writes
 *     if (x < 0) return td_errf(err, errlen, "field x is %d, must be >= 0", x);
 * The library never exits on one of these.
 *
 * Fatal (a broken invariant of our own code, a CUDA fault, memory a CPU reference cannot get):
 * TD_ABORT prints "tandem: fatal at file:line: message" and aborts; nothing returns from it.
 *     TD_ASSERT(n_keys <= slice);                     // host, always compiled
 *     float *s = td_xmalloc(n * sizeof *s);           // never NULL: aborts with the size
 *     TD_DEV_ASSERT(nj <= slice);                     // device code, only with TD_DEBUG
 * A debug build (make DEBUG=1) defines TD_DEBUG: device assertions compiled in, plans
 * validated every step, launches synchronous.
 */
#ifndef TD_ERR_H
#define TD_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* printf into err[errlen] (when err is not NULL); returns -1, so `return td_errf(...);` */
__attribute__((format(printf, 3, 4))) int td_errf(char *err, size_t errlen, const char *fmt, ...);

/* print "tandem: fatal at file:line: <fmt ...>" to stderr, then abort() */
__attribute__((noreturn, format(printf, 3, 4))) void td_abort(const char *file, int line,
                                                              const char *fmt, ...);

/* malloc / calloc that never return NULL: out of memory aborts naming the bytes and caller */
void *td_xmalloc_at(size_t bytes, const char *file, int line);
void *td_xcalloc_at(size_t n, size_t size, const char *file, int line);

#ifdef __cplusplus
}
#endif

#define TD_ABORT(...) td_abort(__FILE__, __LINE__, __VA_ARGS__)
#define TD_ASSERT(cond)                                                                            \
    ((cond) ? (void)0 : td_abort(__FILE__, __LINE__, "assertion %s failed", #cond))
#define td_xmalloc(bytes)   td_xmalloc_at((bytes), __FILE__, __LINE__)
#define td_xcalloc(n, size) td_xcalloc_at((n), (size), __FILE__, __LINE__)

/* device code: with TD_DEBUG, a failed cond prints file:line and the expression from the thread
 * that saw it, then traps (the launch fails with cudaErrorLaunchFailure / an illegal
 * instruction, which the next CUDA_CHECK or finish reports); without it, nothing */
#if defined(__CUDA_ARCH__) && defined(TD_DEBUG)
#define TD_DEV_ASSERT(cond)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("tandem: device assertion %s failed at %s:%d (block %d, thread %d)\n", #cond,   \
                   __FILE__, __LINE__, (int)blockIdx.x, (int)threadIdx.x);                         \
            __trap();                                                                              \
        }                                                                                          \
    } while (0)
#else
#define TD_DEV_ASSERT(cond) ((void)0)
#endif

#endif
