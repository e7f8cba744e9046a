"""The looped Transformer: the five variants are one loop wired as looped.py's table says."""

import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from looped import VARIANTS, LoopedConfig, LoopedTransformer, loss_loops, norm  # noqa: E402
import train_flt  # noqa: E402

V, T, B = 32, 16, 3


def make(variant="FLT", seed=0, **kw):
    """A tiny model with every weight random (the real init zeroes the output
    projections, which would make every block the identity and every test vacuous)."""
    torch.manual_seed(seed)
    cfg = LoopedConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16,
                       n_loops=kw.pop("n_loops", 3), variant=variant, **kw)
    model = LoopedTransformer(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 2 and p.shape[0] != V else 1.0))
    return model.eval()


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


def reference_loop(model, idx, h):
    """One loop t>1 written straight from the variant table, with the model's blocks."""
    c, blocks = model.config, model.blocks
    rope = (model.rope_cos[:idx.size(1)], model.rope_sin[:idx.size(1)])
    x0 = model.tok_emb(idx)
    if c.variant == "LT":            # starts from h, h enters nowhere else
        x = h
        for b in blocks:
            x = b(x, rope)
    elif c.variant == "LT_i":        # starts from norm(x0 + h)
        x = norm(x0 + h)
        for b in blocks:
            x = b(x, rope)
    elif c.variant == "LT_ia":       # norm(x0); h as the query of layer 0 only
        x = blocks[0](norm(x0), rope, q=h)
        for b in blocks[1:]:
            x = b(x, rope)
    elif c.variant == "FLT_res":     # norm(x0); x = norm(x + h) before each block
        x = norm(x0)
        for b in blocks:
            x = b(norm(x + h), rope)
    elif c.variant == "FLT":         # norm(x0); Q = W_Q norm(h), K,V = W_K,W_V norm(x) at each layer
        x = norm(x0)
        for b in blocks:
            x = b(x, rope, q=h)
    return norm(x)


