// One-weight-pass int4 linear for the CPU: y[M, N] = x[M, K] @ W^T, W = lo + q * scale per 32 inputs.
//
// Built at first use by kernels/cpu_lowbit.py (torch.utils.cpp_extension.load); its docstring says why
// and what each path is. Every path reads a tile of the 4-bit weight (16 output channels x 32
// inputs: one group) once and uses it for every row of x, so 1..32 rows cost one pass over the
// weights plus the rows' multiply-adds. The tile is not dequantised: its 4-bit values q become the
// bf16 numbers 128 + q by one OR (bf16 holds 128..255 exactly: bits 0x4300 | q), the rows are
// multiplied by those, and each group's sums are then scaled per channel:
//   sum_k x_k (lo + q_k s) = s * sum_k x_k (128 + q_k) + (lo - 128 s) * sum_k x_k,
// with sum_k x_k (the row's group sum) computed once per call. A row's arithmetic is the same
// sequence whatever rows share the call (batch invariance): rows never mix, the group order is
// fixed, and the row count only sets how many rows a tile holds.
//
// Packed layout (kernels/cpu_lowbit.py `pack_int4`): records uint8 [N/64, K/32, 4, 320], record
// (super-block s, group g, block j) for the tile of channels 16 (4s + j) .. + 15, inputs 32 g .. + 31:
//   bytes 0..255: the tile's 16 rows (row r: inputs 32 g + 2r, + 2r + 1 of its 16 channels: AMX's
//     VNNI order, value p = 2 channel + parity), as four 64-byte quarters: quarter z holds rows
//     4z..4z+3 as 32 16-bit words, word i's nibble j is row 4z + j, value i;
//   bytes 256..319: the tile's 16 scales, then its 16 lows, in bf16 (AMX and AVX512-BF16 paths);
//   for the AVX2 path (float32 activations) bytes 256..383 hold them in float32: records
//   [N/64, K/32, 4, 384], so a GGUF's Q4_K grid (scales of up to 17 significant bits) stays exact.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlock = 16;   // output channels per tile
constexpr int64_t kGroup = 32;   // inputs per tile (one scale and low per channel)
constexpr int64_t kTileBytes = kBlock * kGroup / 2;  // 256: the nibbles
constexpr int64_t kRecord = kTileBytes + 64;            // 320: the nibbles, then 16 scales and 16 lows (bf16)
constexpr int64_t kRecord32 = kTileBytes + 128;         // 384: the same with float32 scales and lows (AVX2 path)
constexpr int64_t kSuper = 4;                           // blocks whose records for one group lie together

#define TGT_BF16 "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"
#define TGT_AMX "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16"
#define TGT_AVX2 "avx2,fma,f16c"

// The packed weight: four blocks' records per group side by side, so a thread working on four
// blocks reads one sequential stream.
struct Tiles {
  const uint8_t* base;
  int64_t G;
  int64_t rec;  // bytes a record: kRecord (int4, bf16 scales and lows), kRecord32 (int4, float32), kRecord8 (int8)
  inline const uint8_t* at(int64_t b, int64_t g) const {
    return base + (((b / kSuper) * G + g) * kSuper + b % kSuper) * rec;
  }
};

// ---------------------------------------------------------------- AVX-512 pieces

// The tile's 16 rows as bf16 128 + q (VNNI order) into `out` [16 x 32].
__attribute__((target(TGT_BF16))) static inline void offset_rows(const uint8_t* q, uint16_t* out) {
  const __m512i mask = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);
  for (int z = 0; z < 4; ++z) {
    const __m512i v = _mm512_loadu_si512(reinterpret_cast<const __m512i*>(q + z * 64));
    // (v >> 4j) & 0xF | 0x4300: ternary-logic 0xEA is (a & b) | c
    _mm512_store_si512(reinterpret_cast<__m512i*>(out + (4 * z + 0) * 32), _mm512_ternarylogic_epi32(v, mask, bias, 0xEA));
    _mm512_store_si512(reinterpret_cast<__m512i*>(out + (4 * z + 1) * 32),
                       _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), mask, bias, 0xEA));
    _mm512_store_si512(reinterpret_cast<__m512i*>(out + (4 * z + 2) * 32),
                       _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 8), mask, bias, 0xEA));
    _mm512_store_si512(reinterpret_cast<__m512i*>(out + (4 * z + 3) * 32),
                       _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 12), mask, bias, 0xEA));
  }
}

