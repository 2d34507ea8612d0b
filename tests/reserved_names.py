"""Names that mean something to a C or CUDA compiler: keywords, the standard headers' macros, functions
and types, CUDA built-ins, compiler extensions, and the names polygrad's own renderers emit. Every one
is a plain name (uop/names.py), so a Variable or a kernel may carry it; tests/test_generated_names.py
checks that none of them changes a rendered kernel (issue 28 item 1: `HUGE_VALF` made a Variable a
function pointer the kernel called).
"""

C_KEYWORDS = """
auto break case char const continue default do double else enum extern float for goto if inline int long
register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
_Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert _Thread_local _BitInt
_Decimal32 _Decimal64 _Decimal128 alignas alignof bool constexpr false nullptr static_assert thread_local
true typeof typeof_unqual _Float16 _Float32 _Float64 _Float128 _Float32x _Float64x __bf16 __fp16 __int128
"""
CPP_CUDA_KEYWORDS = """
asm catch class const_cast delete dynamic_cast explicit export friend mutable namespace new noexcept operator
private protected public reinterpret_cast static_cast template this throw try typeid typename using virtual
wchar_t char8_t char16_t char32_t concept requires co_await co_return co_yield decltype and or not xor bitand
bitor compl and_eq or_eq xor_eq not_eq final override import module
"""
GNU_EXTENSIONS = """
__asm__ __asm __attribute__ __attribute __typeof__ __typeof __restrict __restrict__ __inline __inline__
__volatile__ __extension__ __const __signed__ __label__ __alignof__ __builtin_expect __builtin_memcpy
__builtin_convertvector __builtin_nontemporal_store __builtin_trap __builtin_unreachable __builtin_huge_valf
__builtin_inff __builtin_nanf __builtin_ia32_sfence __builtin_ia32_vfmaddps256 __builtin_elementwise_fma
__has_builtin __has_include __has_attribute __declspec __cdecl __stdcall __thread __auto_type __int64
__func__ __FUNCTION__ __PRETTY_FUNCTION__ __FILE__ __LINE__ __COUNTER__ __DATE__ __TIME__ __VA_ARGS__
__VA_OPT__ __STDC__ __STDC_VERSION__ __STDC_HOSTED__ __cplusplus __GNUC__ __clang__ __x86_64__ __i386__
__AVX__ __AVX2__ __AVX512F__ __FMA__ __SSE__ __OPTIMIZE__ __CUDACC__ __CUDA_ARCH__ __NVCC__ __CUDACC_RTC__
defined _Pragma __pragma unix linux i386 main
"""
MATH_H = """
HUGE_VAL HUGE_VALF HUGE_VALL INFINITY NAN FP_NAN FP_INFINITE FP_ZERO FP_SUBNORMAL FP_NORMAL FP_FAST_FMA
FP_FAST_FMAF FP_ILOGB0 FP_ILOGBNAN MATH_ERRNO MATH_ERREXCEPT math_errhandling M_E M_LOG2E M_LOG10E M_LN2
M_LN10 M_PI M_PI_2 M_PI_4 M_1_PI M_2_PI M_2_SQRTPI M_SQRT2 M_SQRT1_2 float_t double_t fpclassify isfinite
isinf isnan isnormal signbit isgreater isless isunordered acos acosf asin asinf atan atanf atan2 atan2f cos
cosf sin sinf tan tanf cosh sinh tanh tanhf exp expf exp2 exp2f expm1 log logf log2 log2f log10 log1p logb
ilogb frexp ldexp modf scalbn cbrt fabs fabsf hypot pow powf sqrt sqrtf erf erfc lgamma tgamma ceil ceilf
floor floorf nearbyint rint lrint round roundf lround trunc truncf fmod fmodf remainder remquo copysign nan
nanf nextafter fdim fmax fmaxf fmin fminf fma fmaf abs div labs exp10 sincos sincosf j0 j1 y0 y1 gamma
"""
STDINT_H = """
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t int_least8_t int_fast8_t int_fast32_t
uint_fast64_t intptr_t uintptr_t intmax_t uintmax_t INT8_MIN INT8_MAX INT16_MAX INT32_MIN INT32_MAX INT64_MIN
INT64_MAX UINT8_MAX UINT16_MAX UINT32_MAX UINT64_MAX INTPTR_MAX UINTPTR_MAX INTMAX_MAX SIZE_MAX PTRDIFF_MAX
PTRDIFF_MIN SIG_ATOMIC_MAX WCHAR_MAX WINT_MAX INT8_C INT32_C INT64_C UINT32_C UINT64_C INTMAX_C
"""
STDDEF_STDBOOL_H = """
size_t ptrdiff_t NULL offsetof max_align_t nullptr_t unreachable __bool_true_false_are_defined
"""
LIMITS_FLOAT_H = """
CHAR_BIT CHAR_MIN CHAR_MAX SCHAR_MIN SCHAR_MAX UCHAR_MAX SHRT_MIN SHRT_MAX USHRT_MAX INT_MIN INT_MAX UINT_MAX
LONG_MIN LONG_MAX ULONG_MAX LLONG_MIN LLONG_MAX ULLONG_MAX MB_LEN_MAX PATH_MAX FLT_MAX FLT_MIN FLT_EPSILON
FLT_DIG FLT_MANT_DIG FLT_RADIX FLT_ROUNDS FLT_EVAL_METHOD FLT_TRUE_MIN FLT_MAX_EXP DBL_MAX DBL_MIN
DBL_EPSILON DBL_DIG DBL_MANT_DIG LDBL_MAX LDBL_EPSILON DECIMAL_DIG
"""
LIBC = """
memcpy memset memmove malloc calloc realloc free printf fprintf sprintf puts exit abort system errno assert
stdin stdout stderr FILE EOF RAND_MAX rand srand qsort strlen strcpy getenv atexit longjmp setjmp jmp_buf
signal raise va_list va_start va_arg va_end complex _Complex_I imaginary I CMPLX
"""
CUDA_NAMES = """
threadIdx blockIdx blockDim gridDim warpSize __syncthreads __syncwarp __threadfence __global__ __device__
__host__ __shared__ __constant__ __managed__ __forceinline__ __noinline__ __launch_bounds__ __grid_constant__
dim3 uint3 float2 float4 int2 int4 char4 double2 make_float4 make_int2 half half2 __half __half2
__nv_bfloat16 __nv_bfloat162 nv_bfloat16 __float2half __half2float __float2half_rn __hadd __hmul __hfma
__hneg __hlt __heq __habs __float2bfloat16 __bfloat162float CUDART_INF_F CUDART_NAN_F CUDART_PI_F __int_as_float
__float_as_int __float_as_uint __uint_as_float __fdividef __expf __logf __sinf __saturatef __fmaf_rn
atomicAdd atomicMax atomicCAS __shfl_sync __shfl_down_sync __ballot_sync __activemask __ldg __popc __clz
clock clock64 printf_s cudaError_t cudaSuccess
"""
POLYGRAD_NAMES = """
pg_kernel pg_kernel_task pg_h2f pg_f2h pg_b2f pg_f2b pg_rh pg_rb pg_v pg_cvt pg_sel pg_vload pg_vstore
pg_bitcast pg_vbitcast pg_f32x8 pg_i32x16 pg_gload_f32x8 pg_fma_f32x8 pg_stream64 pg_stream_fence pg_nt32
PG_LANES PG_BIN PG_CMP v0 v1 v9 data0 data1 gidx0 ridx0 uidx0 idx0 alu0 alu3 val0 acc0 cvec0 bc0 local0
smem0 tid pl b_ u_ i r on m p a c e kernel core_start core_end gidx_x lidx_x ri rj rk row0 col0 lane warp
g t bz ld_a ld_b k0 n0
"""

GROUPS = {"C keywords": C_KEYWORDS, "C++ and CUDA keywords": CPP_CUDA_KEYWORDS, "GNU extensions": GNU_EXTENSIONS,
          "math.h": MATH_H, "stdint.h": STDINT_H, "stddef.h / stdbool.h": STDDEF_STDBOOL_H,
          "limits.h / float.h": LIMITS_FLOAT_H, "libc": LIBC, "CUDA": CUDA_NAMES, "polygrad": POLYGRAD_NAMES}
RESERVED_NAMES = sorted({name for text in GROUPS.values() for name in text.split()})
