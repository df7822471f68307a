// MOED_ELEMENTWISE marks a function that the CPU loops and the CUDA kernels
// both compile from one body (activation_body.h, router_body.h), so that
// both compute the same bits from the same inputs. `static`: each
// instruction set's file keeps its own copy (one inline definition compiled
// with different flags in two files would break the one-definition rule).
#pragma once

#if defined(__CUDACC__)
#define MOED_ELEMENTWISE static inline __host__ __device__
#else
#define MOED_ELEMENTWISE static inline
#endif