// The tile's scales s and offsets lo - 128 s (float32, one lane a channel).
__attribute__((target(TGT_BF16))) static inline void scales(const uint8_t* q, __m512& s, __m512& c) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(q + kTileBytes);
  s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  const __m512 lo = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))), 16));
  c = _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), s, lo);
}

// 16 floats -> 16 bf16 (round to nearest even, as torch's conversion) at `dst`.
__attribute__((target(TGT_BF16))) static inline void store_bf16_row(const float* src, at::BFloat16* dst) {
  const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)v);
}

// Each row's group sums sum_k x_k in float32 ([M, G]; the same sequence for a row in any company).
__attribute__((target(TGT_BF16))) static void group_sums_bf16(const at::BFloat16* x, int64_t M, int64_t K, float* out) {
  const int64_t G = K / kGroup;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const __m512i v = _mm512_loadu_si512(reinterpret_cast<const __m512i*>(x + m * K + g * kGroup));
      const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
      const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
      out[m * G + g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    }
}

// acc[r] = s * cbuf[r] + (c * sums[r, g] + acc[r]) for `rows` rows of 16 channels.
__attribute__((target(TGT_BF16))) static inline void fold_group(float* acc, const float* cbuf, int rows, __m512 s, __m512 c,
                                                             const float* sums, int64_t G, int64_t g) {
  for (int r = 0; r < rows; ++r) {
    const __m512 a = _mm512_fmadd_ps(c, _mm512_set1_ps(sums[r * G + g]), _mm512_load_ps(acc + r * 16));
    _mm512_store_ps(acc + r * 16, _mm512_fmadd_ps(s, _mm512_load_ps(cbuf + r * 16), a));
  }
}

// ---------------------------------------------------------------- AMX path (bf16)

struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Leave the thread's tiles as they were found: another library's configuration loaded back (a
// library may configure once per thread and rely on it, as llama.cpp's AMX kernels do), else the
// tiles released. Their data is not kept: no AMX user keeps data in tiles across calls into other
// code.
__attribute__((target(TGT_AMX))) static inline void restore_tiles(const TileConfig& before) {
  if (before.palette_id != 0) {
    _tile_loadconfig(&before);
  } else {
    _tile_release();
  }
}

bool amx_allowed() {  // the kernel's permission to use the AMX tile state (once per process)
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

// Blocks [b0, b1) (a multiple of 4 apart) for rows [m0, m0 + rows), rows <= 16: four blocks at a
// time (C tiles 0-3, A tile 4, B tiles 5-7), each group's C tile folded into float32 accumulators.
__attribute__((target(TGT_AMX))) static void amx_blocks(
    const at::BFloat16* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw, const float* sums,
    at::BFloat16* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t G = tw.G;
  const int r0 = static_cast<int>(rows);
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
  for (int t = 0; t < 5; ++t) cfg.rows[t] = r0;  // C 0-3 [r0 x 16] float32, A 4 [r0 x 32] bf16
  for (int t = 5; t < 8; ++t) cfg.rows[t] = 16;  // B [16 pairs x 32] bf16
  TileConfig before;
  _tile_storeconfig(&before);  // another AMX user's configuration in this thread, if any
  _tile_loadconfig(&cfg);
  // Software-pipelined over the groups: the B tiles of group g + 1 are written while group g's
  // tiles multiply (a tile load waits for the stores it reads to reach L1), and group g - 1's sums
  // are folded meanwhile. The fold order per row is the groups' order, as without the pipeline.
  alignas(64) uint16_t btile[2][4][16 * 32];
  alignas(64) float cbuf[2][4][16 * 16];
  alignas(64) float acc[4][16 * 16];
  const at::BFloat16* xa = x + m0 * K;
  const float* rs = sums + m0 * G;
  const int64_t stride = K * 2;
  for (int64_t b = b0; b < b1; b += kSuper) {
    std::memset(acc, 0, sizeof(acc));
    for (int j = 0; j < 4; ++j) offset_rows(tw.at(b, 0) + j * kRecord, btile[0][j]);
    for (int64_t g = 0; g < G; ++g) {
      const int cur = static_cast<int>(g & 1);
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      _tile_loadd(4, xa + g * kGroup, stride);
      _tile_loadd(5, btile[cur][0], 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, btile[cur][1], 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, btile[cur][2], 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, btile[cur][3], 64);
      _tile_dpbf16ps(3, 4, 5);
      if (g + 1 < G) {
        const uint8_t* next = tw.at(b, g + 1);  // the four records lie together
        for (int j = 0; j < 4; ++j) offset_rows(next + j * kRecord, btile[cur ^ 1][j]);
      }
      if (g > 0) {
        const uint8_t* prev = tw.at(b, g - 1);
        for (int j = 0; j < 4; ++j) {
          __m512 s, c;
          scales(prev + j * kRecord, s, c);
          fold_group(acc[j], cbuf[cur ^ 1][j], r0, s, c, rs, G, g - 1);
        }
      }
      _tile_stored(0, cbuf[cur][0], 64);
      _tile_stored(1, cbuf[cur][1], 64);
      _tile_stored(2, cbuf[cur][2], 64);
      _tile_stored(3, cbuf[cur][3], 64);
    }
    const uint8_t* last = tw.at(b, G - 1);
    for (int j = 0; j < 4; ++j) {
      __m512 s, c;
      scales(last + j * kRecord, s, c);
      fold_group(acc[j], cbuf[(G - 1) & 1][j], r0, s, c, rs, G, G - 1);
    }
    for (int j = 0; j < 4; ++j)
      for (int r = 0; r < r0; ++r) store_bf16_row(acc[j] + r * 16, y + (m0 + r) * N + (b + j) * kBlock);
  }
  restore_tiles(before);
}

// ---------------------------------------------------------------- AVX512-BF16 path (no AMX)

// Blocks [b0, b1) for rows [m0, m0 + rows), rows <= 16: per row 16 channel lanes, vdpbf16ps over
// the group's input pairs in order, then the group folded as in the AMX path.
template <int R>
__attribute__((target(TGT_BF16))) static void bf16_rows(const uint32_t* xp, int64_t pairs, const Tiles& tw, int64_t b,
                                                      const float* sums, at::BFloat16* y, int64_t N) {
  const int64_t G = tw.G;
  __m512 acc[R];
  for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
  alignas(64) uint16_t rows[16 * 32];
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* t = tw.at(b, g);
    offset_rows(t, rows);
    __m512 s, c;
    scales(t, s, c);
    __m512 part[R];
    for (int m = 0; m < R; ++m) part[m] = _mm512_setzero_ps();
    for (int r = 0; r < 16; ++r) {
      const __m512bh w = (__m512bh)_mm512_load_si512(reinterpret_cast<const __m512i*>(rows + r * 32));
      for (int m = 0; m < R; ++m)
        part[m] = _mm512_dpbf16_ps(part[m], (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * pairs + g * 16 + r])), w);
    }
    for (int m = 0; m < R; ++m)
      acc[m] = _mm512_fmadd_ps(s, part[m], _mm512_fmadd_ps(c, _mm512_set1_ps(sums[m * G + g]), acc[m]));
  }
  alignas(64) float out[16];
  for (int m = 0; m < R; ++m) {
    _mm512_store_ps(out, acc[m]);
    store_bf16_row(out, y + m * N + b * kBlock);
  }
}

