/* libFuzzer harness: the NVMe tier's record files (offload/store.c): a 4096-byte header (magic, version,
 * key, element count, payload and header CRC-32C) and the payload. The input is one record file in an
 * otherwise empty store folder; the harness opens the store (buffered I/O: the scratch folder may be
 * tmpfs) and, when it accepts the file, reads every record it lists back (which checks the payload's
 * CRC), writes it again and reads it once more. */
#include "fuzz_common.h"

#include "offload/store.h"

static char g_dir[512], g_file[600];

/* Records the store itself wrote: one of 3 elements, one of 1000 (a payload of several pages). */
static void write_seeds(void)
{
    static const size_t sizes[2] = {3, 1000};
    for (int k = 0; k < 2; k++) {
        char dir[512];
        fz_path(dir, sizeof(dir), "seedstore");
        fz_rm_tree(dir);
        fz_mkdir(dir);
        zt_store_config cfg = {.kind = ZT_STORE_NVME, .path = dir, .buffered = 1};
        zt_store *s = NULL;
        zt_err err;
        zt_store_key key = {.run = 0x1234, .block = 2, .shard = 1};
        float *buf = zt_store_buffer_alloc(sizes[k]);
        for (size_t i = 0; i < 3 * sizes[k]; i++)
            buf[i] = (float)i * 0.5f;
        if (zt_store_open(&cfg, &s, &err) != 0 || zt_store_create(s, key, sizes[k], &err) != 0 ||
            zt_store_write(s, key, buf, &err) != 0) {
            fprintf(stderr, "fuzz: %s\n", err.msg);
            abort();
        }
        zt_store_close(s);
        zt_store_buffer_free(buf);
        /* The one record file in the folder. */
        char cmd[700], path[600];
        snprintf(cmd, sizeof(cmd), "ls %s/*.zts", dir);
        FILE *p = popen(cmd, "r");
        if (!p || !fgets(path, sizeof(path), p))
            abort();
        pclose(p);
        path[strcspn(path, "\n")] = '\0';
        size_t len;
        uint8_t *data = fz_read(path, &len);
        char name[64];
        snprintf(name, sizeof(name), "record_%zu_elements.zts", sizes[k]);
        fz_write_seed(name, data, len);
        free(data);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    if (fz_seed_dir()) {
        write_seeds();
        exit(0);
    }
    fz_path(g_dir, sizeof(g_dir), "store");
    fz_mkdir(g_dir);
    snprintf(g_file, sizeof(g_file), "%s/r0000000000001234-b0-s0.zts", g_dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(g_file, data, size);
    zt_store_config cfg = {.kind = ZT_STORE_NVME, .path = g_dir, .buffered = 1};
    zt_store *s = NULL;
    zt_err err;
    if (zt_store_open(&cfg, &s, &err) == 0) {
        zt_store_key keys[4];
        size_t n = zt_store_list(s, keys, 4);
        for (size_t i = 0; i < n && i < 4; i++) {
            size_t numel = 0;
            if (zt_store_lookup(s, keys[i], &numel) != 0 || numel > ((size_t)1 << 20))
                continue; /* the header's size is checked against the file's, so this is a large file */
            float *buf = zt_store_buffer_alloc(numel);
            if (!buf)
                continue;
            if (zt_store_read(s, keys[i], buf, &err) == 0 && zt_store_write(s, keys[i], buf, &err) == 0 &&
                zt_store_read(s, keys[i], buf, &err) != 0)
                abort(); /* a record the store wrote must read back */
            zt_store_buffer_free(buf);
        }
        zt_store_close(s);
    }
    unlink(g_file);
    return 0;
}
