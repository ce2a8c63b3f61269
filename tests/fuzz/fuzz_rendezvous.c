/* libFuzzer harness: the rendezvous Join handler (proto/rendezvous.c: protobuf-c unpacking and the checks
 * of rank, world size and config hash), called in process through zt_rpc_server_call_local. Each input is
 * one or two JoinRequests (length:u16le then bytes, twice) sent in turn to a fresh rendezvous of two ranks
 * that rank 0 has joined, so the second can meet a rank that joined already. With two ranks no Join waits:
 * each is decided at once. */
#include "fuzz_common.h"

#include "proto/rendezvous.h"
#include "ztrain/v1/rendezvous.pb-c.h"

#define HASH 0x5eed5eed12345678ull

static uint8_t g_id[ZT_RDZV_ID_BYTES];

static void write_seeds(void)
{
    uint8_t buf[512];
    size_t len = 0;
    for (int k = 0; k < 2; k++) {
        Ztrain__V1__JoinRequest r = ZTRAIN__V1__JOIN_REQUEST__INIT;
        r.rank = 1;
        r.world_size = 2;
        r.config_hash = HASH;
        r.host = "worker-1";
        size_t n = ztrain__v1__join_request__get_packed_size(&r);
        buf[len++] = (uint8_t)n;
        buf[len++] = 0;
        ztrain__v1__join_request__pack(&r, buf + len);
        len += n;
        fz_write_seed(k == 0 ? "join.bin" : "join_twice.bin", buf, len);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    for (int i = 0; i < ZT_RDZV_ID_BYTES; i++)
        g_id[i] = (uint8_t)(i * 13 + 1);
    if (fz_seed_dir()) {
        write_seeds();
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zt__rdzv *r = NULL;
    zt_rpc_server_t *srv = NULL;
    zt_err err = {{0}};
    struct zt_rpc_server_options opt = {0};
    if (zt__rdzv_create(2, HASH, g_id, 5.0, &r, &err) != 0 || zt_rpc_server_create(&opt, &srv, &err) != 0 ||
        zt__rdzv_add_methods(r, srv, &err) != 0)
        abort();
    size_t at = 0;
    for (int k = 0; k < 2 && at + 2 <= size; k++) {
        size_t len = (size_t)data[at] | (size_t)data[at + 1] << 8;
        at += 2;
        if (len > size - at)
            len = size - at;
        struct zt_rpc_part part = {data + at, len};
        struct zt_rpc_local_msg msg = {&part, 1};
        struct zt_rpc_status st;
        zt_rpc_server_call_local(srv, "/ztrain.v1.Rendezvous/Join", &msg, 1, 1.0, NULL, NULL, &st);
        at += len;
    }
    zt_rpc_server_destroy(srv, 0);
    zt__rdzv_destroy(r);
    return 0;
}