__attribute__((target(TGT_BF16))) static void bf16_blocks(
    const at::BFloat16* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw, const float* sums,
    at::BFloat16* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t pairs = K / 2, G = tw.G;
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x + m0 * K);  // bf16 pairs
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t c = 0; c < rows; c += 8) {
      const uint32_t* xc = xp + c * pairs;
      const float* sc = sums + (m0 + c) * G;
      at::BFloat16* yc = y + (m0 + c) * N;
      switch (std::min<int64_t>(8, rows - c)) {
        case 1: bf16_rows<1>(xc, pairs, tw, b, sc, yc, N); break;
        case 2: bf16_rows<2>(xc, pairs, tw, b, sc, yc, N); break;
        case 3: bf16_rows<3>(xc, pairs, tw, b, sc, yc, N); break;
        case 4: bf16_rows<4>(xc, pairs, tw, b, sc, yc, N); break;
        case 5: bf16_rows<5>(xc, pairs, tw, b, sc, yc, N); break;
        case 6: bf16_rows<6>(xc, pairs, tw, b, sc, yc, N); break;
        case 7: bf16_rows<7>(xc, pairs, tw, b, sc, yc, N); break;
        default: bf16_rows<8>(xc, pairs, tw, b, sc, yc, N); break;
      }
    }
}

// ---------------------------------------------------------------- AVX2 path (float32 activations)

// acc[m] += (row m's input pair k, k + 1, broadcast) * w for rows [m0, m0 + rows): a row's sums in
// input order, whatever rows share the call.
__attribute__((target(TGT_AVX2))) static inline void avx2_fma_rows(const float* x, int64_t K, int64_t m0, int64_t rows,
                                                                 int64_t k, const __m256* w, __m256 (*acc)[4]) {
  for (int64_t m = 0; m < rows; ++m) {
    const __m256 a = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x + (m0 + m) * K + k)));
    for (int v = 0; v < 4; ++v) acc[m][v] = _mm256_fmadd_ps(a, w[v], acc[m][v]);
  }
}

// Block b's 16 outputs of each row: a channel's two pair lanes added, times its scale if given.
__attribute__((target(TGT_AVX2))) static inline void avx2_store(__m256 (*acc)[4], int64_t rows, float* y, int64_t N,
                                                              int64_t m0, int64_t b, const float* scale) {
  alignas(32) float lanes[8];
  for (int64_t m = 0; m < rows; ++m) {
    float* out = y + (m0 + m) * N + b * kBlock;
    for (int v = 0; v < 4; ++v) {
      _mm256_store_ps(lanes, acc[m][v]);
      for (int c = 0; c < 4; ++c) {
        const float sum = lanes[2 * c] + lanes[2 * c + 1];
        out[4 * v + c] = scale == nullptr ? sum : sum * scale[b * kBlock + 4 * v + c];
      }
    }
  }
}

