/* Qwen2 (Hugging Face Qwen2ForCausalLM, model_type "qwen2"): LLaMA with biases on the q, k and v
 * projections, written on the LLaMA family (llama_family.h). What is its own: the biases (three more tensors
 * a layer in the LLaMA table, adjacent, so that they are one packed bias, and the decoder program's
 * ZT__DEC_QKV_B role: the variant's qkv_bias), its attention-window keys and the keys its config.json holds.
 * The defaults of a config that leaves keys out are LLaMA's (zt_llama_config_default), as they were when
 * Qwen2 was a model type of the LLaMA family, so that its configs, fingerprints and checkpoints are
 * unchanged. */
#include <stdbool.h>
#include <string.h>

#include "worker/models/llama_family.h" /* the LLaMA family this one is written on */

/* The attention window: use_sliding_window must be false (ztrain attends to the whole context), so that
 * sliding_window and max_window_layers change nothing; layer_types, where given, are all "full_attention". */
static int read_window(zt_json_reader *r, const cJSON *obj, const zt_llama_config *c, zt_err *err)
{
    (void)c;
    bool sliding = false;
    int rc = zt_json_get_bool(r, "use_sliding_window", &sliding, err);
    if (rc < 0)
        return rc;
    if (sliding)
        return zt_fail(err, ZT_EINVAL_CONFIG, "%s: use_sliding_window is true, but ztrain's attention sees the whole "
                       "context (set it to false)", r->where);
    static const char *const unused[] = {"sliding_window", "max_window_layers"};
    for (int i = 0; i < 2; i++)
        if (cJSON_GetObjectItemCaseSensitive(obj, unused[i]))
            zt_json_accept(r, unused[i]);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(obj, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        bool ok = cJSON_IsArray(types);
        for (const cJSON *t = ok ? types->child : NULL; t && ok; t = t->next)
            ok = cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0;
        if (!ok)
            return zt_fail(err, ZT_EINVAL_CONFIG, "%s: layer_types must all be \"full_attention\" (ztrain's attention "
                           "sees the whole context in every layer)", r->where);
    }
    if (types)
        zt_json_accept(r, "layer_types");
    return 0;
}

/* Qwen2Config's own keys as transformers writes them. */
static void write_keys(const zt_llama_config *c, cJSON *o)
{
    cJSON_AddNumberToObject(o, "max_window_layers", c->num_hidden_layers);
    cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddFalseToObject(o, "use_sliding_window");
}

static const zt__llama_variant qwen2 = {.model_type = "qwen2", .architecture = "Qwen2ForCausalLM",
                                        .family = ZT_LLAMA_FAMILY_QWEN2, .qkv_bias = true, .read = read_window,
                                        .write = write_keys};
static const zt__llama_variant *const variants[] = {&qwen2, NULL};

static void config_default(void *cv, const char *model_type)
{
    (void)model_type;
    zt_llama_config *c = cv;
    zt_llama_config_default(c);
    c->family = ZT_LLAMA_FAMILY_QWEN2;
    c->qkv_bias = true;
}

static int config_from_json(void *c, const cJSON *obj, const char *where, zt_err *err)
{
    return zt__llama_config_read(c, obj, where, variants, err);
}

static int config_save(const void *c, const char *path, zt_err *err)
{
    return zt__llama_config_write(c, path, &qwen2, err);
}

static const char *const model_types[] = {"qwen2", NULL};

const zt_family_def zt__family_qwen2 = {
    .name = "qwen2",
    .model_types = model_types,
    .config_default = config_default,
    .config_from_json = config_from_json,
    .config_save = config_save,
    ZT__LLAMA_SHARED_ENTRIES
};
