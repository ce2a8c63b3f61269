/* The memory planner; see plan.h. */
#include "worker/train/plan.h"

#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "common/units.h"

const char *zt_plan_weights_name(enum zt_plan_weights w)
{
    switch (w) {
    case ZT_PLAN_RESIDENT:
        return "resident";
    case ZT_PLAN_CHUNKED:
        return "chunked";
    case ZT_PLAN_STREAMED:
        return "streamed";
    }
    return "?";
}

size_t zt_plan_device_total(const zt_plan_device *d)
{
    return d->engine + d->model + d->fixed;
}

/* The layouts the request allows, fastest first; returns their count. */
static int allowed_layouts(const zt_plan_request *r, bool optimizer_on_gpu, enum zt_plan_weights out[3])
{
    int n = 0;
    const bool off = !optimizer_on_gpu;
    if (r->weights != ZT_WEIGHTS_HOST && r->weights != ZT_WEIGHTS_MASTERS) {
        out[n++] = ZT_PLAN_RESIDENT;
        if (off && r->can_chunk)
            out[n++] = ZT_PLAN_CHUNKED;
    }
    if (r->weights != ZT_WEIGHTS_GPU && off && r->can_stream)
        out[n++] = ZT_PLAN_STREAMED;
    return n;
}

/* The smallest need among the allowed layouts at micro-batch b; *w receives its layout. Returns false
 * when the request allows no layout. */
static bool smallest(const zt_plan_request *r, bool optimizer_on_gpu, int b, bool ckpt_all, enum zt_plan_weights *w,
                     zt_plan_device *d)
{
    enum zt_plan_weights ws[3];
    const int n = allowed_layouts(r, optimizer_on_gpu, ws);
    bool found = false;
    for (int i = 0; i < n; i++) {
        zt_plan_device x;
        r->price(r->ctx, ws[i], optimizer_on_gpu, b, ckpt_all, &x);
        if (!found || zt_plan_device_total(&x) < zt_plan_device_total(d)) {
            *d = x;
            *w = ws[i];
            found = true;
        }
    }
    return found;
}

static void size_text(uint64_t bytes, char *buf, size_t cap)
{
    zt_format_size(bytes, buf, cap);
}

/* A --gpu-mem value at least `bytes`, rounded up to a tenth of a GiB, as a flag value: "3.5GiB" becomes
 * "3584MiB" (the parser takes whole numbers of a unit). */
static void cap_flag(uint64_t bytes, char *buf, size_t cap)
{
    const uint64_t step = (1ULL << 30) / 10;
    const uint64_t up = (bytes + step - 1) / step * step;
    snprintf(buf, cap, "%lluMiB", (unsigned long long)((up + (1ULL << 20) - 1) >> 20));
}