// Blocks [b0, b1) for rows [m0, m0 + rows), rows <= 8, float32: each tile row dequantised to 32
// floats (4 vectors of channel pairs), multiplied by the row's input pair, summed in input order;
// a channel's two lanes are added once at the end.
__attribute__((target(TGT_AVX2))) static void avx2_blocks(
    const float* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw, float* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t G = tw.G;
  __m256 acc[8][4];
  const __m256i low4 = _mm256_set1_epi32(0x0F);
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t m = 0; m < rows; ++m)
      for (int v = 0; v < 4; ++v) acc[m][v] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* q = tw.at(b, g);
      const float* p = reinterpret_cast<const float*>(q + kTileBytes);  // float32 scales, then lows
      __m256 sv[4], lv[4];  // vector v covers values 8v..8v+7: channels 4v..4v+3, each twice
      for (int v = 0; v < 4; ++v) {
        alignas(32) float se[8], le[8];
        for (int i = 0; i < 8; ++i) {
          se[i] = p[4 * v + i / 2];
          le[i] = p[16 + 4 * v + i / 2];
        }
        sv[v] = _mm256_load_ps(se);
        lv[v] = _mm256_load_ps(le);
      }
      for (int z = 0; z < 4; ++z) {
        __m256i words[4];  // the quarter's 32 words, widened: values 8v..8v+7
        for (int v = 0; v < 4; ++v)
          words[v] = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + z * 64 + v * 16)));
        for (int j = 0; j < 4; ++j) {
          __m256 w[4];
          for (int v = 0; v < 4; ++v)
            w[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words[v], 4 * j), low4)), sv[v], lv[v]);
          avx2_fma_rows(x, K, m0, rows, g * kGroup + 2 * (4 * z + j), w, acc);
        }
      }
    }
    avx2_store(acc, rows, y, N, m0, b, nullptr);
  }
}

// ---------------------------------------------------------------- int8 weights (per-channel scale)
//
// Records uint8 [N/64, K/32, 4, 512]: the tile's 16 rows of 32 int8 values (VNNI order, as above);
// the scales float32 [N padded to 64], applied once to each channel's sum over all K.

constexpr int64_t kRecord8 = kBlock * kGroup;  // 512

// The tile's 16 rows as bf16 (int8 values are exact in bf16) into `out` [16 x 32].
__attribute__((target(TGT_BF16))) static inline void int8_rows(const uint8_t* q, uint16_t* out) {
  for (int r = 0; r < 16; ++r) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * 32));
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
    const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
    _mm512_store_si512(reinterpret_cast<__m512i*>(out + r * 32), (__m512i)_mm512_cvtne2ps_pbh(f1, f0));
  }
}

// Channel sums times the channels' scales, as bf16, for `rows` rows of 16 channels.
__attribute__((target(TGT_BF16))) static inline void store_scaled(const float* cbuf, int rows, const float* scale,
                                                               at::BFloat16* y, int64_t N) {
  const __m512 s = _mm512_loadu_ps(scale);
  alignas(64) float out[16];
  for (int r = 0; r < rows; ++r) {
    _mm512_store_ps(out, _mm512_mul_ps(s, _mm512_load_ps(cbuf + r * 16)));
    store_bf16_row(out, y + r * N);
  }
}

// Blocks [b0, b1) (a multiple of 4 apart) for rows [m0, m0 + rows), rows <= 16: four blocks at a
// time, C tiles 0-3 accumulating over all of K, A tile 4, B tiles 5-7.
__attribute__((target(TGT_AMX))) static void amx_blocks8(
    const at::BFloat16* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw, const float* scale,
    at::BFloat16* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t G = tw.G;
  const int r0 = static_cast<int>(rows);
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
  for (int t = 0; t < 5; ++t) cfg.rows[t] = r0;
  for (int t = 5; t < 8; ++t) cfg.rows[t] = 16;
  TileConfig before;
  _tile_storeconfig(&before);  // another AMX user's configuration in this thread, if any
  _tile_loadconfig(&cfg);
  // Software-pipelined as amx_blocks: group g + 1's B tiles are written while group g's multiply.
  alignas(64) uint16_t btile[2][4][16 * 32];
  alignas(64) float cbuf[16 * 16];
  const at::BFloat16* xa = x + m0 * K;
  const int64_t stride = K * 2;
  for (int64_t b = b0; b < b1; b += kSuper) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int j = 0; j < 4; ++j) int8_rows(tw.at(b + j, 0), btile[0][j]);
    for (int64_t g = 0; g < G; ++g) {
      const int cur = static_cast<int>(g & 1);
      _tile_loadd(4, xa + g * kGroup, stride);
      _tile_loadd(5, btile[cur][0], 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, btile[cur][1], 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, btile[cur][2], 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, btile[cur][3], 64);
      _tile_dpbf16ps(3, 4, 5);
      if (g + 1 < G) {
        for (int j = 0; j < 4; ++j) int8_rows(tw.at(b + j, g + 1), btile[cur ^ 1][j]);
      }
    }
    at::BFloat16* yb = y + m0 * N + b * kBlock;
    _tile_stored(0, cbuf, 64); store_scaled(cbuf, r0, scale + b * kBlock, yb, N);
    _tile_stored(1, cbuf, 64); store_scaled(cbuf, r0, scale + (b + 1) * kBlock, yb + kBlock, N);
    _tile_stored(2, cbuf, 64); store_scaled(cbuf, r0, scale + (b + 2) * kBlock, yb + 2 * kBlock, N);
    _tile_stored(3, cbuf, 64); store_scaled(cbuf, r0, scale + (b + 3) * kBlock, yb + 3 * kBlock, N);
  }
  restore_tiles(before);
}

