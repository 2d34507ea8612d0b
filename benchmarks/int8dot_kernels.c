/* Integer dot-product matrix-vector kernels for Q8_0 and Q4_0 weights (issue 30, item 1): a probe of what
 * polygrad's C renderer would have to emit, timed beside the float kernel polygrad renders today by
 * benchmarks/bench_int8dot.py (which compiles this file into one translation unit with that kernel).
 *
 * The arithmetic: the activation vector is rounded once per matvec to 8 bits per 32-value block
 * (d_x = max|x| / 127, q_x = round-half-even(x / d_x), d_x kept as float32); each block's 32 products
 * q_x * q_w are summed exactly in int32, then scaled once by d_w * d_x in float32 and accumulated per
 * lane; the lanes are summed at the end of the row.
 *
 * Variants (each a plain C function over GCC/clang vector extensions, as the renderer writes kernels):
 *   madd  16 int32 lanes, lane l = products 2l and 2l + 1 (vpmaddwd on sign-extended 16-bit values;
 *         AVX-512BW)
 *   vnni  8 int32 lanes, lane l = products 4l .. 4l + 3 (vpdpbusd on |q_w| and q_x carrying q_w's sign;
 *         AVX-512 VNNI with VL, or AVX-VNNI)
 *   auto  plain scalar loops over each block (what the renderer emits for a reduction without lanes):
 *         clang vectorizes the block's sum with vpmaddwd but reduces it across lanes once per block
 */
#include <math.h>
#include <string.h>

typedef float i8d_f32x16 __attribute__((vector_size(64)));
typedef float i8d_f32x8 __attribute__((vector_size(32)));
typedef int i8d_i32x16 __attribute__((vector_size(64)));
typedef int i8d_i32x8 __attribute__((vector_size(32)));
typedef short i8d_i16x32 __attribute__((vector_size(64)));
typedef signed char i8d_i8x32 __attribute__((vector_size(32)));
typedef char i8d_c8x32 __attribute__((vector_size(32)));
typedef unsigned char i8d_u8x16 __attribute__((vector_size(16)));

static inline float i8d_half(const unsigned char* p) {
  unsigned short h = (unsigned short)(p[0] | (p[1] << 8));
  __fp16 f;
  memcpy(&f, &h, 2);
  return (float)f;
}

/* x (C floats) -> q_x (C int8) and d_x (C / 32 floats) */
void i8d_quantize(const float* restrict x, int C, signed char* restrict xq, float* restrict dx) {
  for (int b = 0; b < C / 32; b++) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    dx[b] = d;
    for (int i = 0; i < 32; i++) xq[32 * b + i] = (signed char)rintf(x[32 * b + i] * id);
  }
}

static inline i8d_i8x32 i8d_q8_0(const unsigned char* q) {
  i8d_i8x32 v;
  memcpy(&v, q, 32);
  return v;
}

static inline i8d_i8x32 i8d_q4_0(const unsigned char* q) {  /* byte i: low nibble weight i, high i + 16 */
  i8d_u8x16 v;
  memcpy(&v, q, 16);
  i8d_u8x16 lo = v & 15, hi = v >> 4;
  i8d_i8x32 w = (i8d_i8x32)__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  return w - 8;
}

#if defined(__AVX512BW__)
#define I8D_HAVE_MADD 1
static inline i8d_i32x16 i8d_dot2(i8d_i8x32 a, i8d_i8x32 b) {
  return (i8d_i32x16)__builtin_ia32_pmaddwd512((i8d_i16x32)__builtin_convertvector(a, i8d_i16x32),
                                               (i8d_i16x32)__builtin_convertvector(b, i8d_i16x32));
}
#endif

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define I8D_HAVE_VNNI 1
static inline i8d_i32x8 i8d_dot4(i8d_i8x32 a, i8d_i8x32 b) {
  i8d_i8x32 sign = b >> 7;
  i8d_c8x32 magnitude = (i8d_c8x32)((b ^ sign) - sign);  /* |b|, read as unsigned (128 for -128) */
  i8d_c8x32 signed_a = (i8d_c8x32)__builtin_ia32_psignb256((i8d_c8x32)a, (i8d_c8x32)b);
  return (i8d_i32x8)__builtin_ia32_vpdpbusd256((i8d_i32x8){0}, (i8d_i32x8)magnitude, (i8d_i32x8)signed_a);
}
#endif

