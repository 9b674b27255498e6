// One-weight-pass int4 linear for the CPU: y[M, N] = x[M, K] @ W^T, W = lo + q * scale per 32 inputs.
//
// Built at first use by kernels/cpu_int4.py (torch.utils.cpp_extension.load); see its docstring for
// the layout, the paths and why. Every path dequantises a tile of the 4-bit weight (16 output
// channels x 32 inputs, 256 bytes) once, in registers or L1, and uses it for every row of x: the
// cost of 1..32 rows is one pass over the weights plus the rows' multiply-adds. A row's arithmetic
// is the same sequence whatever rows share the call (batch invariance): rows never mix, the input
// loop order is fixed, and the row count only sets how many rows a tile holds.
//
// Packed layout (kernels/cpu_int4.py `pack_int4`): records uint8 [N/64, K/32, 4, 320], record
// (super-block s, group g, block j) for the tile of channels 16 (4s + j) .. + 15, inputs 32 g .. + 31:
//   bytes 0..255: the tile's 16 rows (row r: inputs 32 g + 2r, + 2r + 1 of its 16 channels: AMX's
//     VNNI order, value p = 2 channel + parity), as four 64-byte quarters: quarter z holds rows
//     4z..4z+3, its dword lane i, nibble j = 2 rr + h is row 4z + rr, value 16 h + i;
//   bytes 256..319: the tile's 16 scales, then its 16 lows, in bf16.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kBlock = 16;   // output channels per tile
constexpr int64_t kGroup = 32;   // inputs per tile (one scale and low per channel)
constexpr int64_t kTileBytes = kBlock * kGroup / 2;  // 256: the nibbles
constexpr int64_t kRecord = kTileBytes + 64;            // 320: the nibbles, then 16 scales and 16 lows (bf16)
constexpr int64_t kSuper = 4;                           // blocks whose records for one group lie together

// The packed weight: records [N/64, K/32, 4, 320] (four blocks' records per group side by side, so
// a thread working on four blocks reads one sequential stream).
struct Tiles {
  const uint8_t* base;
  int64_t G;
  inline const uint8_t* at(int64_t b, int64_t g) const {
    return base + (((b / kSuper) * G + g) * kSuper + b % kSuper) * kRecord;
  }
};

#define TGT_BF16 "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"
#define TGT_AMX "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16"
#define TGT_AVX2 "avx2,fma,f16c"

// ---------------------------------------------------------------- AVX-512 dequantisation (bf16 out)

// The tile's 16 rows of 32 bf16 weights (VNNI order) into `out` [16 x 32] (64-byte aligned).
// The tile is four 64-byte quarters; quarter z holds rows 4z..4z+3: dword lane i, nibble j = 2 rr + h
// is row 4z + rr, value 16 h + i. So a row's 16 values are one shift and one mask of a quarter,
// no byte shuffles (they share one port with the conversions).
__attribute__((target(TGT_BF16))) static inline void dequant_tile_bf16(
    const uint8_t* q, uint16_t* out) {
  const uint16_t* params = reinterpret_cast<const uint16_t*>(q + kTileBytes);
  const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(params))), 16));
  const __m512 l = _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(params + 16))), 16));
  const __m512i idx0 = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i idx1 = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m512 s0 = _mm512_permutexvar_ps(idx0, s), s1 = _mm512_permutexvar_ps(idx1, s);
  const __m512 l0 = _mm512_permutexvar_ps(idx0, l), l1 = _mm512_permutexvar_ps(idx1, l);
  const __m512i low4 = _mm512_set1_epi32(0x0F);
  for (int z = 0; z < 4; ++z) {
    const __m512i v = _mm512_loadu_si512(reinterpret_cast<const __m512i*>(q + z * 64));
#pragma GCC unroll 4
    for (int rr = 0; rr < 4; ++rr) {
      const __m512i n0 = _mm512_and_si512(_mm512_srli_epi32(v, 8 * rr), low4);      // values 0..15
      const __m512i n1 = _mm512_and_si512(_mm512_srli_epi32(v, 8 * rr + 4), low4);  // values 16..31
      const __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n0), s0, l0);  // channels 0..7
      const __m512 w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n1), s1, l1);  // channels 8..15
      _mm512_store_si512(reinterpret_cast<__m512i*>(out + (4 * z + rr) * 32), (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
    }
  }
}

// 16 floats -> 16 bf16 (round to nearest even, as torch's conversion) at `dst`.
__attribute__((target(TGT_BF16))) static inline void store_bf16_row(const float* src, at::BFloat16* dst) {
  const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)v);
}

