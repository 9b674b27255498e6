"""The fusion objective (asymagent/training/fusion.py): exact where it should be, and trainable."""

from __future__ import annotations

import torch

from asymagent.training.fusion import (dense_fusion_kl, draft_kl, fusion_kl, sparse_rows,
                                       teacher_rows, conversation_tokens)


def _rows(seed: int, p: int = 6, v: int = 200, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn((p, v), generator=g) * scale, -1)  # [P, V]


def test_sparse_kl_is_exact_when_u_is_the_vocabulary():
    lf, lc, la, lb = (_rows(s) for s in range(4))
    whole = sparse_rows(lf, lc, k=200)  # U = every token: no rest bucket
    torch.testing.assert_close(fusion_kl(whole, la, lb), dense_fusion_kl(lf, lc, la, lb), atol=1e-5, rtol=0)
    torch.testing.assert_close(draft_kl(whole, la), (lf.exp() * (lf - la)).sum(-1), atol=1e-5, rtol=0)
    for beta in (0.0, 0.5, 2.0):
        torch.testing.assert_close(fusion_kl(whole, la, lb, beta), dense_fusion_kl(lf, lc, la, lb, beta),
                                   atol=1e-5, rtol=0)


def test_a_drafter_equal_to_the_verifier_makes_fused_equal_v_f():
    # a = v_f and b = v_c: log v_c + (log v_f - log v_c) = log v_f, for any top-k set U
    lf, lc = _rows(5), _rows(6)
    assert dense_fusion_kl(lf, lc, lf, lc).abs().max() < 1e-5
    for k in (4, 16, 64):
        assert fusion_kl(sparse_rows(lf, lc, k), lf, lc).abs().max() < 1e-5, k
    # and a drafter whose two views agree gives fused = v_c: the loss is KL(v_f || v_c)
    torch.testing.assert_close(fusion_kl(sparse_rows(lf, lc, 200), lf, lf),
                               (lf.exp() * (lf - lc)).sum(-1), atol=1e-5, rtol=0)


def test_sparse_kl_approximates_the_dense_one_on_peaked_rows():
    lf, lc, la, lb = (_rows(s, scale=8.0) for s in range(10, 14))  # LM-like: most mass in few tokens
    dense = dense_fusion_kl(lf, lc, la, lb)
    sparse = fusion_kl(sparse_rows(lf, lc, 32), la, lb)
    assert (sparse - dense).abs().max() < 0.05 * dense.abs().max() + 1e-3


def test_teacher_rows_and_a_gradient_step_on_a_tiny_model(smollm_tokenizer):
    from asymagent.chat.chat_format import ChatFormat
    from asymagent.context.views import CompressionConfig, ContextViews
    from asymagent.decoding.stopping import eos_ids
    from asymagent.modeling.drafter import build_drafter, trainable_parameters
    from asymagent.training.domains import domain_by_name
    from asymagent.training.long_episodes import long_episode
    from conftest import make_tiny_llama

    tok = smollm_tokenizer
    verifier = make_tiny_llama(vocab_size=len(tok), layers=2, hidden=32, heads=4, kv_heads=2,
                               max_positions=16384)
    gen = torch.Generator().manual_seed(3)  # an untied N(0, 1) head: peaked next-token rows
    verifier.lm_head.weight = torch.nn.Parameter(torch.randn((len(tok), 32), generator=gen))
    cf = ChatFormat(tok)
    messages, tools = long_episode(domain_by_name("weather"), 0)
    views = ContextViews(tok, CompressionConfig(), cf)
    tokens = conversation_tokens(views, messages, tools, eos_ids(verifier, tok), cf.generation_prompt_ids)
    assert tokens is not None and len(tokens.compressed_ids) < len(tokens.full_ids)  # compressed
    # every target is the token right after its row, in both views
    assert all(tokens.full_ids[r + 1] == t for r, t in zip(tokens.full_rows.tolist(), tokens.targets.tolist()))
    assert all(tokens.compressed_ids[r + 1] == t
               for r, t in zip(tokens.compressed_rows.tolist(), tokens.targets.tolist()))
    teacher = teacher_rows(verifier, tokens, k=16)
    with torch.no_grad():  # the sparse rows hold the one-shot forward's log-probs
        hidden = verifier.model(input_ids=torch.tensor([tokens.full_ids])).last_hidden_state[0]
        dense = torch.log_softmax(verifier.lm_head(hidden[tokens.full_rows]).float(), -1)  # [P, V]
    valid = teacher.log_vf > -1e29
    got = teacher.log_vf[valid]
    want = dense.gather(1, teacher.index)[valid]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)

    drafter = build_drafter(verifier, num_layers=1, init_from_verifier=False)  # far from the teacher
    params = trainable_parameters(drafter)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.SGD(params, lr=0.05)

    def loss() -> torch.Tensor:
        ha = drafter.model(input_ids=torch.tensor([tokens.full_ids])).last_hidden_state[0][tokens.full_rows]
        hb = drafter.model(input_ids=torch.tensor([tokens.compressed_ids])).last_hidden_state[0][tokens.compressed_rows]
        la = torch.log_softmax(drafter.lm_head(ha).float(), -1)
        lb = torch.log_softmax(drafter.lm_head(hb).float(), -1)
        return fusion_kl(teacher, la, lb).mean() + 0.5 * draft_kl(teacher, la).mean()

    before = loss()
    assert before > 1e-3  # a loss worth lowering
    before.backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        after = loss()
    assert after < before
