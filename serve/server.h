/* server.h: tandem serve: an OpenAI-compatible HTTP server over the engine (server.md).
 *
 *   struct srv_config c;
 *   srv_config_defaults(&c);            // then srv_config_load / _env / _set (serve/config.h)
 *   return srv_run(&c);                 // blocks until SIGTERM/SIGINT; the exit code
 *
 * srv_run loads the model, binds cfg.host:cfg.port, prints "tandem: serving NAME on URL (...)"
 * to stderr once it accepts requests, and on SIGTERM or SIGINT stops accepting, lets running
 * requests finish for up to server.drain_s seconds, ends the rest with an error event, and
 * returns 0. It returns 1 when it cannot start (the reason printed) or the engine failed.
 */
#ifndef TD_SERVE_SERVER_H
#define TD_SERVE_SERVER_H

#include "serve/config.h"

int srv_run(const struct srv_config *cfg);

#endif
