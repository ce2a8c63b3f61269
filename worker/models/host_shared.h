/* What the host models (worker/models/gpt2.c, llama.c, bert.c, ...) share: the Hugging Face config.json
 * fields that no model's math depends on, the readers of int fields, the shortest decimal form of a float
 * for the configs they write, the deterministic normal initialisation of their weights, and the check and
 * conversion of one safetensors tensor. Internal to worker/models/. */
#ifndef ZT_WORKER_MODELS_HOST_SHARED_H
#define ZT_WORKER_MODELS_HOST_SHARED_H

#include <stdbool.h>
#include <stddef.h>

#include "common/json.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "worker/models/params.h"

/* Whether key is one that PretrainedConfig (transformers 4.x and 5.x) writes into every model's
 * config.json and that changes no model's math: bookkeeping (architectures, torch_dtype, ...), task heads,
 * label maps, special token ids other than bos/eos, and the generation defaults that older versions saved
 * in the model config. A model's reader accepts these after reading its own fields. */
bool zt__host_hf_generic_key(const char *key);

/* An int field of a config struct as config.json names it, with its range. */
typedef struct zt__host_int_key {
    const char *key;
    size_t offset; /* of the int in the config struct */
    int64_t min, max;
} zt__host_int_key;

/* Reads key into *out when present (in [min, max]; the reader's message when not); *present (NULL: not
 * asked) says whether it was. Returns 0 or ZT_EINVAL_CONFIG. */
int zt__host_json_int(zt_json_reader *r, const char *key, int64_t min, int64_t max, int *out, bool *present,
                      zt_err *err);
/* Reads every key of the table into the config struct cfg, in order; the first failure's code. */
int zt__host_json_ints(zt_json_reader *r, const zt__host_int_key *keys, size_t n, void *cfg, zt_err *err);
/* A token id field of obj: a whole number from 0, or null (-1); absent leaves *out. Returns 0 or
 * ZT_EINVAL_CONFIG. */
int zt__host_json_token_id(zt_json_reader *r, const cJSON *obj, const char *key, int *out, zt_err *err);
/* Whether obj's "architectures" is absent, null, or a list whose every entry is one of names (NULL-terminated):
 * the classes whose weights a family reads. */
bool zt__host_architectures_ok(const cJSON *obj, const char *const *names);

/* The shortest decimal that reads back as the same float, as a double, so that 1e-5f is written as 1e-05
 * rather than 9.99999974737875e-06. */
double zt__host_short_decimal(float f);

/* Writes normal(0, std) values from r into x[0..n) and advances r past them: the values zt_rng_normal
 * would give one by one. The CPU kernels' threads each take a contiguous part and jump their copy of the
 * generator to its first draw (zt_rng_jump), so the result does not depend on the thread count. */
void zt__host_fill_normal(zt_rng *r, float *x, size_t n, double std);

/* Checks the file tensor st (of file `file`) against the model's tensor t: its shape (Hugging Face's, [in, out]
 * for a tensor transposed_in_hf), its dtype (F32, F16 or BF16) and that every value is finite, without writing
 * anything. Returns 0, or ZT_EMISMATCH (shape), ZT_EUNSUPPORTED (dtype) or ZT_EFORMAT (a NaN or infinity, named by
 * its element in ztrain's layout) with a message naming the tensor and the file. */
int zt__host_check_tensor(const zt_param_info *t, const zt_st_tensor *st, const char *file, zt_err *err);
/* Converts the file tensor st, accepted by zt__host_check_tensor for t, into dst (t->numel floats) in ztrain's
 * layout (transposed back where the files transpose it; the families' reorder is the caller's). */
void zt__host_convert_tensor(const zt_param_info *t, const zt_st_tensor *st, float *dst);

#endif
