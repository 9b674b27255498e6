"""The one-weight-pass low-bit CPU kernels (kernels/cpu_lowbit.py, int4 and int8): their function,
their batch invariance on every path this CPU has, their packing, and the paths the ISA caps leave."""

from __future__ import annotations

import pytest
import torch

from asymagent.kernels import cpu_lowbit
from asymagent.modeling import weight_only

PATH_DTYPE = {"amx": torch.bfloat16, "avx512bf16": torch.bfloat16, "avx2": torch.float32}


def _grid(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)  # [N, K]
    scale = torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3  # [N, G]
    lo = -torch.rand(n, k // 32, generator=g) * 0.15
    return q, scale, lo


def _paths():
    why = cpu_lowbit.available()
    return [] if why is not None else cpu_lowbit.cpu_paths()


@pytest.fixture(params=list(PATH_DTYPE))
def path(request):
    if cpu_lowbit.available() is not None:
        pytest.skip(f"the int4 tile kernel is not available here: {cpu_lowbit.available()}")
    if request.param not in cpu_lowbit.cpu_paths():
        pytest.skip(f"this CPU has no {request.param} path ({cpu_lowbit.cpu_paths()})")
    if request.param == "amx" and cpu_lowbit.path_for(torch.bfloat16) != "amx":
        pytest.skip("the AMX tile state is refused to this process")
    return request.param


@pytest.mark.parametrize("n,k", [(64, 64), (80, 96), (256, 1536)])
def test_the_kernel_computes_the_reference(path, n, k):
    q, scale, lo = _grid(n, k)
    tiles = cpu_lowbit.pack_int4(q, scale, lo, path)
    dtype = PATH_DTYPE[path]
    for rows in (1, 5, 16, 17, 32, 33):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)  # [M, K]
        got = cpu_lowbit.int4_linear(x, tiles, n, path)  # [M, N]
        want = cpu_lowbit.int4_linear_reference(x, q, scale, lo)
        assert got.shape == (rows, n) and got.dtype == dtype
        tol = 2 ** -7 if dtype == torch.bfloat16 else 1e-5  # bf16 output rounding; float32 sums in another order
        assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


def test_a_row_gets_the_same_bits_alone_and_among_any_rows(path):
    n, k = 192, 256
    q, scale, lo = _grid(n, k, seed=1)
    tiles = cpu_lowbit.pack_int4(q, scale, lo, path)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(3)).to(PATH_DTYPE[path])  # [40, K]
    alone = torch.cat([cpu_lowbit.int4_linear(x[i:i + 1], tiles, n, path) for i in range(40)])  # [40, N]
    for rows in (2, 3, 8, 9, 16, 17, 31, 32, 40):
        together = cpu_lowbit.int4_linear(x[:rows], tiles, n, path)
        assert torch.equal(together, alone[:rows]), rows
    shuffled = torch.randperm(40, generator=torch.Generator().manual_seed(4))
    assert torch.equal(cpu_lowbit.int4_linear(x[shuffled], tiles, n, path), alone[shuffled])


@pytest.mark.parametrize("n,k", [(80, 96), (1536, 256)])
def test_the_int8_kernel_computes_the_reference_rounded_once(path, n, k):
    g = torch.Generator().manual_seed(5)
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)  # [N, K]
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4  # [N]
    tiles, scales = cpu_lowbit.pack_int8(q, scale)
    dtype = PATH_DTYPE[path]
    for rows in (1, 7, 16, 17, 33):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)  # [M, K]
        got = cpu_lowbit.int8_linear(x, tiles, scales, n, path)  # [M, N]
        exact = x.double() @ (q.double() * scale.double()[:, None]).T  # [M, N]
        if dtype == torch.bfloat16:  # int8 is exact in bf16: float32 sums, then one rounding to bf16
            assert (got == exact.to(torch.bfloat16)).float().mean() >= 0.999
        # float32 sums in another order: an error of a few ulps of the largest partial sum
        assert torch.allclose(got.double(), exact, rtol=2 ** -8 if dtype == torch.bfloat16 else 1e-5,
                              atol=1e-5 * float(exact.abs().max()))


def test_an_int8_row_gets_the_same_bits_alone_and_among_any_rows(path):
    g = torch.Generator().manual_seed(6)
    q = torch.randint(-127, 128, (192, 256), generator=g, dtype=torch.int8)
    tiles, scales = cpu_lowbit.pack_int8(q, torch.rand(192, generator=g) * 0.01)
    x = torch.randn(40, 256, generator=g).to(PATH_DTYPE[path])  # [40, K]
    alone = torch.cat([cpu_lowbit.int8_linear(x[i:i + 1], tiles, scales, 192, path) for i in range(40)])
    for rows in (2, 5, 8, 9, 16, 17, 32, 40):
        assert torch.equal(cpu_lowbit.int8_linear(x[:rows], tiles, scales, 192, path), alone[:rows]), rows