// ---------------------------------------------------------------- AMX path (bf16)

struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool amx_allowed() {  // the kernel's permission to use the AMX tile state (once per process)
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

// Blocks [b0, b1) for rows [m0, m0 + rows), rows <= 32. Up to 16 rows: four blocks at a time (C
// tiles 0-3, A tile 4, B tiles 5-7), so four independent accumulation chains overlap one block's
// dequantisation; 17..32 rows: two blocks at a time, each with a C tile per 16 rows (C 0-3, A 4-5,
// B 6-7). A row's sums are the same in either: the tiles only decide which rows run together.
__attribute__((target(TGT_AMX))) static void amx_blocks(
    const at::BFloat16* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw,
    at::BFloat16* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t G = tw.G;
  const int r0 = static_cast<int>(std::min<int64_t>(rows, 16)), r1 = static_cast<int>(rows - r0);
  const bool wide = r1 > 0;  // 17..32 rows
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
  if (!wide) {
    for (int t = 0; t < 5; ++t) cfg.rows[t] = r0;  // C 0-3 [r0 x 16] float32, A 4 [r0 x 32] bf16
    for (int t = 5; t < 8; ++t) cfg.rows[t] = 16;  // B [16 pairs x 32] bf16
  } else {
    cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = r0;  // C 0 (block 0), C 1 (block 1), A 4: rows 0..15
    cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = r1;  // C 2 (block 0), C 3 (block 1), A 5: rows 16..
    cfg.rows[6] = cfg.rows[7] = 16;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t btile[4][16 * 32];
  alignas(64) float ctile[16 * 16];
  const at::BFloat16* xa = x + m0 * K;
  const at::BFloat16* xb = x + (m0 + 16) * K;
  const int64_t stride = K * 2;
  const int64_t step = wide ? 2 : 4;
  auto store = [&](int tile_rows, int64_t row0, int64_t b) {
    for (int r = 0; r < tile_rows; ++r) store_bf16_row(ctile + r * 16, y + (m0 + row0 + r) * N + b * kBlock);
  };
  int64_t b = b0;
  for (; b + step <= b1; b += step) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t g = 0; g < G; ++g) {
      if (!wide) {
        _tile_loadd(4, xa + g * kGroup, stride);
        dequant_tile_bf16(tw.at(b + 0, g), btile[0]);
        _tile_loadd(5, btile[0], 64);
        _tile_dpbf16ps(0, 4, 5);
        dequant_tile_bf16(tw.at(b + 1, g), btile[1]);
        _tile_loadd(6, btile[1], 64);
        _tile_dpbf16ps(1, 4, 6);
        dequant_tile_bf16(tw.at(b + 2, g), btile[2]);
        _tile_loadd(7, btile[2], 64);
        _tile_dpbf16ps(2, 4, 7);
        dequant_tile_bf16(tw.at(b + 3, g), btile[3]);
        _tile_loadd(5, btile[3], 64);
        _tile_dpbf16ps(3, 4, 5);
      } else {
        _tile_loadd(4, xa + g * kGroup, stride);
        _tile_loadd(5, xb + g * kGroup, stride);
        dequant_tile_bf16(tw.at(b + 0, g), btile[0]);
        _tile_loadd(6, btile[0], 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        dequant_tile_bf16(tw.at(b + 1, g), btile[1]);
        _tile_loadd(7, btile[1], 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    if (!wide) {
      _tile_stored(0, ctile, 64); store(r0, 0, b);
      _tile_stored(1, ctile, 64); store(r0, 0, b + 1);
      _tile_stored(2, ctile, 64); store(r0, 0, b + 2);
      _tile_stored(3, ctile, 64); store(r0, 0, b + 3);
    } else {
      _tile_stored(0, ctile, 64); store(r0, 0, b);
      _tile_stored(1, ctile, 64); store(r0, 0, b + 1);
      _tile_stored(2, ctile, 64); store(r1, 16, b);
      _tile_stored(3, ctile, 64); store(r1, 16, b + 1);
    }
  }
  for (; b < b1; ++b) {  // the range's last blocks, one at a time (C 0 / C 2, A 4 / A 5, B 6)
    _tile_zero(0);
    if (wide) _tile_zero(2);
    for (int64_t g = 0; g < G; ++g) {
      dequant_tile_bf16(tw.at(b, g), btile[0]);
      _tile_loadd(6, btile[0], 64);
      _tile_loadd(4, xa + g * kGroup, stride);
      _tile_dpbf16ps(0, 4, 6);
      if (wide) {
        _tile_loadd(5, xb + g * kGroup, stride);
        _tile_dpbf16ps(2, 5, 6);
      }
    }
    _tile_stored(0, ctile, 64); store(r0, 0, b);
    if (wide) { _tile_stored(2, ctile, 64); store(r1, 16, b); }
  }
  _tile_release();
}

// ---------------------------------------------------------------- AVX512-BF16 path (no AMX)

// R rows (<= 8) against one block's dequantised weights `w` [pairs][32] bf16: 16 channel lanes a
// row, vdpbf16ps over the input pairs in order, accumulators in registers.
template <int R>
__attribute__((target(TGT_BF16))) static void bf16_rows(const uint32_t* xp, int64_t pairs, const uint16_t* w,
                                                      at::BFloat16* y, int64_t N) {
  __m512 acc[R];
  for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t i = 0; i < pairs; ++i) {
    const __m512bh wv = (__m512bh)_mm512_load_si512(reinterpret_cast<const __m512i*>(w + i * 32));
    for (int m = 0; m < R; ++m)
      acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * pairs + i])), wv);
  }
  alignas(64) float out[16];
  for (int m = 0; m < R; ++m) {
    _mm512_store_ps(out, acc[m]);
    store_bf16_row(out, y + m * N);
  }
}