def loop_states(model, idx, n_loops=None, h=None):
    return [h_t for h_t, _ in model.loops(idx, n_loops, h=h)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_wiring_matches_the_table(variant):
    model = make(variant)
    idx, _ = batch()
    with torch.no_grad():
        states = loop_states(model, idx, 3)
        for t in (1, 2):
            assert torch.allclose(states[t], reference_loop(model, idx, states[t - 1]), atol=1e-10)


def test_one_loop_is_the_same_function_for_all_variants():
    idx, targets = batch()
    outs = []
    for variant in VARIANTS:
        model = make("FLT", seed=0, n_loops=1)
        model.config.variant = variant            # same weights, another wiring
        with torch.no_grad():
            outs.append(model(idx, targets))
    for logits, loss in outs[1:]:
        assert torch.equal(logits, outs[0][0]) and torch.equal(loss, outs[0][1])
    # and with more loops the wirings do differ
    many = []
    for variant in VARIANTS:
        model = make("FLT", seed=0, n_loops=3)
        model.config.variant = variant
        with torch.no_grad():
            many.append(model(idx)[0])
    assert all(not torch.allclose(a, b) for i, a in enumerate(many) for b in many[i + 1:])


def test_variants_have_equal_parameter_counts():
    counts = {v: LoopedTransformer(LoopedConfig(variant=v, block_size=64)).num_params() for v in VARIANTS}
    assert len(set(counts.values())) == 1, counts


def block_queries(model, idx, h):
    """For one loop continuing from h: which blocks received a query input, and what."""
    seen = []
    hooks = [b.register_forward_pre_hook(lambda m, args, i=i: seen.append((i, args[0], args[2])))
             for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        out = loop_states(model, idx, 1, h=h)[0]
    for hk in hooks:
        hk.remove()
    return seen, out


def test_flt_previous_state_enters_every_layer_only_as_query():
    model = make("FLT")
    idx, _ = batch()
    h = norm(torch.randn(B, T, 16, dtype=torch.float64))
    seen, out = block_queries(model, idx, h)
    assert [i for i, _, q in seen if q is not None] == [0, 1]
    assert all(q is h for _, _, q in seen)
    assert torch.allclose(seen[0][1], norm(model.tok_emb(idx)))   # the stream starts at norm(x0)
    # a functional probe: with W_Q = 0 in every layer, h has no effect at all ...
    h2 = norm(torch.randn_like(h))
    with torch.no_grad():
        for b in model.blocks:
            b.attn.W_Q.weight.zero_()
        assert torch.allclose(loop_states(model, idx, 1, h=h)[0], loop_states(model, idx, 1, h=h2)[0])
    # ... while W_Q = 0 in layer 0 only leaves the path through layer 1
    model = make("FLT")
    with torch.no_grad():
        model.blocks[0].attn.W_Q.weight.zero_()
        assert not torch.allclose(loop_states(model, idx, 1, h=h)[0], loop_states(model, idx, 1, h=h2)[0])


def test_lt_ia_previous_state_is_the_query_of_layer_zero_only():
    model = make("LT_ia")
    idx, _ = batch()
    h, h2 = norm(torch.randn(B, T, 16, dtype=torch.float64)), norm(torch.randn(B, T, 16, dtype=torch.float64))
    seen, _ = block_queries(model, idx, h)
    assert [i for i, _, q in seen if q is not None] == [0]
    with torch.no_grad():
        assert not torch.allclose(loop_states(model, idx, 1, h=h)[0], loop_states(model, idx, 1, h=h2)[0])
        model.blocks[0].attn.W_Q.weight.zero_()
        assert torch.allclose(loop_states(model, idx, 1, h=h)[0], loop_states(model, idx, 1, h=h2)[0])


def test_flt_res_adds_previous_state_before_every_block():
    model = make("FLT_res")
    idx, _ = batch()
    h = norm(torch.randn(B, T, 16, dtype=torch.float64))
    seen, _ = block_queries(model, idx, h)
    assert all(q is None for _, _, q in seen)
    rope = (model.rope_cos[:T], model.rope_sin[:T])
    with torch.no_grad():
        x = norm(model.tok_emb(idx))
        for (i, x_in, _), b in zip(seen, model.blocks):
            assert torch.allclose(x_in, norm(x + h))              # input of block i = norm(x + h)
            x = b(x_in, rope)


def test_lt_i_previous_state_enters_only_at_the_start():
    model = make("LT_i")
    idx, _ = batch()
    h = norm(torch.randn(B, T, 16, dtype=torch.float64))
    seen, _ = block_queries(model, idx, h)
    assert all(q is None for _, _, q in seen)
    assert torch.allclose(seen[0][1], norm(model.tok_emb(idx) + h))   # start = norm(x0 + h)
    # block 1's input is block 0's output: nothing added in between
    with torch.no_grad():
        x1 = model.blocks[0](seen[0][1], (model.rope_cos[:T], model.rope_sin[:T]))
    assert torch.equal(seen[1][1], x1)


def test_lt_starts_from_previous_state():
    model = make("LT")
    idx, _ = batch()
    h = norm(torch.randn(B, T, 16, dtype=torch.float64))
    seen, _ = block_queries(model, idx, h)
    assert seen[0][1] is h and all(q is None for _, _, q in seen)


def loop_losses(model, idx, targets):
    """The cross-entropy of every loop's logits, tensor (n_loops,), from loops() directly."""
    return torch.stack([F.cross_entropy(model.logits(h).flatten(0, 1), targets.reshape(-1), ignore_index=-1)
                        for h, _ in model.loops(idx)])


@pytest.mark.parametrize("loss_type", ["END", "STEP", "FEW"])
def test_loss_types_combine_the_per_loop_losses(loss_type):
    K = 6
    model = make("FLT", n_loops=K, loss_type=loss_type)
    idx, targets = batch()
    with torch.no_grad():
        _, loss = model(idx, targets)
        per_loop = loop_losses(model, idx, targets)
    # loop k's logits do not depend on how many loops follow: END at n_loops=k+1 is loop k
    end_at = torch.stack([make("FLT", n_loops=K)(idx, targets, n_loops=k + 1)[1] for k in range(K)])
    assert torch.allclose(per_loop, end_at.detach(), atol=1e-12)
    want = {"END": per_loop[-1], "STEP": per_loop.mean(), "FEW": per_loop[-2:].mean()}[loss_type]
    assert torch.allclose(loss, want, atol=1e-12)


def test_few_is_the_last_third():
    assert loss_loops("FEW", 12) == [8, 9, 10, 11]
    assert loss_loops("FEW", 1) == [0] and loss_loops("FEW", 2) == [1]
    assert loss_loops("STEP", 3) == [0, 1, 2] and loss_loops("END", 9) == [8]


def test_residual_norms_one_per_loop():
    model = make("LT", n_loops=4)
    idx, targets = batch()
    with torch.no_grad():
        _, _, stats = model(idx, targets, return_stats=True)
        _, _, stats7 = model(idx, targets, n_loops=7, return_stats=True)
        xs = [x for _, x in model.loops(idx, 4)]
    assert stats["residual_norms"].shape == (4,) and stats7["residual_norms"].shape == (7,)
    assert torch.allclose(stats["residual_norms"].double(), torch.stack([x.norm(dim=-1).mean() for x in xs]))


def test_fresh_model_state_norm_is_sqrt_d():
    """Zero-initialised output projections: every block starts as the identity, so the
    residual stream is norm(x0), of norm sqrt(n_embd) per token, in every loop."""
    cfg = LoopedConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16, n_loops=3)
    _, loss, stats = LoopedTransformer(cfg)(batch()[0], batch()[1], return_stats=True)
    assert torch.allclose(stats["residual_norms"], torch.full((3,), 4.0), atol=1e-4)
    assert abs(loss.item() - math.log(V)) < 1e-3                     # lm head N(0, 1e-6): nearly uniform logits


def test_lm_head_init_std_follows_nanochat():
    big = LoopedConfig(vocab_size=256, block_size=8, n_embd=256, n_head=4)
    head = LoopedTransformer(big).lm_head.weight
    assert abs(head.std().item() - 1e-3) < 0.05e-3 and abs(head.mean().item()) < 0.05e-3
    assert torch.count_nonzero(LoopedTransformer(LoopedConfig(block_size=8, lm_head_std=0.0)).lm_head.weight) == 0


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    """With QK-norm each head's q and k are normalised after RoPE, so scaling W_Q and
    W_K changes nothing; without it, it sharpens the attention."""
    idx, _ = batch()
    outs = {}
    for qk_norm in (True, False):
        model = make("FLT", qk_norm=qk_norm)
        with torch.no_grad():
            before = model(idx)[0]
            for b in model.blocks:
                b.attn.W_Q.weight.mul_(3.0)
                b.attn.W_K.weight.mul_(3.0)
            outs[qk_norm] = (before - model(idx)[0]).abs().max().item()
    assert outs[True] < 1e-4 and outs[False] > 1.0, outs           # (not 0: the norm's eps)


def test_softcap_bounds_the_logits_and_off_leaves_them_raw():
    idx, _ = batch()
    capped, raw = make("FLT", softcap=2.0), make("FLT", softcap=0.0)
    with torch.no_grad():
        a, b = capped(idx)[0], raw(idx)[0]
        assert b.abs().max() > 2.0 and a.abs().max() < 2.0
        assert torch.allclose(a, 2.0 * torch.tanh(b / 2.0), atol=1e-6)


def test_switches_add_no_parameters_and_keep_one_function_at_one_loop():
    sizes = dict(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16)
    counts = {(q, c): LoopedTransformer(LoopedConfig(qk_norm=q, softcap=c, **sizes)).num_params()
              for q in (True, False) for c in (0.0, 15.0)}
    assert len(set(counts.values())) == 1


def test_step_and_few_losses_use_the_final_loop_for_lt_i_and_lt_ia():
    """As in the authors' code: STEP / FEW apply to LT, FLT_res, FLT; LT_i and LT_ia
    always take the loss on the final loop."""
    idx, targets = batch()
    for variant in ("LT_i", "LT_ia", "FLT"):
        model = make(variant, n_loops=4, loss_type="STEP")
        with torch.no_grad():
            per_loop = loop_losses(model, idx, targets)
            loss = model(idx, targets)[1]
        want = per_loop[-1] if variant != "FLT" else per_loop.mean()
        assert torch.allclose(loss, want, atol=1e-12), variant
    assert loss_loops("FEW", 12, "LT_ia") == [11] and loss_loops("FEW", 12, "LT") == [8, 9, 10, 11]


def test_targets_of_minus_one_carry_no_loss():
    model = make("FLT")
    idx, targets = batch()
    masked = targets.clone()
    masked[:, :10] = -1
    with torch.no_grad():
        logits, loss = model(idx, masked)
    want = torch.nn.functional.cross_entropy(logits[:, 10:].reshape(-1, V), targets[:, 10:].reshape(-1))
    assert torch.allclose(loss, want, atol=1e-10)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_causal_future_tokens_do_not_change_earlier_logits(variant):
    model = make(variant, n_loops=3)
    idx, _ = batch()
    idx2 = idx.clone()
    idx2[:, 10:] = (idx2[:, 10:] + 1) % V
    with torch.no_grad():
        a, b = model(idx)[0], model(idx2)[0]
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-10)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_muon_on_exactly_the_block_matrices_adamw_on_the_rest():
    model = LoopedTransformer(LoopedConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=192))
    adamw, muon = train_flt.build_optimizers(model, dict(train_flt.DEFAULTS, n_embd=192), "cpu")
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    block = {id(p) for p in model.blocks.parameters()}
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    assert in_muon == block and len(block) == 2 * 6                   # W_Q, W_K, W_V, W_O, fc, proj per block
    head, emb = adamw.param_groups
    assert head["params"] == [model.lm_head.weight] and emb["params"] == [model.tok_emb.weight]
    s = (192 / 768) ** -0.5                                           # = 2
    assert math.isclose(head["lr"], 0.004 * s) and math.isclose(emb["lr"], 0.2 * s)
    assert math.isclose(muon.param_groups[0]["lr"], 0.02) and muon.param_groups[0]["nesterov"]
    assert adamw.defaults["betas"] == (0.8, 0.95) and adamw.defaults["eps"] == 1e-10
    assert all(g["weight_decay"] == 0.0 for o in (adamw, muon) for g in o.param_groups)
    assert len(block) + 2 == len(list(model.parameters()))


