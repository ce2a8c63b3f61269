/* RAM and NVMe storage tiers (offload/store.h); implementation follows. */