// Blocks [b0, b1) for rows [m0, m0 + rows): each block's tiles dequantised once into a buffer
// (K x 16 bf16: 48 KB at K = 1536), then swept by 8 rows at a time (the AMX path's arithmetic per
// row, by other instructions).
__attribute__((target(TGT_BF16))) static void bf16_blocks(
    const at::BFloat16* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw,
    at::BFloat16* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t G = tw.G, pairs = K / 2;
  uint16_t* w = static_cast<uint16_t*>(std::aligned_alloc(64, static_cast<size_t>(G) * 16 * 32 * 2));
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x + m0 * K);  // bf16 pairs
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t g = 0; g < G; ++g)
      dequant_tile_bf16(tw.at(b, g), w + g * 16 * 32);
    for (int64_t c = 0; c < rows; c += 8) {
      const uint32_t* xc = xp + c * pairs;
      at::BFloat16* yc = y + (m0 + c) * N + b * kBlock;
      switch (std::min<int64_t>(8, rows - c)) {
        case 1: bf16_rows<1>(xc, pairs, w, yc, N); break;
        case 2: bf16_rows<2>(xc, pairs, w, yc, N); break;
        case 3: bf16_rows<3>(xc, pairs, w, yc, N); break;
        case 4: bf16_rows<4>(xc, pairs, w, yc, N); break;
        case 5: bf16_rows<5>(xc, pairs, w, yc, N); break;
        case 6: bf16_rows<6>(xc, pairs, w, yc, N); break;
        case 7: bf16_rows<7>(xc, pairs, w, yc, N); break;
        default: bf16_rows<8>(xc, pairs, w, yc, N); break;
      }
    }
  }
  std::free(w);
}

// ---------------------------------------------------------------- AVX2 path (float32 activations)

