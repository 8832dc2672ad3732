/* CPU loops of lightning_adv, called through ctypes (lightning_adv/native.py).

Why C: GAE is a recurrence along each row. In whole-tensor torch operations it takes a
dozen int64/float64 passes (counts, scatters, rescaled cumulative sums); as a loop it is
one pass per row, and the checks and the alignment of the advantage pipeline can ride in
the same pass while the row is in cache. Every function here has a torch twin that
defines its numbers (lightning_adv/kernels.py, alignment.py, normalization.py); the tests
compare the two.

Conventions: tensors are contiguous, row-major [B, T]; a mask is passed with its kind
(MASK_*) and converted row by row into a float buffer, checked to hold only 0 and 1
exactly. Floating-point expressions are written in the order torch evaluates them
(-ffp-contract=off keeps the compiler from fusing them into FMAs), so float32 results
match the torch path to its own rounding; the GAE recurrence runs in float64.

No function allocates more than one or two rows of scratch, none keeps state, none calls
back into Python: ctypes releases the GIL around each call. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Bumped whenever a signature or a meaning below changes: native.py refuses a library
   built from another version (an editable install whose C file changed since the build). */
#define LA_ABI_VERSION 4

enum { MASK_U8 = 0, MASK_I32 = 1, MASK_I64 = 2, MASK_F32 = 3, MASK_F64 = 4, MASK_BOOL = 5 };

enum { KL_NONE = 0, KL_K1 = 1, KL_K2 = 2, KL_K3 = 3 };

/* What the fused pass checks; checks[i] is 1.0 where check i fails. */
enum {
    CHECK_MASKS = 0,            /* some mask rule of SPEC §1 */
    CHECK_LOGP_NOT_FINITE,      /* logprobs: a NaN or inf anywhere */
    CHECK_LOGP_ABOVE,           /* logprobs above the tolerance at a generated token */
    CHECK_VALUES_NOT_FINITE,
    CHECK_REF_NOT_FINITE,
    CHECK_REF_ABOVE,            /* ref_logp above the tolerance where it is read */
    N_CHECKS
};

#define EXPORT __attribute__((visibility("default")))

/* Hot loops get an AVX2 clone next to the baseline one, picked when the library loads
   (GCC's function multi-versioning on x86-64 Linux); elsewhere one portable version. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

#define INLINE static inline __attribute__((always_inline))

EXPORT int64_t la_abi_version(void) { return LA_ABI_VERSION; }

/* ------------------------------------------------------------------------------ masks */

/* One row of a mask into float 0/1; returns nonzero when some entry is not exactly 0 or
   1. Integers convert through int32: only 0 and 1 pass the check, and for them the
   truncation is exact (it keeps the loop vectorizable, int64 -> float is not). */
INLINE int64_t mask_row(const void *mask, int kind, int64_t offset, int64_t n,
                        float *restrict out) {
    int64_t bad = 0;
    switch (kind) {
    case MASK_BOOL: {   /* any nonzero byte is true, as torch reads a bool (never "bad") */
        const uint8_t *restrict s = (const uint8_t *)mask + offset;
        for (int64_t i = 0; i < n; ++i) out[i] = (float)(s[i] != 0);
        break;
    }
    case MASK_U8: {
        const uint8_t *restrict s = (const uint8_t *)mask + offset;
        for (int64_t i = 0; i < n; ++i) { bad |= s[i] & ~1; out[i] = (float)s[i]; }
        break;
    }
    case MASK_I32: {
        const int32_t *restrict s = (const int32_t *)mask + offset;
        for (int64_t i = 0; i < n; ++i) { bad |= s[i] & ~1; out[i] = (float)s[i]; }
        break;
    }
    case MASK_I64: {
        const int64_t *restrict s = (const int64_t *)mask + offset;
        for (int64_t i = 0; i < n; ++i) { bad |= s[i] & ~1LL; out[i] = (float)(int32_t)s[i]; }
        break;
    }
    case MASK_F32: {
        const float *restrict s = (const float *)mask + offset;
        for (int64_t i = 0; i < n; ++i) {
            float x = s[i];
            bad |= (x != 0.0f) & (x != 1.0f);   /* NaN fails both */
            out[i] = x;
        }
        break;
    }
    default: { /* MASK_F64: checked in float64, where 1 + 1e-10 is not 1 */
        const double *restrict s = (const double *)mask + offset;
        for (int64_t i = 0; i < n; ++i) {
            double x = s[i];
            bad |= (x != 0.0) & (x != 1.0);
            out[i] = (float)x;
        }
        break;
    }
    }
    return bad;
}

