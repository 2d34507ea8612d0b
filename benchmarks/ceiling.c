/* What this machine can do at best, measured in the same run as the libraries (benchmarks/compare.py's
 * "ceiling" column). Hand-written, so no library's code generation is in the figure:
 *   - pg_stream: the elementwise workload's body, (x*2+1).relu()*x, over n floats, split across `threads`
 *     threads, aligned loads and non-temporal stores: the memory system's ceiling for a read+write pass;
 *   - pg_fma_peak: `threads` threads each running independent 16-lane FMA chains, no memory traffic: the
 *     arithmetic ceiling a matmul approaches (a multiply-add is two FLOPs).
 * Compiled at run time with -O3 -march=native; needs AVX-512F (this machine) or AVX2+FMA. */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define VLOAD _mm512_load_ps
#define VSTREAM _mm512_stream_ps
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VMUL _mm512_mul_ps
#define VMAX _mm512_max_ps
#define VZERO _mm512_setzero_ps
static float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#else
typedef __m256 vec;
#define LANES 8
#define VLOAD _mm256_load_ps
#define VSTREAM _mm256_stream_ps
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VMUL _mm256_mul_ps
#define VMAX _mm256_max_ps
#define VZERO _mm256_setzero_ps
static float vsum(vec v) { float t[8]; _mm256_storeu_ps(t, v); return t[0]+t[1]+t[2]+t[3]+t[4]+t[5]+t[6]+t[7]; }
#endif

typedef struct { const float* x; float* y; size_t lo, hi; long iters; float out; } job;

static void* stream_part(void* p) {
  job* j = (job*)p;
  vec two = VSET1(2.0f), one = VSET1(1.0f), zero = VZERO();
  for (size_t i = j->lo; i < j->hi; i += LANES) {
    vec v = VLOAD(j->x + i);
    VSTREAM(j->y + i, VMUL(VMAX(VFMA(v, two, one), zero), v));
  }
  _mm_sfence();
  return 0;
}

static void* fma_part(void* p) {
  job* j = (job*)p;
  vec a0 = VSET1(0.1f), a1 = VSET1(0.2f), a2 = VSET1(0.3f), a3 = VSET1(0.4f), a4 = VSET1(0.5f), a5 = VSET1(0.6f);
  vec a6 = VSET1(0.7f), a7 = VSET1(0.8f), a8 = VSET1(0.9f), a9 = VSET1(1.0f), a10 = VSET1(1.1f), a11 = VSET1(1.2f);
  vec b = VSET1(0.9999f), c = VSET1(1e-6f);
  for (long k = 0; k < j->iters; k++) {
    a0 = VFMA(a0, b, c); a1 = VFMA(a1, b, c); a2 = VFMA(a2, b, c); a3 = VFMA(a3, b, c);
    a4 = VFMA(a4, b, c); a5 = VFMA(a5, b, c); a6 = VFMA(a6, b, c); a7 = VFMA(a7, b, c);
    a8 = VFMA(a8, b, c); a9 = VFMA(a9, b, c); a10 = VFMA(a10, b, c); a11 = VFMA(a11, b, c);
  }
  j->out = vsum(a0) + vsum(a1) + vsum(a2) + vsum(a3) + vsum(a4) + vsum(a5) + vsum(a6) + vsum(a7) + vsum(a8) +
           vsum(a9) + vsum(a10) + vsum(a11);
  return 0;
}

static void run(void* (*fn)(void*), job* jobs, int threads) {
  pthread_t t[64];
  for (int i = 1; i < threads; i++) pthread_create(&t[i], 0, fn, &jobs[i]);
  fn(&jobs[0]);
  for (int i = 1; i < threads; i++) pthread_join(t[i], 0);
}

/* x and y 64-byte aligned, n a multiple of LANES * threads */
void pg_stream(const float* x, float* y, size_t n, int threads) {
  job jobs[64];
  size_t part = n / (size_t)threads;
  for (int i = 0; i < threads; i++) jobs[i] = (job){x, y, part * (size_t)i, part * (size_t)(i + 1), 0, 0.0f};
  run(stream_part, jobs, threads);
}

/* the FLOPs done: threads * iters * 12 chains * LANES lanes * 2 */
double pg_fma_peak(long iters, int threads) {
  job jobs[64];
  for (int i = 0; i < threads; i++) jobs[i] = (job){0, 0, 0, 0, iters, 0.0f};
  run(fma_part, jobs, threads);
  float keep = 0;
  for (int i = 0; i < threads; i++) keep += jobs[i].out;
  return (double)threads * (double)iters * 12.0 * LANES * 2.0 + (keep == 12345.0f);
}