#define I8D_MATVEC(NAME, BLOCK_BYTES, QUANTS, DOT, FLOATS, INTS)                                            \
  int NAME(float* restrict y, const signed char* restrict xq, const float* restrict dx,                    \
           const unsigned char* restrict w, int R, int C) {                                               \
    _Pragma("clang fp contract(fast)") int nb = C / 32;                                                   \
    for (int r = 0; r < R; r++) {                                                                         \
      FLOATS acc = {0};                                                                                   \
      const unsigned char* row = w + (long)r * nb * BLOCK_BYTES;                                          \
      for (int b = 0; b < nb; b++) {                                                                      \
        i8d_i8x32 xv;                                                                                     \
        memcpy(&xv, xq + 32 * b, 32);                                                                     \
        INTS s = DOT(xv, QUANTS(row + BLOCK_BYTES * b + 2));                                              \
        float d = i8d_half(row + BLOCK_BYTES * b) * dx[b];                                                \
        acc = __builtin_convertvector(s, FLOATS) * ((FLOATS){0} + d) + acc;                               \
      }                                                                                                   \
      float t = 0.0f;                                                                                     \
      for (int l = 0; l < (int)(sizeof(FLOATS) / 4); l++) t += acc[l];                                    \
      y[r] = t;                                                                                           \
    }                                                                                                     \
    return 1;                                                                                             \
  }

#define I8D_MISSING(NAME) \
  int NAME(float* y, const signed char* xq, const float* dx, const unsigned char* w, int R, int C) { return 0; }

#ifdef I8D_HAVE_MADD
I8D_MATVEC(i8d_q8_0_madd, 34, i8d_q8_0, i8d_dot2, i8d_f32x16, i8d_i32x16)
I8D_MATVEC(i8d_q4_0_madd, 18, i8d_q4_0, i8d_dot2, i8d_f32x16, i8d_i32x16)
#else
I8D_MISSING(i8d_q8_0_madd)
I8D_MISSING(i8d_q4_0_madd)
#endif
#ifdef I8D_HAVE_VNNI
I8D_MATVEC(i8d_q8_0_vnni, 34, i8d_q8_0, i8d_dot4, i8d_f32x8, i8d_i32x8)
I8D_MATVEC(i8d_q4_0_vnni, 18, i8d_q4_0, i8d_dot4, i8d_f32x8, i8d_i32x8)
#else
I8D_MISSING(i8d_q8_0_vnni)
I8D_MISSING(i8d_q4_0_vnni)
#endif

#define I8D_SCALAR(NAME, BLOCK_BYTES, WEIGHT)                                                               \
  int NAME(float* restrict y, const signed char* restrict xq, const float* restrict dx,                   \
           const unsigned char* restrict w, int R, int C) {                                               \
    int nb = C / 32;                                                                                      \
    for (int r = 0; r < R; r++) {                                                                         \
      float acc = 0.0f;                                                                                   \
      for (int b = 0; b < nb; b++) {                                                                      \
        const unsigned char* q = w + ((long)r * nb + b) * BLOCK_BYTES + 2;                                \
        int s = 0;                                                                                        \
        for (int h = 0; h < 2; h++)                                                                       \
          for (int i = 0; i < 16; i++) s += (int)xq[32 * b + 16 * h + i] * (WEIGHT);                      \
        acc += (float)s * (i8d_half(q - 2) * dx[b]);                                                      \
      }                                                                                                   \
      y[r] = acc;                                                                                         \
    }                                                                                                     \
    return 1;                                                                                             \
  }

I8D_SCALAR(i8d_q8_0_auto, 34, (int)(signed char)q[16 * h + i])
I8D_SCALAR(i8d_q4_0_auto, 18, (((q[i] >> (4 * h)) & 15) - 8))
