/* Element helpers shared by the CPU and CUDA kernels (inlined into both preludes; EVO_FN is `static inline` in C
 * and `__device__ __forceinline__` in CUDA). evo_expf is each prelude's own, defined before these. */

/* Clip/Relu/Sign as onnxruntime's kernels compute them (Sign(NaN) is NaN) (std::min / std::max argument order: a NaN bound is
 * ignored, a NaN value kept); Min/Max (nmin/nmax) propagate a NaN from either side, as onnxruntime's do. */
#define EVO_ORDERED(T, S)                                                                  \
    EVO_FN T evo_min_##S(T a, T b) { return b < a ? b : a; }                               \
    EVO_FN T evo_max_##S(T a, T b) { return a < b ? b : a; }                               \
    EVO_FN T evo_nmin_##S(T a, T b) { return a != a ? a : (b < a || b != b) ? b : a; }    \
    EVO_FN T evo_nmax_##S(T a, T b) { return a != a ? a : (a < b || b != b) ? b : a; }
/* Relu and Sign of a signed type, and of an unsigned one (no value below 0: no comparison that is always false) */
#define EVO_SIGNED(T, S)                                                                   \
    EVO_ORDERED(T, S)                                                                      \
    EVO_FN T evo_relu_##S(T x) { return x < (T)0 ? (T)0 : x; }                            \
    EVO_FN T evo_sign_##S(T x) { return x != x ? x : (T)((x > (T)0) - (x < (T)0)); }
#define EVO_UNSIGNED(T, S)                                                                 \
    EVO_ORDERED(T, S)                                                                      \
    EVO_FN T evo_relu_##S(T x) { return x; }                                               \
    EVO_FN T evo_sign_##S(T x) { return (T)(x > (T)0); }
EVO_SIGNED(float, f32)
EVO_SIGNED(double, f64)
EVO_SIGNED(int64_t, i64)
EVO_SIGNED(int32_t, i32)
EVO_SIGNED(int16_t, i16)
EVO_SIGNED(int8_t, i8)
EVO_UNSIGNED(uint8_t, u8)
EVO_UNSIGNED(uint16_t, u16)
EVO_UNSIGNED(uint32_t, u32)
EVO_UNSIGNED(uint64_t, u64)

/* +0.0 as an expression operand (cprint.print_expr prints it so, never as a literal). gcc 12 folds `0.0f - X` into
 * `-X` whenever it knows X is not -0.0: an int-to-float conversion, fabs, a literal. The condition is the wrong
 * way round (it needs X not +0.0), so Sub(0, Cast(int 0)) gave -0.0 where onnxruntime gives +0.0, and
 * `-X + 0.0f` goes the same way. A call is no literal to that fold, and once inlined the operand is a temporary,
 * which the fold never matches (tests/test_check.py). */
EVO_FN float evo_pzero_f32(void) { return 0.0f; }
EVO_FN double evo_pzero_f64(void) { return 0.0; }

EVO_FN float evo_abs_f32(float x) { return fabsf(x); }
EVO_FN double evo_abs_f64(double x) { return fabs(x); }
#ifdef __CUDACC__
/* onnxruntime's CUDA Sigmoid (its OP_Sigmoid, every float type): 1 / (1 + e) above 0, 1 - 1 / (1 + e) at and below,
 * e = exp(-|x|); 0 from x = -16.6 on in float, where 1 / (1 + exp(-x)) is still 6e-8 (a Log after it: -inf
 * against -16.6). The float64 form below is the same. */