// R rows (<= 8) of one block, AVX512-BF16: vdpbf16ps over all input pairs in order, then the scales.
template <int R>
__attribute__((target(TGT_BF16))) static void bf16_rows8(const uint32_t* xp, int64_t pairs, const Tiles& tw,
                                                       int64_t b, const float* scale, at::BFloat16* y, int64_t N) {
  const int64_t G = tw.G;
  __m512 acc[R];
  for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
  alignas(64) uint16_t rows[16 * 32];
  for (int64_t g = 0; g < G; ++g) {
    int8_rows(tw.at(b, g), rows);
    for (int r = 0; r < 16; ++r) {
      const __m512bh w = (__m512bh)_mm512_load_si512(reinterpret_cast<const __m512i*>(rows + r * 32));
      for (int m = 0; m < R; ++m)
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * pairs + g * 16 + r])), w);
    }
  }
  alignas(64) float cbuf[R * 16];
  for (int m = 0; m < R; ++m) _mm512_store_ps(cbuf + m * 16, acc[m]);
  store_scaled(cbuf, R, scale + b * kBlock, y + b * kBlock, N);
}

__attribute__((target(TGT_BF16))) static void bf16_blocks8(
    const at::BFloat16* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw, const float* scale,
    at::BFloat16* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t pairs = K / 2;
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x + m0 * K);
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t c = 0; c < rows; c += 8) {
      const uint32_t* xc = xp + c * pairs;
      at::BFloat16* yc = y + (m0 + c) * N;
      switch (std::min<int64_t>(8, rows - c)) {
        case 1: bf16_rows8<1>(xc, pairs, tw, b, scale, yc, N); break;
        case 2: bf16_rows8<2>(xc, pairs, tw, b, scale, yc, N); break;
        case 3: bf16_rows8<3>(xc, pairs, tw, b, scale, yc, N); break;
        case 4: bf16_rows8<4>(xc, pairs, tw, b, scale, yc, N); break;
        case 5: bf16_rows8<5>(xc, pairs, tw, b, scale, yc, N); break;
        case 6: bf16_rows8<6>(xc, pairs, tw, b, scale, yc, N); break;
        case 7: bf16_rows8<7>(xc, pairs, tw, b, scale, yc, N); break;
        default: bf16_rows8<8>(xc, pairs, tw, b, scale, yc, N); break;
      }
    }
}

// AVX2, float32: rows <= 8; each tile row widened to 32 floats (4 vectors of channel pairs),
// multiplied by the row's input pair, summed in input order; a channel's two lanes added at the
// end, then its scale.
__attribute__((target(TGT_AVX2))) static void avx2_blocks8(
    const float* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw, const float* scale,
    float* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t G = tw.G;
  __m256 acc[8][4];
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t m = 0; m < rows; ++m)
      for (int v = 0; v < 4; ++v) acc[m][v] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* q = tw.at(b, g);
      for (int r = 0; r < 16; ++r) {
        __m256 w[4];
        for (int v = 0; v < 4; ++v)
          w[v] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + r * 32 + v * 8))));
        avx2_fma_rows(x, K, m0, rows, g * kGroup + 2 * r, w, acc);
      }
    }
    avx2_store(acc, rows, y, N, m0, b, scale);
  }
}