int zt_plan_fit(const zt_plan_request *r, zt_plan_choice *out, zt_err *err)
{
    memset(out, 0, sizeof *out);
    /* --gpu-mem, unless the GPU has less free (gpu_free 0: unknown) */
    const bool capped = r->cap && (r->gpu_free == 0 || r->cap <= r->gpu_free);
    const uint64_t limit = capped ? r->cap : r->gpu_free;
    enum zt_plan_weights ws[3];
    const int nw = allowed_layouts(r, r->optimizer_on_gpu, ws);
    if (nw == 0)
        return zt_fail(err, ZT_EINVAL_CONFIG, "--weights host streams the weights from host memory: it needs the "
                       "optimizer off the GPU (--optimizer cpu or server, without --optimizer-gpu-fraction) and ZeRO-3");
    /* the configured micro-batch first; with an automatic one, its divisors downwards */
    for (int b = r->micro_batch; b >= 1; b--) {
        if (b != r->micro_batch && (!r->auto_micro || r->micro_batch % b != 0))
            continue;
        for (int i = 0; i < nw; i++) {
            zt_plan_device d;
            r->price(r->ctx, ws[i], r->optimizer_on_gpu, b, false, &d);
            if (zt_plan_device_total(&d) <= limit) {
                out->weights = ws[i];
                out->micro_batch = b;
                out->grad_accum = r->grad_accum * (r->micro_batch / b);
                out->device = d;
                out->limit = limit;
                out->capped = capped;
                return 0;
            }
        }
    }

    /* Nothing fits: the minimum of this configuration, and what would fit. */
    enum zt_plan_weights w0;
    zt_plan_device d0;
    const int b_min = r->auto_micro ? 1 : r->micro_batch;
    smallest(r, r->optimizer_on_gpu, b_min, false, &w0, &d0);
    char need[32], lim[32], eng[32], act[32], fix[32];
    size_text(zt_plan_device_total(&d0), need, sizeof need);
    size_text(limit, lim, sizeof lim);
    size_text(d0.engine, eng, sizeof eng);
    size_text(d0.model, act, sizeof act);
    size_text(d0.fixed, fix, sizeof fix);
    char ways[1024];
    size_t used = 0;
    ways[0] = '\0';
    enum zt_plan_weights w;
    zt_plan_device d;
    char x[32];
    if (r->optimizer_on_gpu) {
        zt_plan_request off = *r;
        off.optimizer_on_gpu = false;
        if (smallest(&off, false, b_min, false, &w, &d) && zt_plan_device_total(&d) <= limit) {
            size_text(zt_plan_device_total(&d), x, sizeof x);
            used += (size_t)snprintf(ways + used, sizeof ways - used, "--optimizer cpu (%s weights, %s); ",
                                     zt_plan_weights_name(w), x);
        }
    }
    if (!r->ckpt_all && smallest(r, r->optimizer_on_gpu, b_min, true, &w, &d) && zt_plan_device_total(&d) <= limit) {
        size_text(zt_plan_device_total(&d), x, sizeof x);
        used += (size_t)snprintf(ways + used, sizeof ways - used, "--checkpointing all (%s); ", x);
    }
    for (int b = b_min - 1; b >= 1 && used < sizeof ways; b--) {
        if (b_min % b != 0)
            continue;
        if (smallest(r, r->optimizer_on_gpu, b, false, &w, &d) && zt_plan_device_total(&d) <= limit) {
            size_text(zt_plan_device_total(&d), x, sizeof x);
            used += (size_t)snprintf(ways + used, sizeof ways - used,
                                     "--batch-size %d --grad-accum %d for the same tokens per step (%s); ",
                                     b * r->world, r->grad_accum * (b_min / b), x);
            break;
        }
    }
    char flag[32];
    cap_flag(zt_plan_device_total(&d0), flag, sizeof flag);
    if (used < sizeof ways)
        snprintf(ways + used, sizeof ways - used, "%s--gpu-mem %s or more", capped ? "" : "a GPU with ", flag);
    char cap_text[64] = "";
    if (r->cap && !capped) {
        char c[32];
        size_text(r->cap, c, sizeof c);
        snprintf(cap_text, sizeof cap_text, " free (less than --gpu-mem %s)", c);
    }
    return zt_fail(err, ZT_ENOMEM, "%s %s%s: this run needs at least %s of GPU memory per rank (%s weights: engine %s, "
                   "activations of %d x %d tokens %s, cuBLAS and NCCL %s); what would fit: %s",
                   capped ? "--gpu-mem is" : "the GPU has", lim, cap_text, need, zt_plan_weights_name(w0), eng, b_min,
                   r->seq_len, act, fix, ways);
}

uint64_t zt_plan_checkpoint_bytes(uint64_t P, bool grads)
{
    return (grads ? 16 : 12) * P + (1ULL << 20);
}

int zt_plan_check_checkpoint(uint64_t need, uint64_t free_bytes, const char *dir, zt_err *err)
{
    if (free_bytes == 0 || need <= free_bytes)
        return 0;
    char n[32], f[32];
    zt_format_size(need, n, sizeof n);
    zt_format_size(free_bytes, f, sizeof f);
    return zt_fail(err, ZT_ENOMEM, "disk: a checkpoint needs %s in '%s' and its file system has %s free; nothing was "
                   "written (the last checkpoint is intact): free space there, train into a directory on a larger disk "
                   "(--out), or train without checkpoints (--save-every -1)", n, dir, f);
}

void zt_plan_size_flag(uint64_t bytes, char *buf, size_t cap)
{
    const uint64_t step = bytes >= (1ULL << 30) ? 64ULL << 20 : 1ULL << 20;
    const uint64_t up = (bytes + step - 1) / step * step;
    snprintf(buf, cap, "%lluMiB", (unsigned long long)((up + (1ULL << 20) - 1) >> 20));
}