EVO_FN float evo_sigmoid_f32(float x) {
    const float e = evo_expf(-fabsf(x));
    return x > 0.0f ? 1.0f / (1.0f + e) : 1.0f - 1.0f / (1.0f + e);
}
#else
/* onnxruntime's CPU Sigmoid (and QuickGelu) is MLAS's logistic kernel: Eigen's rational approximation on x clamped
 * to [-18, 18], evaluated with fused multiply-adds (its FMA3 kernel on x86-64 with AVX2), the result floored at 0.
 * The fmaf is exact: one vfmadd in the x86-64-v3 clone of a task function (prelude.c), vectorised 8 wide, about as
 * fast as MLAS; libm's correctly rounded fmaf elsewhere (a baseline machine, code outside task functions).
 * Bit-identical to onnxruntime 1.31 (tests/security/test_special_values.py). An fma emulated in double instead
 * (exact product, sum rounded twice) also matched, but ran 10x slower than MLAS on 2.1 M elements (SSE2 doubles
 * in the AVX2 clone too: 13.7 ms against onnxruntime's 1.3 ms; 1.6 ms with the instruction).
 * Sigmoid stays an inexact op for the check. A NaN x stays NaN, as through maxps/minps in MLAS. */
#define EVO_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
EVO_FN float evo_sigmoid_f32(float x) {
    /* x clamped to [-18, 18] as |x| clamped to 18 with x's sign: the same value for every x, -0.0 and NaN
     * included (NaN stays NaN), and one select where two made gcc 12 merge their masks with the final floor's
     * into a dozen blend and mask instructions: 1.95 -> 1.50 ms on 4.6 M floats, 8 wide, against MLAS's 1.3 */
    float t = __builtin_fabsf(x);
    t = t > 18.0f ? 18.0f : t;
    const float v = __builtin_copysignf(t, x);
    const float s = v * v;
    float p = EVO_FMAF(s, 4.37031012579801e-11f, 1.15627324459942e-07f);
    p = EVO_FMAF(p, s, 6.08574864600143e-05f);
    p = EVO_FMAF(p, s, 8.51377133304701e-03f);
    p = EVO_FMAF(p, s, 2.48287947061529e-01f);
    p = p * v;
    float q = EVO_FMAF(s, 6.10247389755681e-13f, 5.76102136993427e-09f);
    q = EVO_FMAF(q, s, 6.29106785017040e-06f);
    q = EVO_FMAF(q, s, 1.70198817374094e-03f);
    q = EVO_FMAF(q, s, 1.16817656904453e-01f);
    q = EVO_FMAF(q, s, 9.93151921023180e-01f);
    const float r = p / q + 0.5f;
    return 0.0f > r ? 0.0f : r;
}
#endif
#ifdef __CUDACC__
EVO_FN float evo_erf_f32(float x) { return erff(x); }
EVO_FN float evo_tanh_f32(float x) { return tanhf(x); }
#else
/* onnxruntime's CPU Tanh is MLAS's tanh kernel: Eigen's rational approximation, x clamped to [-9, 9] (NaN stays
 * NaN: MLAS puts x second in maxps/minps), an odd degree-13 numerator over a degree-6 denominator in x^2, with
 * fused multiply-adds. Bit-identical to onnxruntime 1.31 on 18 M floats, specials included (MLAS's newer
 * degree-5 rational with its bound at 5 is not what 1.31 runs: 99 % of those differed), where libm's tanhf is
 * scalar. */