def test_packing_pads_channels_to_a_super_block_and_refuses_ragged_inputs():
    q, scale, lo = _grid(80, 64)
    tiles = cpu_lowbit.pack_int4(q, scale, lo)
    assert tiles.shape == (2, 2, cpu_lowbit.SUPER, cpu_lowbit.RECORD) and tiles.dtype == torch.uint8
    assert int(tiles[1, :, 1:].sum()) == 0  # channels 80..127: zero nibbles, zero scales and lows
    tiles32 = cpu_lowbit.pack_int4(q, scale, lo, "avx2")  # float32 scales and lows for float32 activations
    assert tiles32.shape == (2, 2, cpu_lowbit.SUPER, 384)
    assert torch.equal(tiles32[..., 256:320].contiguous().view(torch.float32)[0, 0, 0], scale[:16, 0])
    with pytest.raises(ValueError, match="K % 32"):
        cpu_lowbit.pack_int4(torch.zeros(16, 48, dtype=torch.int64), torch.ones(16, 1), torch.zeros(16, 1))
    with pytest.raises(ValueError, match="scale and lo"):
        cpu_lowbit.pack_int4(q, scale[:, :1], lo)
    tiles8, scales8 = cpu_lowbit.pack_int8(torch.ones(80, 64, dtype=torch.int8), torch.ones(80))
    assert tiles8.shape == (2, 2, cpu_lowbit.SUPER, 512) and scales8.shape == (128,)
    assert int(tiles8[1, :, 1:].sum()) == 0 and float(scales8[80:].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="K % 32"):
        cpu_lowbit.pack_int8(torch.ones(16, 40, dtype=torch.int8), torch.ones(16))


def test_the_isa_caps_of_the_cpu_kind_emulation_cap_the_paths():
    every = {"amx_tile", "amx_bf16", "avx512_bf16", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"}
    assert cpu_lowbit.cpu_paths(every, {}) in ([], ["amx", "avx512bf16", "avx2"])  # [] off x86-64
    if not cpu_lowbit.cpu_paths(every, {}):
        return
    assert cpu_lowbit.cpu_paths(every, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}) == ["avx512bf16", "avx2"]
    assert cpu_lowbit.cpu_paths(every, {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}) == ["avx2"]
    assert cpu_lowbit.cpu_paths(every - {"amx_tile"}, {}) == ["avx512bf16", "avx2"]
    assert cpu_lowbit.cpu_paths({"avx2", "fma", "f16c"}, {}) == ["avx2"]
    assert cpu_lowbit.cpu_paths({"sse4_2"}, {}) == []


def test_int4w_picks_the_tile_kernel_where_it_runs_and_torch_when_asked():
    kernel, why = weight_only.lowbit_kernel(torch.bfloat16)
    if cpu_lowbit.available() is None and cpu_lowbit.path_for(torch.bfloat16):
        assert kernel == "tiles" and "one weight pass" in why
    else:
        assert kernel == "torch" and why
    assert weight_only.lowbit_kernel(torch.bfloat16, "torch") == ("torch", "asked for")
    with pytest.raises(ValueError, match="unknown low-bit kernel"):
        weight_only.lowbit_kernel(torch.bfloat16, "fast")
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen)
    torch_op = weight_only.LowBitWeight.make("int4w", w, torch.float32, "torch")
    assert torch_op.kernel == "torch"
    if weight_only.lowbit_kernel(torch.float32)[0] == "tiles":
        tiles = weight_only.LowBitWeight.make("int4w", w, torch.float32, "tiles")
        x = torch.randn(3, 128, generator=gen)
        # the same grid through both kernels: the tile kernel's bf16 scales and lows (2^-9 relative)
        # against torch's float32 ones: within 1.5% of the outputs' range and a fifth of int4's own
        # error (8 seeds: 0.4-0.8% and 6-12%)
        a, b = tiles.matmul(x), torch_op.matmul(x)
        assert (a - b).abs().max() <= 0.015 * b.abs().max()
        assert (a - b).abs().max() <= 0.2 * (x @ w.T - b).abs().max()


def test_the_kernel_builds_wherever_a_compiler_and_a_path_are():
    """A fresh x86-64 machine has g++ and ninja (a dependency): the kernel must build there, not fall
    back to torch's ops in silence (the tests above would all skip)."""
    import platform
    import shutil

    if platform.system() != "Linux" or not cpu_lowbit.cpu_paths() or shutil.which("c++") is None:
        pytest.skip("no compiler or no path for the tile kernel on this machine")
    assert cpu_lowbit.available() is None


def test_the_amx_path_leaves_another_users_tile_configuration_in_place():
    """A library may configure the tiles once per thread and rely on it (llama.cpp's AMX kernels
    do): a call through our AMX path in the same thread must load that configuration back."""
    if cpu_lowbit.available() is not None or cpu_lowbit.path_for(torch.bfloat16) != "amx":
        pytest.skip("no AMX path here")
    assert cpu_lowbit.amx_leaves_tiles_as_found()