/* ------------------------------------------------------------------- the recurrence */

/* GAE along one row of float32 inputs: A_t = delta_t + c*A_{t+1} at active steps, the next
   active step's A elsewhere, delta_t = r_t + g*V_next - V_t with V_next the value of the
   next active step (boot after the last), column T-1 never a step. Writes adv and
   ret = adv + v. */
INLINE void gae_row_f32(int64_t T, const float *restrict r, const float *restrict v,
                        const float *restrict m, float boot, float g, double c,
                        float *restrict adv, float *restrict ret) {
    double a = 0.0;
    float next_value = boot;
    adv[T - 1] = 0.0f;
    ret[T - 1] = 0.0f + v[T - 1];
    for (int64_t t = T - 2; t >= 0; --t) {
        if (m[t] != 0.0f) {
            float delta = (r[t] + g * next_value) - v[t];
            a = (double)delta + c * a;
            next_value = v[t];
        }
        float out = (float)a;
        adv[t] = out;
        ret[t] = out + v[t];
    }
}

INLINE void gae_row_f64(int64_t T, const double *restrict r, const double *restrict v,
                        const float *restrict m, double boot, double g, double c,
                        double *restrict adv, double *restrict ret) {
    double a = 0.0, next_value = boot;
    adv[T - 1] = 0.0;
    ret[T - 1] = 0.0 + v[T - 1];
    for (int64_t t = T - 2; t >= 0; --t) {
        if (m[t] != 0.0f) {
            double delta = (r[t] + g * next_value) - v[t];
            a = delta + c * a;
            next_value = v[t];
        }
        adv[t] = a;
        ret[t] = a + v[t];
    }
}

/* compute_token_gae on [B, T] rewards and values, both float32 or both float64 (f64 set;
   the outputs in that dtype too): coef is gamma*lambda (already rounded as the torch
   kernel rounds it), or row_coef[b] per row when row_coef is not NULL. Returns 0, -1 when
   a row buffer cannot be allocated, or 1 + the first row whose mask holds something
   other than 0 and 1. */
HOT EXPORT int64_t la_token_gae(int64_t B, int64_t T, int f64, const void *rewards,
                                const void *values, const void *mask, int mask_kind,
                                const void *bootstrap, double discount, double coef,
                                const double *row_coef, void *adv, void *ret) {
    if (T < 1) return 0;
    float *m = (float *)malloc(sizeof(float) * (size_t)T);
    if (m == NULL) return -1;
    for (int64_t b = 0; b < B; ++b) {
        if (mask_row(mask, mask_kind, b * T, T, m)) { free(m); return 1 + b; }
        const double c = row_coef != NULL ? row_coef[b] : coef;
        const int64_t row = b * T;
        if (f64)
            gae_row_f64(T, (const double *)rewards + row, (const double *)values + row, m,
                        ((const double *)bootstrap)[b], discount, c, (double *)adv + row,
                        (double *)ret + row);
        else
            gae_row_f32(T, (const float *)rewards + row, (const float *)values + row, m,
                        ((const float *)bootstrap)[b], (float)discount, c, (float *)adv + row,
                        (float *)ret + row);
    }
    free(m);
    return 0;
}

/* One row of turn ids as int64 (int32 or int64 input). */
INLINE int64_t turn_id(const void *ids, int ids_i64, int64_t i) {
    return ids_i64 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
}

/* The turns of one row: first active position and reward sum (float64) of each, in order.
   Returns the number of turns, or -1 when an id at an active position is negative, >= T
   or smaller than the one before (kernels.validate_turn_ids names which). */
INLINE int64_t row_turns(int64_t T, const void *ids, int ids_i64, int64_t offset,
                         const float *restrict m, const float *restrict r32,
                         const double *restrict r64, int64_t *restrict first,
                         double *restrict reward) {
    int64_t n = 0, previous = -1;
    for (int64_t t = 0; t < T; ++t) {
        if (m[t] == 0.0f) continue;
        const int64_t id = turn_id(ids, ids_i64, offset + t);
        if (id < 0 || id >= T || id < previous) return -1;
        if (n == 0 || id != previous) {
            first[n] = t;
            reward[n] = 0.0;
            ++n;
            previous = id;
        }
        reward[n - 1] += r64 != NULL ? r64[t] : (double)r32[t];
    }
    return n;
}