// Blocks [b0, b1) for rows [m0, m0 + rows), rows <= 8, float32: each tile row dequantised to 32
// floats (4 vectors: channel pairs), multiplied by the row's input pair, summed in input order;
// a channel's two lanes are added once at the end.
__attribute__((target(TGT_AVX2))) static void avx2_blocks(
    const float* x, int64_t K, int64_t m0, int64_t rows, const Tiles& tw,
    float* y, int64_t N, int64_t b0, int64_t b1) {
  const int64_t G = tw.G;
  __m256 acc[8][4];
  alignas(32) float lanes[8];
  const __m256i low4 = _mm256_set1_epi32(0x0F);
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t m = 0; m < rows; ++m)
      for (int v = 0; v < 4; ++v) acc[m][v] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* q = tw.at(b, g);
      const uint16_t* p = reinterpret_cast<const uint16_t*>(q + kTileBytes);
      __m256 sv[4], lv[4];  // vector v covers channels 4v..4v+3, each twice
      for (int v = 0; v < 4; ++v) {
        alignas(32) float se[8], le[8];
        for (int i = 0; i < 8; ++i) {
          uint32_t sb = static_cast<uint32_t>(p[4 * v + i / 2]) << 16, lb = static_cast<uint32_t>(p[16 + 4 * v + i / 2]) << 16;
          std::memcpy(&se[i], &sb, 4);
          std::memcpy(&le[i], &lb, 4);
        }
        sv[v] = _mm256_load_ps(se);
        lv[v] = _mm256_load_ps(le);
      }
      for (int r = 0; r < 16; ++r) {
        const __m256i* quarter = reinterpret_cast<const __m256i*>(q + (r / 4) * 64);
        const int sh = 8 * (r % 4);
        const __m256i lanes0 = _mm256_loadu_si256(quarter), lanes1 = _mm256_loadu_si256(quarter + 1);
        __m256 w[4];  // values 0..7, 8..15, 16..23, 24..31
        w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(lanes0, sh), low4)), sv[0], lv[0]);
        w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(lanes1, sh), low4)), sv[1], lv[1]);
        w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(lanes0, sh + 4), low4)), sv[2], lv[2]);
        w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(lanes1, sh + 4), low4)), sv[3], lv[3]);
        const int64_t k = g * kGroup + 2 * r;
        for (int64_t m = 0; m < rows; ++m) {
          const __m256 a = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x + (m0 + m) * K + k)));
          for (int v = 0; v < 4; ++v) acc[m][v] = _mm256_fmadd_ps(a, w[v], acc[m][v]);
        }
      }
    }
    for (int64_t m = 0; m < rows; ++m) {
      float* out = y + (m0 + m) * N + b * kBlock;
      for (int v = 0; v < 4; ++v) {
        _mm256_store_ps(lanes, acc[m][v]);
        for (int c = 0; c < 4; ++c) out[4 * v + c] = lanes[2 * c] + lanes[2 * c + 1];
      }
    }
  }
}

// ---------------------------------------------------------------- entry points

// path: 0 = AMX (bf16 x), 1 = AVX512-BF16 (bf16 x), 2 = AVX2 (float32 x). tiles: uint8 [N/64, K/32, 4, 320].
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& tiles, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "int4 linear: x must be a contiguous CPU [M, K]");
  TORCH_CHECK(tiles.scalar_type() == at::kByte && tiles.dim() == 4 && tiles.is_contiguous() && tiles.size(2) == kSuper
              && tiles.size(3) == kRecord, "int4 linear: tiles must be uint8 [N/64, K/32, 4, 320]");
  TORCH_CHECK(tiles.size(1) * kGroup == x.size(1), "int4 linear: x has ", x.size(1), " inputs, the weight ",
              tiles.size(1) * kGroup);
  const int64_t M = x.size(0), K = x.size(1), NB = tiles.size(0) * kSuper, N = NB * kBlock;
  const bool f32 = path == 2;
  TORCH_CHECK(path >= 0 && path <= 2, "int4 linear: unknown path ", path);
  TORCH_CHECK(x.scalar_type() == (f32 ? at::kFloat : at::kBFloat16), "int4 linear: path ", path, " takes ",
              f32 ? "float32" : "bfloat16", " activations");
  TORCH_CHECK(path != 0 || amx_allowed(), "int4 linear: the kernel may not use AMX here (arch_prctl refused)");
  at::Tensor y = at::empty({M, N}, x.options());
  const Tiles tw{tiles.data_ptr<uint8_t>(), tiles.size(1)};
  const int64_t chunk = f32 ? 8 : 32;  // rows one pass over a tile serves
  const int64_t supers = tiles.size(0);
  const int64_t grain = std::max<int64_t>(1, supers / (4 * at::get_num_threads()));
  at::parallel_for(0, supers, grain, [&](int64_t s0, int64_t s1) {
    const int64_t b0 = s0 * kSuper, b1 = s1 * kSuper;
    for (int64_t m0 = 0; m0 < M; m0 += chunk) {
      const int64_t rows = std::min(chunk, M - m0);
      if (path == 0) {
        amx_blocks(x.data_ptr<at::BFloat16>(), K, m0, rows, tw, y.data_ptr<at::BFloat16>(), N, b0, b1);
      } else if (path == 1) {
        bf16_blocks(x.data_ptr<at::BFloat16>(), K, m0, rows, tw, y.data_ptr<at::BFloat16>(), N, b0, b1);
      } else {
        avx2_blocks(x.data_ptr<float>(), K, m0, rows, tw, y.data_ptr<float>(), N, b0, b1);
      }
    }
  });
  return y;
}

bool amx_ok() { return amx_allowed(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &int4_linear, "y [M, N] = x [M, K] @ W^T for a packed int4 W (path 0 AMX, 1 AVX512-BF16, 2 AVX2)");
  m.def("amx_ok", &amx_ok, "whether this process may use the AMX tile state");
}
