/* server.h: tandem serve: an OpenAI-compatible HTTP server over the engine (server.md).
 *
 *   struct srv_config c;
 *   srv_config_defaults(&c);            // then srv_config_load / _env / _set (serve/config.h)
 *   return srv_run(&c, NULL);           // blocks until SIGTERM/SIGINT; the exit code
 *
 * srv_run loads the model, binds cfg.host:cfg.port, prints "tandem: serving NAME on URL (...)"
 * to stderr once it accepts requests, and on SIGTERM or SIGINT stops accepting, lets running
 * requests finish for up to server.drain_s seconds, ends the rest with an error event, and
 * returns 0. It returns 1 when it cannot start (the reason printed) or the engine failed.
 */
#ifndef TD_SERVE_SERVER_H
#define TD_SERVE_SERVER_H

#include "engine/engine.h"
#include "serve/config.h"

/* comm: NULL, or rank 0 of a model split over processes (model/split.h; app's --ranks):
 * the engine leads them */
struct td_comm;
int srv_run(const struct srv_config *cfg, struct td_comm *comm);

/* the engine's params as the server makes them from its configuration (a follower rank makes
 * its engine with them too: the same state as the leader's) */
struct td_engine_params srv_engine_params(const struct srv_config *c, const char *model_dir,
                                          const char *drafter);

#endif