EVO_FN float evo_tanh_f32(float x) {
    float v = -9.0f > x ? -9.0f : x;
    v = 9.0f < v ? 9.0f : v;
    const float s = v * v;
    float p = EVO_FMAF(s, -2.76076847742355e-16f, 2.00018790482477e-13f);
    p = EVO_FMAF(p, s, -8.60467152213735e-11f);
    p = EVO_FMAF(p, s, 5.12229709037114e-08f);
    p = EVO_FMAF(p, s, 1.48572235717979e-05f);
    p = EVO_FMAF(p, s, 6.37261928875436e-04f);
    p = EVO_FMAF(p, s, 4.89352455891786e-03f);
    float q = EVO_FMAF(s, 1.19825839466702e-06f, 1.18534705686654e-04f);
    q = EVO_FMAF(q, s, 2.26843463243900e-03f);
    q = EVO_FMAF(q, s, 4.89352518554385e-03f);
    return p * v / q;
}
/* onnxruntime's CPU Erf is MLAS's erf kernel (its FMA3 kernel on x86-64 with AVX2): |x| clamped to 3.925 (NaN
 * stays NaN), below 0.921875 an odd polynomial in |x|, above it 1 - exp(-q(|x|)) with MLAS's own exp (a
 * Cody-Waite reduction by ln 2 and a degree-6 polynomial, scaled by 2^n through the exponent bits), the sign of x
 * put back. The same steps with exact fmaf: bit-identical to onnxruntime 1.31 on 18 M floats, specials included
 * (tests/security/test_special_values.py), where libm's erff is 1 ulp off for a sixth of floats, and scalar
 * (YOLOS's GELU kernels ran at 3x onnxruntime's five nodes). Both branches are computed and merged by bit masks,
 * as MLAS does, so gcc vectorises it: 0.8 ms on 864 K floats against MLAS's 0.45 (1.0 ms with selects, 5 ms with
 * erff). The big branch sees 0 below the split and gives exactly +0 there. MLAS clamps -q at -88.38 before its
 * exp; -q is at least -16 for |x| <= 3.925, so that clamp changes nothing and is left out. Erf stays an inexact
 * op for the check. */
EVO_FN float evo_erf_f32(float x) {
    uint32_t ux, bits;
    __builtin_memcpy(&ux, &x, sizeof ux);
    bits = ux & 0x7fffffffu;
    float ax, b, scale;
    __builtin_memcpy(&ax, &bits, sizeof ax);
    const float a = 3.925f < ax ? 3.925f : ax;
    const float s = a * a;
    float p = EVO_FMAF(-5.99104969e-4f, s, 4.99339588e-3f);
    p = EVO_FMAF(p, s, -2.67667342e-2f);
    p = EVO_FMAF(p, s, 1.12818025e-1f);
    p = EVO_FMAF(p, s, -3.76124859e-1f);
    p = EVO_FMAF(p, s, 1.28379151e-1f);
    p = EVO_FMAF(p, a, a);
    const uint32_t big = 0u - (uint32_t)(0.921875f <= a); /* all ones above the split */
    __builtin_memcpy(&bits, &a, sizeof bits);
    bits &= big;
    __builtin_memcpy(&b, &bits, sizeof b);
    float q = EVO_FMAF(1.72948930e-5f, b, -3.83208680e-4f);
    q = EVO_FMAF(q, b, 3.88393435e-3f);
    q = EVO_FMAF(q, b, -2.42545605e-2f);
    q = EVO_FMAF(q, b, 1.06777847e-1f);
    q = EVO_FMAF(q, b, 6.34846687e-1f);
    q = EVO_FMAF(q, b, 1.28717512e-1f);
    q = -EVO_FMAF(q, b, b);
    const float n = EVO_FMAF(1.44269504088896341f, q, 12582912.0f) - 12582912.0f; /* round(q / ln 2) */
    float f = EVO_FMAF(n, -6.93145752e-1f, q);
    f = EVO_FMAF(n, -1.42860677e-6f, f);
    float e = EVO_FMAF(1.38319808e-3f, f, 8.37550033e-3f);
    e = EVO_FMAF(e, f, 4.16689515e-2f);
    e = EVO_FMAF(e, f, 1.66664466e-1f);
    e = EVO_FMAF(e, f, 4.99999851e-1f);
    e = EVO_FMAF(e, f, 1.0f);
    e = EVO_FMAF(e, f, 1.0f);
    bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n */
    __builtin_memcpy(&scale, &bits, sizeof scale);
    const float y = 1.0f - e * scale;
    uint32_t yb, pb;
    __builtin_memcpy(&yb, &y, sizeof yb);
    __builtin_memcpy(&pb, &p, sizeof pb);
    bits = (yb & big) | (pb & ~big) | (ux & 0x80000000u);
    float r;
    __builtin_memcpy(&r, &bits, sizeof r);
    return r;
}
#endif
/* onnxruntime's float64 Sigmoid (Eigen's select on the CPU, the same form in its CUDA OP_Sigmoid): 1 / (1 + e) for
 * x >= 0 and 1 - 1 / (1 + e) below, e = exp(-|x|). Below 0 its absolute error is an ulp of 1, and it is 0 from
 * x = -36.74 on; 1 / (1 + exp(-x)) gave 1e-285 at x = -656, where onnxruntime gives 0 and a Log after it -inf (fuzz
 * case 2699 of the long run on 6acdaa3). The form, not exp's last bit, which libm and Eigen may round apart. NaN
 * stays NaN. */
