/* An int8 GEMM for quantized prompts (issue 30): a probe of a kernel polygrad's C renderer could emit,
 * timed beside the float prompt kernel polygrad renders today by benchmarks/bench_int8gemm.py (which
 * compiles this file with the CPU backend's compiler and flags).
 *
 * The arithmetic is the decode route's (nn/quant.py, _int8_matmul_t): each prompt row's activations
 * rounded to 8 bits per 32-value block (q_x, d_x = max|x| / 127), each block's 32 products q_x * q_w
 * summed exactly in int32, then scaled by d_w * d_x in float32 and summed over blocks.
 *
 * The layout differs from the decode route's. There the 8 int32 lanes of vpdpbusd split one block's 32
 * products (lane l sums 4 of them), so every block of every (prompt row, weight row) pair ends in a float
 * epilogue of 8 lanes (convert, scale, FMA): 3 to 5 vector operations for one vpdpbusd, which costs as
 * much as the float kernel's 4 FMAs for the same 32 products. Here the lanes are 8 weight rows: lane j of
 * vpdpbusd sums 4 products of weight row j with the same 4 activation bytes (broadcast), so a block is
 * 8 vpdpbusd (one per 4 values) into one accumulator and one epilogue serves 8 weight rows.
 *
 * That needs the weights of 8 rows interleaved 4 bytes at a time, which the blocks are not: a panel of
 * 8 * V weight rows is staged (unpacked to int8 once, with its scales) and then serves every prompt row,
 * R prompt rows at a time in registers (R * V accumulators). Q4_0's nibbles are staged as signed values
 * (nibble - 8); vpdpbusd multiplies unsigned by signed bytes, so the activations are stored offset by 128
 * (q_x + 128, in 1..255) and each block's sum starts at -128 * (the sum of its weights), staged per row.
 */
#include <string.h>

typedef float i8g_f32x8 __attribute__((vector_size(32)));
typedef int i8g_i32x8 __attribute__((vector_size(32)));

#ifndef I8G_V
#define I8G_V 2 /* vectors of 8 weight rows in a panel */
#endif
#define I8G_PANEL (8 * I8G_V)
#ifndef I8G_R
#define I8G_R 4 /* prompt rows a tile holds in registers (4 or 8) */
#endif

static inline float i8g_half(const unsigned char* p) {
  unsigned short h = (unsigned short)(p[0] | (p[1] << 8));
  __fp16 f;
  memcpy(&f, &h, 2);
  return (float)f;
}

/* the decode route's rounding (bench_int8dot's i8d_quantize), the 8-bit values stored offset by 128 */
void i8g_round(const float* restrict x, int n, int K, unsigned char* restrict xu, float* restrict dx) {
  for (int blk = 0; blk < n * K / 32; blk++) {
    i8g_f32x8 v[4], m = (i8g_f32x8){0};
    memcpy(v, x + 32 * blk, sizeof(v));
    for (int i = 0; i < 4; i++) m = __builtin_elementwise_max(m, __builtin_elementwise_abs(v[i]));
    float amax = __builtin_reduce_max(m);
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    dx[blk] = d;
    for (int i = 0; i < 4; i++) {
      i8g_i32x8 q = __builtin_convertvector(__builtin_elementwise_roundeven(v[i] * id), i8g_i32x8) + 128;
      for (int l = 0; l < 8; l++) xu[32 * blk + 8 * i + l] = (unsigned char)q[l];
    }
  }
}

typedef signed char i8g_i8x32 __attribute__((vector_size(32)));
typedef unsigned char i8g_u8x16 __attribute__((vector_size(16)));
typedef unsigned char i8g_u8x32 __attribute__((vector_size(32)));
typedef long long i8g_i64x4 __attribute__((vector_size(32)));

/* the 32 weights of a block as int8 in value order (Q4_0: low nibbles, then high, less 8), and their sum */
static inline i8g_i32x8 i8g_unpack(const unsigned char* blk, int q4, int* sum) {
  i8g_u8x32 u;  /* the weights + 128, as unsigned bytes (their sum by psadbw) */
  if (q4) {
    i8g_u8x16 q;
    memcpy(&q, blk + 2, 16);
    i8g_u8x16 lo = q & 15, hi = q >> 4;
    u = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                                20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31) + 120;
  } else {
    memcpy(&u, blk + 2, 32);
    u ^= 128;
  }
  i8g_i64x4 sad = (i8g_i64x4)__builtin_ia32_psadbw256((i8g_u8x32)u, (i8g_u8x32){0});
  *sum = (int)(sad[0] + sad[1] + sad[2] + sad[3]) - 128 * 32;
  return (i8g_i32x8)(u ^ 128);
}

/* r[j] lane t -> out[t] lane j, for 8 vectors of 8 int32 */
static inline void i8g_transpose(i8g_i32x8* r) {
  i8g_i32x8 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 1] = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[k + 2] = __builtin_shufflevector(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 3] = __builtin_shufflevector(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int k = 0; k < 4; k++) {
    r[k] = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4] = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/* rows j0 .. j0 + I8G_PANEL of `blocks` (rows, nb, bytes) into wp (nb, 8, V, 8 rows, 4 values),
 * dw and cs (nb, V, 8 rows): the scales and -128 * the sum of each block's weights */
