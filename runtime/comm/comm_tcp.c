/* comm_tcp.c - the tcp backend (being written: this first version refuses to open). */
#include "comm_internal.h"

RtStatus rt_comm_open_tcp(RtComm *c, RtError *err) {
    (void)c;
    return rt_fail(err, RT_ERR_ARG, "collectives: the tcp backend is not built yet");
}