/* compute_turn_gae on [B, T] rewards and values, both float32 or both float64 (f64), turn
   ids int32 or int64 (ids_i64): a turn's reward is the sum of its active positions'
   rewards, its value the value at its first active position; GAE runs over each row's
   turns (the last bootstraps), every active position gets its turn's advantage and
   advantage + value as return, inactive positions 0 and their value. coef and row_coef
   as la_token_gae. Returns 0, -1 when the row buffers cannot be allocated, 1 + the first
   row whose mask holds something other than 0 and 1, or -2 - the first row whose turn
   ids break a rule. */
HOT EXPORT int64_t la_turn_gae(int64_t B, int64_t T, int f64, const void *rewards,
                               const void *values, const void *mask, int mask_kind,
                               const void *turn_ids, int ids_i64, const void *bootstrap,
                               double discount, double coef, const double *row_coef,
                               void *adv, void *ret) {
    if (T < 1) return 0;
    float *m = (float *)malloc(sizeof(float) * (size_t)T);
    int64_t *first = (int64_t *)malloc(sizeof(int64_t) * (size_t)T);
    double *reward = (double *)malloc(sizeof(double) * (size_t)T);
    double *turn_adv = (double *)malloc(sizeof(double) * (size_t)T);
    int64_t status = 0;
    if (m == NULL || first == NULL || reward == NULL || turn_adv == NULL) status = -1;
    for (int64_t b = 0; b < B && status == 0; ++b) {
        const int64_t row = b * T;
        if (mask_row(mask, mask_kind, row, T, m)) { status = 1 + b; break; }
        const double c = row_coef != NULL ? row_coef[b] : coef;
        const float *r32 = f64 ? NULL : (const float *)rewards + row;
        const double *r64 = f64 ? (const double *)rewards + row : NULL;
        const int64_t n = row_turns(T, turn_ids, ids_i64, row, m, r32, r64, first, reward);
        if (n < 0) { status = -2 - b; break; }
        /* The recurrence over turns, last first, in the inputs' precision for delta (the
           order of kernels._masked_gae) and float64 for the advantage; turn_adv holds each
           turn's advantage already rounded to the output dtype. */
        double a = 0.0;
        if (f64) {
            const double *v = (const double *)values + row;
            double next_value = ((const double *)bootstrap)[b];
            for (int64_t k = n - 1; k >= 0; --k) {
                const double value = v[first[k]];
                const double delta = (reward[k] + discount * next_value) - value;
                a = delta + c * a;
                turn_adv[k] = a;
                next_value = value;
            }
        } else {
            const float *v = (const float *)values + row;
            const float g = (float)discount;
            float next_value = ((const float *)bootstrap)[b];
            for (int64_t k = n - 1; k >= 0; --k) {
                const float value = v[first[k]];
                const float delta = ((float)reward[k] + g * next_value) - value;
                a = (double)delta + c * a;
                turn_adv[k] = (double)(float)a;
                next_value = value;
            }
        }
        /* Back to positions: turn k runs from first[k] to the next turn's first position. */
        int64_t k = -1;
        for (int64_t t = 0; t < T; ++t) {
            if (k + 1 < n && t == first[k + 1]) ++k;
            const int active = m[t] != 0.0f;
            if (f64) {
                const double *v = (const double *)values + row;
                double *o = (double *)adv + row, *rt = (double *)ret + row;
                o[t] = active ? turn_adv[k] : 0.0;
                rt[t] = active ? turn_adv[k] + v[first[k]] : v[t];
            } else {
                const float *v = (const float *)values + row;
                float *o = (float *)adv + row, *rt = (float *)ret + row;
                o[t] = active ? (float)turn_adv[k] : 0.0f;
                rt[t] = active ? (float)turn_adv[k] + v[first[k]] : v[t];
            }
        }
    }
    free(m);
    free(first);
    free(reward);
    free(turn_adv);
    return status;
}

/* ------------------------------------------------------------------ the fused pass */