EVO_FN double evo_sigmoid_f64(double x) {
    const double e = exp(-fabs(x));
    return x >= 0.0 ? 1.0 / (1.0 + e) : 1.0 - 1.0 / (1.0 + e);
}
#ifdef __CUDACC__
EVO_FN float evo_softplus_f32(float x) { return x > 0.0f ? x + log1pf(evo_expf(-x)) : log1pf(evo_expf(x)); }
#else
/* onnxruntime's Softplus: x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)), scalar (12.4 ms on 819 K floats at 1
 * thread, twice a 3x3 convolution of them). Here log1p(y), y = exp(-|x|) in (0, 1], is Goldberg's
 * log(1 + y) * (y / ((1 + y) - 1)), or y itself where 1 + y rounds to 1: within a few ulp, through evo_expf and
 * evo_logf, which vectorise (libm's log1pf kept the loop scalar). +-inf give +inf and 0, NaN stays NaN
 * (tests/kernels/test_vector_math.py). */
EVO_FN float evo_softplus_f32(float x) {
    const float y = evo_expf(-__builtin_fabsf(x));
    const float u = 1.0f + y;
    const float d = u - 1.0f;
    const float l = d == 0.0f ? y : evo_logf(u) * (y / d);
    return x > 0.0f ? x + l : l;
}
#endif
/* Mish, x * tanh(softplus(x)) (lower_math._mish): tanh(log(1 + e)) = ((1 + e)^2 - 1) / ((1 + e)^2 + 1) = n / (n + 2)
 * with e = exp(x), n = e (e + 2): one exp and one division, where Softplus, Tanh and Mul take an exp, a log, a
 * rational tanh and three divisions. Above x = 20, n / (n + 2) rounds to 1 (and e (e + 2) would overflow from
 * x = 44): exp's argument stops there, NaN passing through. Below e = 2^-64, softplus(x) is e, and onnxruntime's
 * tanh of it (evo_tanh_f32's steps, x^2 then 0) is p0 e / q0, rounded twice, which is 0 from x = -98.7 on while e
 * is not: the same steps here, so that Mish is -0 where onnxruntime's is (a Log after it gives -inf, not NaN).
 * -inf gives NaN (-inf * 0) and +inf gives +inf, as the three ops do; within 4 ulp of float64 elsewhere
 * (tests/kernels/test_vector_math.py). */
EVO_FN float evo_mish_f32(float x) {
    const float e = evo_expf(x > 20.0f ? 20.0f : x);
    const float n = e * (e + 2.0f);
    const float t = e < 0x1p-64f ? e * 4.89352455891786e-03f / 4.89352518554385e-03f : n / (n + 2.0f);
    return x * t;
}
/* onnxruntime's double Softplus is log(exp(x) + 1): inf above x = 709.78, where the float one stays finite */
EVO_FN double evo_softplus_f64(double x) { return log(exp(x) + 1.0); }

/* Integer division and remainder: truncating like C, wrapping on MIN/-1, and 0 instead of a trap on /0. A divisor
 * that may be 0 goes through evo_nz_*, which records a zero in the task's flag: the CPU kernel then fails the Run,
 * as onnxruntime's CPU Div and Mod do ("Integer division by zero"); on CUDA the flag is ignored, as onnxruntime's
 * CUDA kernels return a value there. */
