/* main.c - the `main` of every executable mbtc builds: hands the program's descriptor to the
 * runtime (rt_main in program.c checks it, parses the command line and runs a command).
 *
 * Pipeline position: the last link. The generated object defines `const RtProgram mbt_program`
 * (rt_program.h); this file is the only reference to it. It sits in libmbtrt.a, and a linker takes
 * an archive member only to resolve an undefined symbol, so programs with their own `main` (the
 * tests, tools/gendata.c) never pull it in and need no mbt_program. */
#include "rt_exec.h"

int main(int argc, char **argv) { return rt_main(argc, argv, &mbt_program); }
