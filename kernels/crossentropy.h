/* Fused softmax + cross-entropy over logits [N,V] with integer targets [N].
 * Rows whose target equals ignore_index contribute loss 0 and gradient 0. */
#ifndef ZT_KERNELS_CROSSENTROPY_H
#define ZT_KERNELS_CROSSENTROPY_H

#include <stdint.h>

#include "kernels/real.h"

/* Writes losses[n] = -log softmax(logits[n])[targets[n]] (0 for ignored rows). If dlogits is not NULL,
 * also writes (overwrites) dlogits[n,:] = grad_scale * (softmax(logits[n]) - onehot(targets[n])), where
 * grad_scale is typically 1 / (number of non-ignored rows). dlogits may alias logits. Returns the number
 * of rows that were not ignored. A target outside [0,V) that is not ignore_index is a caller's bug. */
int zt_cpu_crossentropy_forward_backward(zt_real *losses, zt_real *dlogits, const zt_real *logits,
                                         const int32_t *targets, int N, int V, int ignore_index,
                                         float grad_scale);

#endif