static void i8g_stage(const unsigned char* blocks, int nb, int bytes, int q4, int j0, signed char* wp, float* dw,
                      int* cs) {
  for (int b = 0; b < nb; b++) {
    for (int v = 0; v < I8G_V; v++) {
      i8g_i32x8 r[8];
      for (int jj = 0; jj < 8; jj++) {
        const unsigned char* blk = blocks + ((long)(j0 + 8 * v + jj) * nb + b) * bytes;
        int sum;
        r[jj] = i8g_unpack(blk, q4, &sum);
        dw[(b * I8G_V + v) * 8 + jj] = i8g_half(blk);
        cs[(b * I8G_V + v) * 8 + jj] = -128 * sum;
      }
      i8g_transpose(r);
      for (int t = 0; t < 8; t++) memcpy(wp + (((long)b * 8 + t) * I8G_V + v) * 32, &r[t], 32);
    }
  }
}

/* y[r][j0 .. j0 + I8G_PANEL] for R prompt rows from r0 (y's row stride `rows`) */
#define I8G_TILE(R)                                                                                           \
  __attribute__((unused)) static void i8g_tile##R(float* y, int rows, const unsigned char* xu, const float* dx, \
                          int nb, const signed char* wp, const float* dw, const int* cs) {                   \
    i8g_f32x8 acc[R][I8G_V];                                                                                 \
    for (int r = 0; r < R; r++)                                                                              \
      for (int v = 0; v < I8G_V; v++) acc[r][v] = (i8g_f32x8){0};                                            \
    for (int b = 0; b < nb; b++) {                                                                           \
      i8g_i32x8 s[R][I8G_V];                                                                                 \
      for (int v = 0; v < I8G_V; v++) {                                                                      \
        i8g_i32x8 c;                                                                                         \
        memcpy(&c, cs + (b * I8G_V + v) * 8, 32);                                                            \
        for (int r = 0; r < R; r++) s[r][v] = c;                                                             \
      }                                                                                                      \
      for (int t = 0; t < 8; t++) {                                                                          \
        i8g_i32x8 w[I8G_V];                                                                                  \
        for (int v = 0; v < I8G_V; v++) memcpy(&w[v], wp + ((b * 8 + t) * I8G_V + v) * 32, 32);             \
        for (int r = 0; r < R; r++) {                                                                        \
          int a;                                                                                             \
          memcpy(&a, xu + (long)r * nb * 32 + b * 32 + 4 * t, 4);                                            \
          i8g_i32x8 av = (i8g_i32x8){0} + a;                                                                 \
          for (int v = 0; v < I8G_V; v++) s[r][v] = __builtin_ia32_vpdpbusd256(s[r][v], av, w[v]);          \
        }                                                                                                    \
      }                                                                                                      \
      for (int r = 0; r < R; r++) {                                                                          \
        float d = dx[r * nb + b];                                                                            \
        for (int v = 0; v < I8G_V; v++) {                                                                    \
          i8g_f32x8 scale;                                                                                   \
          memcpy(&scale, dw + (b * I8G_V + v) * 8, 32);                                                      \
          acc[r][v] += __builtin_convertvector(s[r][v], i8g_f32x8) * (scale * d);                            \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
    for (int r = 0; r < R; r++)                                                                              \
      for (int v = 0; v < I8G_V; v++) memcpy(y + (long)r * rows + v * 8, &acc[r][v], 32);                   \
  }

I8G_TILE(1)
I8G_TILE(4)
I8G_TILE(8)
#define I8G_TILE_R(R) i8g_tile##R
#define I8G_TILE_OF(R) I8G_TILE_R(R)

/* y (n, rows) = x @ W.T from the rounded activations xu, dx and W's blocks (rows, K / 32, bytes); scratch
 * holds a staged panel: K * I8G_PANEL bytes + K / 32 * I8G_PANEL * 8 bytes. 0 where rows is not a
 * multiple of the panel or the CPU lacks VNNI. */
int i8g_gemm(float* y, const unsigned char* xu, const float* dx, const unsigned char* blocks, int n, int rows,
             int K, int q4, void* scratch) {
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
  int nb = K / 32, bytes = q4 ? 18 : 34;
  if (rows % I8G_PANEL) return 0;
  signed char* wp = (signed char*)scratch;
  float* dw = (float*)(wp + (long)K * I8G_PANEL);
  int* cs = (int*)(dw + nb * I8G_PANEL);
  for (int j0 = 0; j0 < rows; j0 += I8G_PANEL) {
    i8g_stage(blocks, nb, bytes, q4, j0, wp, dw, cs);
    int r = 0;
    for (; r + I8G_R <= n; r += I8G_R) I8G_TILE_OF(I8G_R)(y + (long)r * rows + j0, rows, xu + (long)r * K, dx + r * nb, nb, wp, dw, cs);
    for (; r < n; r++) i8g_tile1(y + (long)r * rows + j0, rows, xu + (long)r * K, dx + r * nb, nb, wp, dw, cs);
  }
  return 1;
#else
  return 0;
#endif
}