// ---------------------------------------------------------------- entry points

// What both entry points check: x a contiguous CPU [M, K] in the path's activation dtype, tiles
// uint8 [N/64, K/32, 4, rec] over K inputs, AMX allowed where the path needs it.
void check_call(const char* what, const at::Tensor& x, const at::Tensor& tiles, int64_t rec, int64_t path) {
  TORCH_CHECK(path >= 0 && path <= 2, what, ": unknown path ", path);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), what, ": x must be a contiguous CPU [M, K]");
  TORCH_CHECK(tiles.scalar_type() == at::kByte && tiles.dim() == 4 && tiles.is_contiguous() && tiles.size(2) == kSuper
              && tiles.size(3) == rec, what, ": tiles must be uint8 [N/64, K/32, 4, ", rec, "] for path ", path);
  TORCH_CHECK(tiles.size(1) * kGroup == x.size(1), what, ": x has ", x.size(1), " inputs, the weight ",
              tiles.size(1) * kGroup);
  const bool f32 = path == 2;
  TORCH_CHECK(x.scalar_type() == (f32 ? at::kFloat : at::kBFloat16), what, ": path ", path, " takes ",
              f32 ? "float32" : "bfloat16", " activations");
  TORCH_CHECK(path != 0 || amx_allowed(), what, ": the kernel may not use AMX here (arch_prctl refused)");
}

// run(m0, rows, b0, b1) over the super-blocks split between torch's threads, the rows in chunks
// one pass over a tile serves (16, 8 on the AVX2 path).
template <typename Run>
void over_blocks(int64_t supers, int64_t M, int64_t path, const Run& run) {
  const int64_t chunk = path == 2 ? 8 : 16;
  const int64_t grain = std::max<int64_t>(1, supers / (4 * at::get_num_threads()));
  at::parallel_for(0, supers, grain, [&](int64_t s0, int64_t s1) {
    for (int64_t m0 = 0; m0 < M; m0 += chunk) run(m0, std::min(chunk, M - m0), s0 * kSuper, s1 * kSuper);
  });
}

// path: 0 = AMX (bf16 x), 1 = AVX512-BF16 (bf16 x), 2 = AVX2 (float32 x). tiles: uint8
// [N/64, K/32, 4, 320] (384 on the AVX2 path: float32 scales and lows).
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& tiles, int64_t path) {
  const int64_t rec = path == 2 ? kRecord32 : kRecord;
  check_call("int4 linear", x, tiles, rec, path);
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup, N = tiles.size(0) * kSuper * kBlock;
  at::Tensor y = at::empty({M, N}, x.options());
  const Tiles tw{tiles.data_ptr<uint8_t>(), G, rec};
  std::vector<float> sums(path == 2 ? 0 : M * G);
  if (path != 2) group_sums_bf16(x.data_ptr<at::BFloat16>(), M, K, sums.data());
  over_blocks(tiles.size(0), M, path, [&](int64_t m0, int64_t rows, int64_t b0, int64_t b1) {
    if (path == 0) {
      amx_blocks(x.data_ptr<at::BFloat16>(), K, m0, rows, tw, sums.data(), y.data_ptr<at::BFloat16>(), N, b0, b1);
    } else if (path == 1) {
      bf16_blocks(x.data_ptr<at::BFloat16>(), K, m0, rows, tw, sums.data(), y.data_ptr<at::BFloat16>(), N, b0, b1);
    } else {
      avx2_blocks(x.data_ptr<float>(), K, m0, rows, tw, y.data_ptr<float>(), N, b0, b1);
    }
  });
  return y;
}