/* Fits the host state under the cap; see plan.h. */
int zt_plan_fit_host(const zt_plan_host_request *r, zt_plan_host_choice *out, zt_err *err)
{
    memset(out, 0, sizeof *out);
    zt_plan_tiers t = {0};
    zt_plan_host_price p, tier[2];
    memset(&p, 0, sizeof p); /* a price function may leave staging 0 */
    memset(tier, 0, sizeof tier);
    r->price(r->ctx, &t, &p);
    if (p.ram <= r->cap) {
        out->tiers = t;
        out->price = p;
        return 0;
    }
    const zt_plan_host_price all_ram = p;
    /* the moments on disk, then the masters: each tier keeps its leading blocks in what the cap leaves */
    int ntier = 0;
    for (int level = 1; level <= 2; level++) {
        if (level == 2 && !r->can_masters_disk)
            break;
        zt_plan_tiers x = {.moments_disk = true, .masters_disk = level == 2};
        r->price(r->ctx, &x, &tier[ntier]);
        const zt_plan_host_price floor = tier[ntier++];
        if (!r->has_dir || floor.ram > r->cap)
            continue;
        if (level == 1)
            x.moments_ram = r->cap - floor.ram;
        else
            x.masters_ram = r->cap - floor.ram;
        r->price(r->ctx, &x, &p);
        if (p.ram > r->cap) { /* a record's staging that the blocks left on disk do not shrink: none kept */
            x.moments_ram = x.masters_ram = 0;
            p = floor;
        }
        out->tiers = x;
        out->price = p;
        return 0;
    }
    /* Nothing fits: the smallest plan with what is given, and the changes. */
    const zt_plan_host_price *min = &all_ram;
    bool min_disk = false; /* the smallest plan puts state on disk */
    for (int i = 0; r->has_dir && i < ntier; i++)
        if (tier[i].ram < min->ram)
            min = &tier[i], min_disk = true;
    char cap_s[32], need[32], flag[32], ways[768];
    zt_format_size(r->cap, cap_s, sizeof cap_s);
    zt_format_size(min->ram, need, sizeof need);
    zt_plan_size_flag(min->ram, flag, sizeof flag);
    size_t used = (size_t)snprintf(ways, sizeof ways, "--host-mem %s or more", flag);
    const uint64_t staging = !r->staging ? 0 : min->staging ? min->staging : r->staging;
    if (staging && min->ram - staging <= r->cap) {
        char x[32];
        zt_format_size(min->ram - staging, x, sizeof x);
        used += (size_t)snprintf(ways + used, sizeof ways - used, "; --save-every -1 (no checkpoint staging: %s)", x);
    }
    if (!r->has_dir && used < sizeof ways) {
        for (int i = 0; i < ntier && used < sizeof ways; i++) {
            if (tier[i].ram >= all_ram.ram)
                continue; /* the disk would not lower this plan's RAM */
            char x[32], d[32];
            zt_format_size(tier[i].ram, x, sizeof x);
            zt_format_size(tier[i].disk, d, sizeof d);
            used += (size_t)snprintf(ways + used, sizeof ways - used, "; --moments-dir DIR, %s on disk (RAM %s%s, "
                                     "disk %s)", i == 0 ? "moments" : "moments and masters", x,
                                     tier[i].ram <= r->cap ? "" : ", above the cap", d);
        }
    }
    return zt_fail(err, ZT_ENOMEM, "--host-mem %s is below this run's smallest plan: at least %s of host memory per "
                   "rank (%s%s); what would fit: %s", cap_s, need, min->parts,
                   !min_disk                   ? ""
                   : min == &tier[1]           ? "; moments and fp32 masters on disk"
                   : r->can_masters_disk       ? "; moments on disk"
                                               : "; moments on disk, fp32 masters in RAM with --weights masters",
                   ways);
}

int zt_plan_check_host(const zt_plan_host *h, zt_err *err)
{
    char need[32], have[32];
    if (h->ram_available > 0 && h->ram_needed > h->ram_available) {
        size_text(h->ram_needed, need, sizeof need);
        size_text(h->ram_available, have, sizeof have);
        if (h->ram_fixes && h->ram_fixes[0])
            return zt_fail(err, ZT_ENOMEM, "host memory: this plan needs %s (%s) and %s are available (MemAvailable); "
                           "what would fit: %s", need, h->ram_parts ? h->ram_parts : "", have, h->ram_fixes);
        return zt_fail(err, ZT_ENOMEM, "host memory: this plan needs %s (%s) and %s are available (MemAvailable); "
                       "free memory, keep the optimizer state on NVMe (--offload nvme:DIR), use state servers on "
                       "other machines (--optimizer server --servers), or train a smaller model", need,
                       h->ram_parts ? h->ram_parts : "", have);
    }
    if (h->disk_needed > 0 && h->disk_free > 0 && h->disk_needed > h->disk_free) {
        size_text(h->disk_needed, need, sizeof need);
        size_text(h->disk_free, have, sizeof have);
        return zt_fail(err, ZT_ENOMEM, "disk: the optimizer state needs %s in '%s' and its file system has %s free; "
                       "free space there, choose a directory on a larger disk (--moments-dir DIR, --offload nvme:DIR), "
                       "or keep the state in RAM (without them)", need, h->disk_dir ? h->disk_dir : "?", have);
    }
    return 0;
}

uint64_t zt_plan_ram_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib << 10;
}

uint64_t zt_plan_disk_free(const char *dir)
{
    struct statvfs s;
    if (!dir || statvfs(dir, &s) != 0)
        return 0;
    return (uint64_t)s.f_bavail * (uint64_t)s.f_frsize;
}
