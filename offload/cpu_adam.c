/* CPU AdamW (offload/cpu_adam.h); implementation follows. */
