/* Helpers shared by the host models; see host_shared.h. */
#include "worker/models/host_shared.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_threads.h" /* threads for the initialisation */

int zt__host_json_int(zt_json_reader *r, const char *key, int64_t min, int64_t max, int *out, bool *present,
                      zt_err *err)
{
    int64_t v = INT64_MIN;
    int rc = zt_json_get_int(r, key, min, max, &v, err);
    if (rc < 0)
        return rc;
    if (present)
        *present = v != INT64_MIN;
    if (v != INT64_MIN)
        *out = (int)v;
    return 0;
}

int zt__host_json_token_id(zt_json_reader *r, const cJSON *obj, const char *key, int *out, zt_err *err)
{
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(obj, key))) {
        zt_json_accept(r, key);
        *out = -1;
        return 0;
    }
    return zt__host_json_int(r, key, 0, INT32_MAX, out, NULL, err);
}

bool zt__host_architectures_ok(const cJSON *obj, const char *const *names)
{
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(obj, "architectures");
    if (!arch || cJSON_IsNull(arch))
        return true;
    if (!cJSON_IsArray(arch))
        return false;
    for (const cJSON *a = arch->child; a; a = a->next) {
        int k = 0;
        while (names[k] && !(cJSON_IsString(a) && strcmp(a->valuestring, names[k]) == 0))
            k++;
        if (!names[k])
            return false;
    }
    return true;
}

int zt__host_json_ints(zt_json_reader *r, const zt__host_int_key *keys, size_t n, void *cfg, zt_err *err)
{
    for (size_t i = 0; i < n; i++) {
        int rc = zt__host_json_int(r, keys[i].key, keys[i].min, keys[i].max,
                                   (int *)((char *)cfg + keys[i].offset), NULL, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Fields of Hugging Face configs that no model's math depends on: what PretrainedConfig (transformers 4.x
 * and 5.x) writes into config.json. */
static const char *const generic_keys[] = {
    /* PretrainedConfig bookkeeping */
    "architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "_commit_hash",
    "_attn_implementation", "_attn_implementation_internal", "_attn_implementation_autoset",
    "_experts_implementation", "attn_implementation", "name_or_path", "return_dict", "use_return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "chunk_size_feed_forward", "is_decoder", "cross_attention_hidden_size", "tie_encoder_decoder",
    "finetuning_task", "id2label", "label2id", "num_labels", "problem_type", "tokenizer_class", "prefix",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    /* generation defaults that older transformers versions saved in the model config */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "output_logits",
};

bool zt__host_hf_generic_key(const char *key)
{
    for (size_t i = 0; i < sizeof generic_keys / sizeof generic_keys[0]; i++)
        if (strcmp(key, generic_keys[i]) == 0)
            return true;
    return false;
}

double zt__host_short_decimal(float f)
{
    char buf[32];
    for (int digits = 6; digits < 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if ((float)strtod(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return (double)f;
}

/* Below this many values the normals are drawn on one thread; each thread works in rounds of INIT_ROUND
 * values (the draws of a round, then their transforms). */
#define INIT_PAR_MIN ((size_t)1 << 16)
#define INIT_ROUND ((size_t)1024)

void zt__host_fill_normal(zt_rng *r, float *x, size_t n, double std)
{
    const int threads = n >= INIT_PAR_MIN ? zt_cpu_get_threads() : 1;
    const zt_rng start = *r;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const size_t parts = (size_t)omp_get_num_threads(), j = (size_t)omp_get_thread_num();
        const size_t a = n / parts * j + (j < n % parts ? j : n % parts);
        const size_t b = a + n / parts + (j < n % parts ? 1 : 0);
        zt_rng g = start;
        zt_rng_jump(&g, 2 * (uint64_t)a); /* element i takes draws 2i and 2i + 1 */
        double u[2 * INIT_ROUND];
        for (size_t i = a; i < b; i += INIT_ROUND) {
            const size_t k = b - i < INIT_ROUND ? b - i : INIT_ROUND;
            for (size_t q = 0; q < 2 * k; q++)
                u[q] = zt_rng_uniform(&g);
            for (size_t q = 0; q < k; q++)
                x[i + q] = (float)(std * zt_rng_normal_from(u[2 * q], u[2 * q + 1]));
        }
    }
    zt_rng_jump(r, 2 * (uint64_t)n);
}

/* "[d0, d1, ...]" of a file tensor's shape. */
static void shape_text(const zt_st_tensor *st, char *out, size_t cap)
{
    size_t at = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < st->ndim && at < cap; d++)
        at += (size_t)snprintf(out + at, cap - at, "%s%lld", d ? ", " : "", (long long)st->shape[d]);
    if (at < cap)
        snprintf(out + at, cap - at, "]");
}

int zt__host_check_tensor(const zt_param_info *t, const zt_st_tensor *st, const char *file, zt_err *err)
{
    const int64_t want0 = t->transposed_in_hf ? t->shape[1] : t->shape[0];
    const int64_t want1 = t->transposed_in_hf ? t->shape[0] : t->shape[1];
    if (st->ndim != t->ndim || st->shape[0] != want0 || (t->ndim == 2 && st->shape[1] != want1)) {
        char got[128];
        shape_text(st, got, sizeof got);
        if (t->ndim == 1)
            return zt_fail(err, ZT_EMISMATCH, "%s: tensor '%s' has shape %s, the model config expects [%lld]", file,
                           st->name, got, (long long)want0);
        return zt_fail(err, ZT_EMISMATCH, "%s: tensor '%s' has shape %s, the model config expects [%lld, %lld]", file,
                       st->name, got, (long long)want0, (long long)want1);
    }
    if (!zt_st_dtype_is_f32_readable(st->dtype))
        return zt_fail(err, ZT_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (ztrain imports F32, F16 and BF16)", file,
                       st->name, zt_dtype_name(st->dtype));
    /* the element named is the first in ztrain's layout: the file's element k * rows + o of a transposed tensor
     * is ours o * cols + k, so the whole file is read for the smallest such index */
    const size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    size_t first = SIZE_MAX;
    for (size_t i = 0; i < t->numel; i++) {
        if (isfinite(zt_st_element_f32(st, i)))
            continue;
        if (!t->transposed_in_hf) {
            first = i;
            break;
        }
        const size_t ours = i % rows * cols + i / rows;
        first = ours < first ? ours : first;
    }
    if (first != SIZE_MAX)
        return zt_fail(err, ZT_EFORMAT, "%s: tensor '%s' holds a non-finite value (NaN or infinity) at element %zu",
                       file, st->name, first);
    return 0;
}

void zt__host_convert_tensor(const zt_param_info *t, const zt_st_tensor *st, float *dst)
{
    if (t->transposed_in_hf) {
        const size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1]; /* ours [out, in]; file [in, out] */
        for (size_t k = 0; k < cols; k++)
            for (size_t o = 0; o < rows; o++)
                dst[o * cols + k] = zt_st_element_f32(st, k * rows + o);
    } else if (st->dtype == ZT_DTYPE_F32) {
        memcpy(dst, st->data, t->numel * sizeof(float));
    } else {
        for (size_t i = 0; i < t->numel; i++)
            dst[i] = zt_st_element_f32(st, i);
    }
}
