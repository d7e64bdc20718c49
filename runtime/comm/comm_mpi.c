/* comm_mpi.c - the mpi backend (being written: this first version refuses to open). */
#include "comm_internal.h"

RtStatus rt_comm_open_mpi(RtComm *c, RtError *err) {
    (void)c;
    return rt_fail(err, RT_ERR_ARG, "collectives: the mpi backend is not built yet");
}