#define EVO_SIGNED_DIV(T, U, S)                                                            \
    EVO_FN T evo_abs_##S(T x) { return x < 0 ? (T)(0 - (U)x) : x; }                       \
    EVO_FN T evo_nz_##S(T b, int *zero) { *zero |= (b == 0); return b; }                  \
    EVO_FN T evo_div_##S(T a, T b) {                                                       \
        if (b == 0) return 0;                                                              \
        if (b == -1) return (T)(0 - (U)a);                                                 \
        return (T)(a / b);                                                                 \
    }                                                                                      \
    EVO_FN T evo_tmod_##S(T a, T b) { return (b == 0 || b == -1) ? 0 : (T)(a % b); }      \
    EVO_FN T evo_pmod_##S(T a, T b) {                                                      \
        T r = evo_tmod_##S(a, b);                                                          \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;                          \
    }
EVO_SIGNED_DIV(int64_t, uint64_t, i64)
EVO_SIGNED_DIV(int32_t, uint32_t, i32)
EVO_SIGNED_DIV(int16_t, uint16_t, i16)
EVO_SIGNED_DIV(int8_t, uint8_t, i8)
#define EVO_UNSIGNED_DIV(T, S)                                                             \
    EVO_FN T evo_abs_##S(T x) { return x; }                                                \
    EVO_FN T evo_nz_##S(T b, int *zero) { *zero |= (b == 0); return b; }                  \
    EVO_FN T evo_div_##S(T a, T b) { return b == 0 ? 0 : (T)(a / b); }                     \
    EVO_FN T evo_tmod_##S(T a, T b) { return b == 0 ? 0 : (T)(a % b); }                    \
    EVO_FN T evo_pmod_##S(T a, T b) { return evo_tmod_##S(a, b); }
EVO_UNSIGNED_DIV(uint8_t, u8)
EVO_UNSIGNED_DIV(uint16_t, u16)
EVO_UNSIGNED_DIV(uint32_t, u32)
EVO_UNSIGNED_DIV(uint64_t, u64)

/* A Gather's index read at run time (evonnx.expr.Picked), counted from the end where negative. One outside
 * [-d, d) records bit 2 in the task's flag, so the CPU kernel fails the Run as onnxruntime's Gather,
 * GatherElements and GatherND do, and gives position 0, never a read out of range (the kernel checked d >= 1
 * before it reads one). */
EVO_FN int64_t evo_pick(int64_t v, int64_t d, int *bad) {
    const int64_t w = v < 0 ? v + d : v;
    const int ok = (uint64_t)w < (uint64_t)d;
    *bad |= ok ? 0 : 2;
    return ok ? w : 0;
}

/* Float to integer Cast as onnxruntime's kernels do it on their device. On the CPU (x86-64) a static_cast is a
 * cvtt* instruction: NaN and values outside the 32- or 64-bit range give the "integer indefinite" INT_MIN, and the
 * narrower types truncate that 32-bit result (float to uint32/uint64 stays with onnxruntime). C leaves out-of-range conversions
 * undefined (gcc may fold (float)(int64_t)x into truncf), so the range is tested first. On the GPU a conversion
 * saturates (NaN gives 0), which is what onnxruntime's CUDA Cast computes. */
#ifdef __CUDACC__
#define EVO_F2I(T, S, W) EVO_FN T evo_f2##S(double x) { return (T)x; }
#else
#define EVO_F2I(T, S, W) EVO_FN T evo_f2##S(double x) { return (T)evo_f2##W(x); }
EVO_FN int32_t evo_f2i32w(double x) { return (x >= -2147483648.0 && x < 2147483648.0) ? (int32_t)x : INT32_MIN; }
EVO_FN int64_t evo_f2i64w(double x) {
    return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (int64_t)x : INT64_MIN;
}
#endif
EVO_F2I(int64_t, i64, i64w)
EVO_F2I(int32_t, i32, i32w)
EVO_F2I(int16_t, i16, i32w)
EVO_F2I(int8_t, i8, i32w)
EVO_F2I(uint16_t, u16, i32w)
EVO_F2I(uint8_t, u8, i32w)
