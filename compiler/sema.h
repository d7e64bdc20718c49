/* sema.h - semantic analysis: names, imports, constants, types and shapes, train/serve settings.
 *
 * Pipeline position: AST (parse.h) -> [sema] -> graph IR. `mbtc --check` stops after this.
 * Every model and function is checked on its own with its constants symbolic; every train and
 * serve block then instantiates its model with concrete constants and checks the whole step
 * (data shapes, loss, optimizer, schedule, batch arithmetic, parallel layout). */
#ifndef MBT_SEMA_H
#define MBT_SEMA_H

#include "module.h"

/* Checks the main module and everything it imports. Returns the number of errors reported. */
int sema_check(Loader *ld, Module *main);

#endif