INLINE uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* NaN or +-inf: all exponent bits set. An integer test, so the loops stay vectorizable
   (a float sum or max reduction would need -ffast-math's reassociation). */
INLINE uint32_t not_finite(float x) { return (bits_of(x) & 0x7f800000u) == 0x7f800000u; }

INLINE float clamp10(float d) {
    d = d < -10.0f ? -10.0f : d;
    return d > 10.0f ? 10.0f : d;
}

/* The KL penalty -kl_ctl * clamp(k(old, ref), -10, 10) of lightning_adv.rewards.kl_penalty,
   with d = old - ref. */
INLINE float kl_term(float d, int estimator, float minus_kl_ctl) {
    if (estimator == KL_K2) {
        d = (d * d) / 2.0f;
    } else if (estimator == KL_K3) {
        float log_ratio = -d;
        d = (expf(log_ratio) - 1.0f) - log_ratio;
    }
    return clamp10(d) * minus_kl_ctl;
}

/* The fused pass works row by row: the row's masks converted and checked, its alignment
   and KL (vectorized), then its GAE scan, which reads what the alignment wrote while it is
   still in cache. (Interleaving the next row's alignment with this row's scan, to overlap
   the scan's multiply-add latency, measured no faster: the pass is bound by memory
   traffic, 60 or more bytes per position against the bare kernel's 20.) */

/* The value checks, OR-ed over rows (CHECK_LOGP_NOT_FINITE .. CHECK_REF_ABOVE). */
typedef struct {
    uint32_t flags[5];
} ValueChecks;

/* Alignment and KL of position t, which predicts token `next` (alignment.align_batch and
   rewards.kl_penalty), with the value checks: flags OR-ed into the caller's locals. */
#define ALIGN_POSITION(t, next)                                                          \
    do {                                                                                 \
        float m = generated[next];                                                       \
        float x = lp[next];                                                              \
        float old = x * m;                                                               \
        lp_bad |= not_finite(x);                                                         \
        lp_above |= (m != 0.0f) & (x > tolerance); /* logprobs at generated tokens */    \
        v_bad |= not_finite(v[t]);                                                       \
        float d = old;                                                                   \
        if (has_ref) {                                                                   \
            float y = rf[t];                                                             \
            float ref = y * m;                                                           \
            rf_bad |= not_finite(y);                                                     \
            rf_above |= (m != 0.0f) & (y > tolerance); /* ref_logp where it is read */   \
            ref_o[t] = ref;                                                              \
            d = old - ref;                                                               \
        }                                                                                \
        mask_o[t] = m;                                                                   \
        old_o[t] = old;                                                                  \
        if (estimator != KL_NONE) {                                                      \
            float k = kl_term(d, estimator, minus_kl_ctl);                               \
            kl_o[t] = k;                                                                 \
            total_o[t] = k + 0.0f;                                                       \
        } else {                                                                         \
            total_o[t] = 0.0f;                                                           \
        }                                                                                \
    } while (0)

/* One row's alignment, KL and value checks; position t predicts token t+1 and the last
   column wraps to token 0, as torch.roll does. has_ref and estimator are constants at
   each call site, so each combination compiles to its own branch-free vectorized loop
   (restrict is honoured on parameters: the row pointers come in as such). */
INLINE void align_row(int64_t T, const int has_ref, const int estimator,
                      const float *restrict generated, const float *restrict lp,
                      const float *restrict rf, const float *restrict v, float tolerance,
                      float minus_kl_ctl, float *restrict mask_o, float *restrict old_o,
                      float *restrict ref_o, float *restrict kl_o, float *restrict total_o,
                      ValueChecks *checks) {
    uint32_t lp_bad = 0, lp_above = 0, v_bad = 0, rf_bad = 0, rf_above = 0;
    for (int64_t t = 0; t < T - 1; ++t) ALIGN_POSITION(t, t + 1);
    ALIGN_POSITION(T - 1, 0);
    checks->flags[0] |= lp_bad;
    checks->flags[1] |= lp_above;
    checks->flags[2] |= v_bad;
    checks->flags[3] |= rf_bad;
    checks->flags[4] |= rf_above;
}

/* The mask rules of SPEC §1 on one row given as float 0/1 (mask_row checked the 0/1):
   right-padded attention, generated tokens attended, column 0 not generated
   (batch_checks._explain_mask_error names whichever failed). Returns nonzero on a
   failure; *attended is the row's attended count. */
INLINE int64_t check_mask_row(int64_t T, const float *restrict att,
                              const float *restrict generated, int64_t *attended) {
    int64_t count = 0, gaps = 0, outside = 0;
    for (int64_t t = 0; t < T; ++t) {
        count += att[t] != 0.0f;
        outside |= generated[t] > att[t];
    }
    for (int64_t t = 1; t < T; ++t) gaps |= att[t] > att[t - 1];
    *attended = count;
    return gaps | outside | (generated[0] != 0.0f);
}

typedef struct {
    int64_t B, T;
    const void *attention, *loss;
    int attention_kind, loss_kind;
    const float *logprobs, *ref_logp, *values, *scores;
    const uint8_t *truncated_in;
    int zero_truncated_scores;
    float g, minus_kl_ctl, tolerance;
    double coef;
    float *mask_out, *old_out, *ref_out, *kl_out, *total_out, *adv_out, *ret_out;
    int64_t *seqlens;
    uint8_t *truncated_out, *dropped_out;
    float *bootstrap_out;
} Pipeline;

/* Every row; returns nonzero when some mask rule fails. */
INLINE int64_t pipeline_rows(const Pipeline *q, float *att, float *generated, const int has_ref,
                             const int estimator, ValueChecks *checks) {
    const int64_t T = q->T;
    int64_t masks_bad = 0;
    for (int64_t b = 0; b < q->B; ++b) {
        const int64_t row = b * T;
        const float *v = q->values + row;
        float *mask_o = q->mask_out + row, *total_o = q->total_out + row;
        float *kl_o = q->kl_out != NULL ? q->kl_out + row : NULL;
        masks_bad |= mask_row(q->attention, q->attention_kind, row, T, att);
        masks_bad |= mask_row(q->loss, q->loss_kind, row, T, generated);
        int64_t attended;
        masks_bad |= check_mask_row(T, att, generated, &attended);
        align_row(T, has_ref, estimator, generated, q->logprobs + row,
                  has_ref ? q->ref_logp + row : NULL, v, q->tolerance, q->minus_kl_ctl, mask_o,
                  q->old_out + row, has_ref ? q->ref_out + row : NULL, kl_o, total_o, checks);

        /* The outcome score at the position predicting the last token
           (alignment.place_outcome), and the bootstrap value. */
        const int64_t seqlen = attended;
        q->seqlens[b] = seqlen;
        const int truncated = q->truncated_in != NULL ? q->truncated_in[b] != 0 : seqlen == T;
        q->truncated_out[b] = (uint8_t)truncated;
        const int64_t position = seqlen - 2 < 0 ? 0 : seqlen - 2;
        const int zeroed = q->zero_truncated_scores && truncated;
        const float score = zeroed ? 0.0f : q->scores[b];
        total_o[position] = (kl_o != NULL ? kl_o[position] : 0.0f) + score;
        q->dropped_out[b] = (uint8_t)(mask_o[position] == 0.0f && !zeroed);
        const int64_t last_valid = seqlen - 1 < 0 ? 0 : seqlen - 1;
        q->bootstrap_out[b] = v[last_valid];   /* as align_batch: before truncation */
        const float boot = v[last_valid] * (float)truncated;

        gae_row_f32(T, total_o, v, mask_o, boot, q->g, q->coef, q->adv_out + row,
                    q->ret_out + row);
    }
    return masks_bad;
}

/* Steps 4-8 of the default pipeline for a built-in token GAE, with the value checks of
   the batch, in one pass over the rows (lightning_adv/fused.py is the caller; the torch
   steps it stands for are alignment.align_batch, rewards.kl_penalty,
   alignment.place_outcome and stages.estimators.token_gae with kernels.compute_token_gae).

   Inputs: the attention and loss masks (token-aligned, any MASK_* kind), token-aligned
   float32 logprobs, next-token-aligned float32 ref_logp (or NULL: the KL is taken against
   0, and ref_out is not written) and values, the [B] float32 outcome scores after reward
   normalization, and an explicit [B] is_truncated (or NULL: seqlen == T).
   Outputs [B, T] float32: the aligned loss mask, the aligned masked old log-probs, the
   masked ref_logp, the KL rewards (not written with KL_NONE: the caller passes zeros),
   the total rewards (KL + outcome), advantages and returns. [B]: seqlens, is_truncated,
   dropped (the outcome landed on an inactive position) and the bootstrap values.
   checks[N_CHECKS]: 1.0 where a check fails. When the masks fail, the other outputs are
   meaningless (but every write stays in bounds). Returns 0, or -1 when the row buffers
   cannot be allocated. */
HOT EXPORT int64_t la_token_pipeline(
    int64_t B, int64_t T, const void *attention, int attention_kind, const void *loss,
    int loss_kind, const float *logprobs, const float *ref_logp, const float *values,
    const float *scores, const uint8_t *truncated_in, int zero_truncated_scores,
    double discount, double coef, double kl_ctl, int kl_estimator, double tolerance,
    float *mask_out, float *old_out, float *ref_out, float *kl_out, float *total_out,
    float *adv_out, float *ret_out, int64_t *seqlens, uint8_t *truncated_out,
    uint8_t *dropped_out, float *bootstrap_out, double *checks) {
    if (T < 1) return -1;
    float *rows = (float *)malloc(sizeof(float) * (size_t)(2 * T));
    if (rows == NULL) return -1;
    const Pipeline q = {B, T, attention, loss, attention_kind, loss_kind, logprobs, ref_logp,
                        values, scores, truncated_in, zero_truncated_scores, (float)discount,
                        (float)(-kl_ctl), (float)tolerance, coef, mask_out, old_out, ref_out,
                        kl_out, total_out, adv_out, ret_out, seqlens, truncated_out,
                        dropped_out, bootstrap_out};
    ValueChecks value_checks = {{0, 0, 0, 0, 0}};
    float *att = rows, *generated = rows + T;
    int64_t masks_bad;
    /* one instance of the row loop per (ref_logp given, KL estimator) */
    if (ref_logp != NULL) {
        switch (kl_estimator) {
        case KL_K1: masks_bad = pipeline_rows(&q, att, generated, 1, KL_K1, &value_checks); break;
        case KL_K2: masks_bad = pipeline_rows(&q, att, generated, 1, KL_K2, &value_checks); break;
        case KL_K3: masks_bad = pipeline_rows(&q, att, generated, 1, KL_K3, &value_checks); break;
        default: masks_bad = pipeline_rows(&q, att, generated, 1, KL_NONE, &value_checks); break;
        }
    } else {
        switch (kl_estimator) {
        case KL_K1: masks_bad = pipeline_rows(&q, att, generated, 0, KL_K1, &value_checks); break;
        case KL_K2: masks_bad = pipeline_rows(&q, att, generated, 0, KL_K2, &value_checks); break;
        case KL_K3: masks_bad = pipeline_rows(&q, att, generated, 0, KL_K3, &value_checks); break;
        default: masks_bad = pipeline_rows(&q, att, generated, 0, KL_NONE, &value_checks); break;
        }
    }
    free(rows);
    checks[CHECK_MASKS] = masks_bad != 0;
    for (int i = 0; i < 5; ++i) checks[CHECK_LOGP_NOT_FINITE + i] = value_checks.flags[i] != 0;
    return 0;
}

/* ----------------------------------------------------------------- normalization */

/* Per row: the count of positions where mask is 1 and the sums of d = x - shift and of
   d*d there (float64), for masked means and variances combined over rows, groups and
   ranks without a second pass. One shift for the batch (the first masked value, written
   to *shift) keeps the sums small where x is far from 0; the caller combines them as
   mean = shift + S1/n, squared deviations S2 - S1*S1/n. */
HOT EXPORT void la_masked_moments(int64_t B, int64_t T, const float *x, const float *mask,
                                  double *shift, double *moments) {
    const int64_t n_all = B * T;
    int64_t first = 0;
    while (first < n_all && mask[first] == 0.0f) ++first;
    const double c = first < n_all ? (double)x[first] : 0.0;
    *shift = c;
    for (int64_t b = 0; b < B; ++b) {
        const float *restrict xr = x + b * T;
        const float *restrict mr = mask + b * T;
        double n = 0.0, s1 = 0.0, s2 = 0.0;
        for (int64_t t = 0; t < T; ++t) {
            double w = (double)mr[t];
            double d = ((double)xr[t] - c) * w;
            n += w;
            s1 += d;
            s2 += d * d;
        }
        double *out = moments + 3 * b;
        out[0] = n;
        out[1] = s1;
        out[2] = s2;
    }
}

/* out = (x*m - shift_b*m) / scale_b, the float32 operations of
   normalization._normalize_tokens. */
HOT EXPORT void la_masked_affine(int64_t B, int64_t T, const float *x, const float *mask,
                                 const float *shift, const float *scale, float *out) {
    for (int64_t b = 0; b < B; ++b) {
        const float *restrict xr = x + b * T;
        const float *restrict mr = mask + b * T;
        float *restrict o = out + b * T;
        const float c = shift[b], s = scale[b];
        for (int64_t t = 0; t < T; ++t) o[t] = (xr[t] * mr[t] - c * mr[t]) / s;
    }
}

/* ------------------------------------------------------------ the module, for import */

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "CPU loops of lightning_adv; called through ctypes by lightning_adv.native.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
