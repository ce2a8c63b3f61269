/* GPT-NeoX (Hugging Face GPTNeoXForCausalLM: EleutherAI's Pythia, GPT-NeoX-20B) as a family of the decoder
 * program: LayerNorms with biases, one fused query_key_value projection, rotary embeddings on the first
 * rotary_ndims = int(head_size * rotary_pct) channels of each head, exact GELU (or its tanh form), and by
 * default parallel residuals: out = x + attn(input_layernorm(x)) + mlp(post_attention_layernorm(x)).
 *
 * The host model is worker/models/host_model.h's; its tensor table is Hugging Face's names without the
 * "gpt_neox." prefix (embed_in.weight, layers.0.input_layernorm.weight, ..., final_layer_norm.bias) and
 * embed_out.weight (an untied head). In the slab, query_key_value's rows are all q heads | all k heads |
 * all v heads (the layout of the attention kernels); Hugging Face's files interleave them per head (head
 * h's q, k, v rows follow each other), which import and export convert. */
#ifndef ZT_WORKER_MODELS_NEOX_H
#define ZT_WORKER_MODELS_NEOX_H

#include <stdbool.h>

/* hidden_act values ztrain computes; saved in configs: only grows. */
enum zt_neox_act {
    ZT_NEOX_ACT_GELU = 0,      /* "gelu": x Phi(x) with erf */
    ZT_NEOX_ACT_GELU_NEW = 1,  /* "gelu_new": the tanh form */
    ZT_NEOX_ACT_GELU_FAST = 2, /* "gelu_fast": the tanh form, written differently */
};

typedef struct zt_neox_config {
    int num_hidden_layers;       /* L */
    int hidden_size;             /* C */
    int num_attention_heads;     /* NH; head size HS = C / NH */
    int intermediate_size;       /* F */
    int max_position_embeddings;
    int vocab_size;              /* V */
    float layer_norm_eps;
    enum zt_neox_act hidden_act;
    bool use_parallel_residual;
    bool attention_bias;         /* query_key_value and dense have biases */
    bool tie_word_embeddings;    /* the head reads embed_in; no embed_out */
    double rotary_pct;           /* partial_rotary_factor: rotated share of a head's channels */
    double rotary_emb_base;      /* rope_theta */
    double initializer_range;
    int bos_token_id, eos_token_id; /* -1: null */
} zt_neox_config;

/* The rotated channels of a head: int(HS * rotary_pct), as transformers computes them. */
int zt_neox_config_rotary_ndims(const zt_neox_config *c);

#endif