def test_optimizer_groups_and_generate():
    model = LoopedTransformer(LoopedConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16))
    opt = model.configure_optimizers(0.1, 1e-3)
    decay, no_decay = opt.param_groups
    assert model.tok_emb.weight in no_decay["params"] and len(no_decay["params"]) == 1
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_params()
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), 20, top_k=5, n_loops=2)
    assert out.shape == (2, 23) and out.max() < V


@pytest.mark.parametrize("variant", ["LT_i", "FLT"])
def test_tiny_lm_learns_a_tiny_corpus(variant):
    text = b"the cat sat on the mat. " * 40
    data = torch.tensor(list(text))
    torch.manual_seed(0)
    cfg = LoopedConfig(vocab_size=256, block_size=32, n_layer=1, n_head=2, n_embd=32, n_loops=3, variant=variant)
    model = LoopedTransformer(cfg)
    opt = model.configure_optimizers(0.0, 3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(60):
        ix = torch.randint(0, len(data) - 33, (8,), generator=g)
        x = torch.stack([data[i:i + 32] for i in ix])
        y = torch.stack([data[i + 1:i + 33] for i in ix])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 5.0 and sum(losses[-5:]) / 5 < 1.5, (losses[0], losses[-5:])


def test_looped_py_copied_alone_into_an_empty_folder_builds_and_runs(tmp_path):
    """looped.py imports nothing from this project (it carries its own RoPE): copied
    alone into an empty folder, with that folder as cwd and sys.path[0], it builds a
    tiny model and computes a loss."""
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "looped.py"), tmp_path)
    (tmp_path / "probe.py").write_text(
        "import sys, torch\n"
        "import looped\n"
        "assert sys.path[0] == sys.argv[1], sys.path[:2]\n"
        "m = looped.LoopedTransformer(looped.LoopedConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2,\n"
        "                                                 n_embd=8, n_loops=2, variant='FLT'))\n"
        "x = torch.randint(0, 11, (2, 8))\n"
        "print(round(m(x, x)[1].item(), 3))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "probe.py", str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert abs(float(proc.stdout.strip()) - math.log(11)) < 0.01       # a fresh model: near-uniform logits


def test_rope_rotates_pairs_by_position_and_keeps_norms():
    """looped.py's own RoPE: position 0 is the identity, every position keeps each
    pair's length, and a query-key dot product depends only on their distance."""
    from looped import apply_rope, rope_tables
    cos, sin = rope_tables(10, 8)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8).expand(1, 1, 10, 8), torch.randn(1, 1, 1, 8).expand(1, 1, 10, 8)
    rq, rk = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    assert torch.allclose(rq[..., 0, :], q[..., 0, :])
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    dots = rq[0, 0] @ rk[0, 0].T                                       # (10, 10)
    assert torch.allclose(dots[2, 5], dots[4, 7], atol=1e-5) and torch.allclose(dots[0, 3], dots[6, 9], atol=1e-5)
    assert not torch.allclose(dots[2, 5], dots[2, 6], atol=1e-3)