// int8: tiles uint8 [N/64, K/32, 4, 512], scale float32 [N/64 * 64]; paths as int4_linear's.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& tiles, const at::Tensor& scale, int64_t path) {
  check_call("int8 linear", x, tiles, kRecord8, path);
  const int64_t M = x.size(0), K = x.size(1), N = tiles.size(0) * kSuper * kBlock;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == N,
              "int8 linear: scale must be float32 [", N, "]");
  at::Tensor y = at::empty({M, N}, x.options());
  const Tiles tw{tiles.data_ptr<uint8_t>(), K / kGroup, kRecord8};
  const float* sc = scale.data_ptr<float>();
  over_blocks(tiles.size(0), M, path, [&](int64_t m0, int64_t rows, int64_t b0, int64_t b1) {
    if (path == 0) {
      amx_blocks8(x.data_ptr<at::BFloat16>(), K, m0, rows, tw, sc, y.data_ptr<at::BFloat16>(), N, b0, b1);
    } else if (path == 1) {
      bf16_blocks8(x.data_ptr<at::BFloat16>(), K, m0, rows, tw, sc, y.data_ptr<at::BFloat16>(), N, b0, b1);
    } else {
      avx2_blocks8(x.data_ptr<float>(), K, m0, rows, tw, sc, y.data_ptr<float>(), N, b0, b1);
    }
  });
  return y;
}

bool amx_ok() { return amx_allowed(); }

// Self-check (tests/test_cpu_lowbit.py): with another configuration loaded in this thread, an int4
// and an int8 call through the AMX path leave it as it was; with none, the tiles are released.
__attribute__((target(TGT_AMX))) bool amx_leaves_tiles_as_found() {
  if (!amx_allowed()) return false;
  TileConfig theirs, after;
  std::memset(&theirs, 0, sizeof(theirs));
  theirs.palette_id = 1;
  theirs.rows[0] = 3; theirs.colsb[0] = 12;  // an unusual shape: not one the kernel uses
  theirs.rows[1] = 16; theirs.colsb[1] = 40;
  const int64_t K = 64, N = 64;
  std::vector<uint8_t> rec4(1 * 2 * kSuper * kRecord, 0), rec8(1 * 2 * kSuper * kRecord8, 0);
  std::vector<at::BFloat16> x(2 * K, at::BFloat16(1.0f)), y(2 * N);
  std::vector<float> sums(2 * 2, 32.0f), scale(N, 1.0f);
  const Tiles tw{rec4.data(), 2, kRecord};
  bool ok = true;
  for (int with_theirs = 0; with_theirs < 2; ++with_theirs) {
    if (with_theirs) _tile_loadconfig(&theirs);
    amx_blocks(x.data(), K, 0, 2, tw, sums.data(), y.data(), N, 0, kSuper);
    amx_blocks8(x.data(), K, 0, 2, Tiles{rec8.data(), 2, kRecord8}, scale.data(), y.data(), N, 0, kSuper);
    _tile_storeconfig(&after);
    ok = ok && (with_theirs ? std::memcmp(&after, &theirs, sizeof(after)) == 0 : after.palette_id == 0);
  }
  _tile_release();
  return ok;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &int4_linear, "y [M, N] = x [M, K] @ W^T for a packed int4 W (path 0 AMX, 1 AVX512-BF16, 2 AVX2)");
  m.def("int8_linear", &int8_linear, "y [M, N] = x [M, K] @ W^T for a packed int8 W with per-channel scales");
  m.def("amx_ok", &amx_ok, "whether this process may use the AMX tile state");
  m.def("amx_leaves_tiles_as_found", &amx_leaves_tiles_as_found,
        "self-check: the AMX path restores another user's tile configuration (or releases the tiles)");
}
