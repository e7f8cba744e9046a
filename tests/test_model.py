"""model.py: the two attention paths agree, padding is invisible, every option
trains, parameter groups are what they say, bad input is refused clearly."""

import math

import pytest
import torch
import torch.nn.functional as F

import model as model_lib
from model import POOLINGS, POS_ENCODINGS, Transformer, TransformerConfig, select_params


def small(**kw):
    base = dict(vocab_size=12, n_classes=3, max_len=24, n_layer=2, n_head=4, n_embd=32)
    return Transformer(TransformerConfig(**{**base, **kw})).eval()


def tokens(B=3, T=20, vocab=10, seed=0):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def ragged_mask(B=3, T=20):
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 14:] = True
    mask[2, 5:] = True
    return mask


@pytest.mark.parametrize("pos_enc", POS_ENCODINGS)
def test_sdpa_path_equals_explicit_attention_path(pos_enc):
    torch.manual_seed(0)
    model, idx, mask = small(pos_enc=pos_enc), tokens(), ragged_mask()
    fused = model(idx, mask)
    explicit, maps = model.forward_with_maps(idx, mask)
    assert torch.allclose(fused, explicit, atol=1e-5)
    assert len(maps) == 2 and maps[0].shape == (3, 4, 20, 20)
    assert torch.allclose(maps[0].sum(-1), torch.ones(3, 4, 20), atol=1e-5)


@pytest.mark.parametrize("pos_enc", POS_ENCODINGS)
@pytest.mark.parametrize("pool", POOLINGS)
def test_padding_changes_no_output_of_real_tokens(pos_enc, pool):
    torch.manual_seed(0)
    model = small(pos_enc=pos_enc, pool=pool)
    idx, mask = tokens(), ragged_mask()
    other_pads = idx.masked_fill(mask, 11)                # different ids under the pads
    h1, maps = model.forward_with_maps(idx, mask)
    h2 = model(other_pads, mask)
    real = ~mask
    assert torch.allclose(h1[real], h2[real], atol=1e-5)
    assert torch.allclose(model.classify(idx, mask), model.classify(other_pads, mask), atol=1e-5)
    offset = 1 if pool == "cls" else 0                   # the [CLS] key sits at position 0
    assert maps[0][0, :, :, 14 + offset:].abs().max() == 0   # padded keys get no attention
    # row 2 has 5 real tokens: the same as running it alone without padding
    alone = model.classify(idx[2:3, :5])
    assert torch.allclose(model.classify(idx, mask)[2], alone[0], atol=1e-5)


@pytest.mark.parametrize("pos_enc", POS_ENCODINGS)
@pytest.mark.parametrize("pool", POOLINGS)
def test_every_option_gives_gradients_to_every_parameter(pos_enc, pool):
    torch.manual_seed(0)
    model = small(pos_enc=pos_enc, pool=pool, n_layer=1).train()
    idx, mask = tokens(), ragged_mask()
    loss = F.cross_entropy(model.classify(idx, mask), torch.tensor([0, 1, 2])) \
        + model.reconstruct(idx, mask).logsumexp(-1).mean()
    loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert no_grad == []


def test_positional_encodings_differ_and_none_is_permutation_equivariant():
    torch.manual_seed(0)
    idx = tokens(B=1)
    perm = torch.randperm(20)
    model = small(pos_enc="none")
    assert torch.allclose(model(idx)[:, perm], model(idx[:, perm]), atol=1e-5)
    for pe in ("sinusoidal", "learned", "rope", "alibi"):
        torch.manual_seed(0)
        model = small(pos_enc=pe)
        for block in model.blocks:   # sharp attention, so RoPE's effect on scores shows
            torch.nn.init.normal_(block.attn.W_Q.weight)
            torch.nn.init.normal_(block.attn.W_K.weight)
        assert not torch.allclose(model(idx)[:, perm], model(idx[:, perm]), atol=1e-3), pe


def test_pair_input_encodes_both_documents_with_one_encoder():
    torch.manual_seed(0)
    model = small(pair=True)
    idx = torch.stack([tokens(seed=1), tokens(seed=2)], dim=1)          # (B, 2, T)
    mask = torch.stack([ragged_mask(), torch.zeros(3, 20, dtype=torch.bool)], dim=1)
    logits = model.classify(idx, mask)
    assert logits.shape == (3, 3)
    swapped = model.classify(idx.flip(1), mask.flip(1))
    assert not torch.allclose(logits, swapped)                           # u - v is ordered
    with pytest.raises(ValueError, match=r"\(B, 2, T\)"):
        model.classify(tokens())


GROUPS_THAT_PARTITION = ("attn", "mlp", "emb", "norm", "head")


@pytest.mark.parametrize("pos_enc,pool", [("learned", "cls"), ("sinusoidal", "mean")])
def test_param_groups_partition_all_and_nest(pos_enc, pool):
    model = small(pos_enc=pos_enc, pool=pool)
    groups = {g: set(select_params(model, g)) for g in GROUPS_THAT_PARTITION}
    everything = set(select_params(model, "all"))
    assert everything == {n for n, _ in model.named_parameters()}
    assert set().union(*groups.values()) == everything
    for a in GROUPS_THAT_PARTITION:
        for b in GROUPS_THAT_PARTITION:
            if a < b:
                assert not groups[a] & groups[b], (a, b)
    qk, qkv = set(select_params(model, "qk")), set(select_params(model, "qkv"))
    assert qk < qkv < groups["attn"]
    assert all(".W_Q." in n or ".W_K." in n for n in qk) and len(qk) == 2 * 2 * 2   # 2 layers x (W, b)
    assert set(select_params(model, "qk,mlp")) == qk | groups["mlp"]


def test_one_layer_model_overfits_a_tiny_batch():
    torch.manual_seed(0)
    model = small(n_layer=1, n_classes=2).train()
    idx, labels = tokens(B=8, T=16, seed=3), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    opt = model.configure_optimizers(weight_decay=0.0, learning_rate=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(model.classify(idx), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert (model.classify(idx).argmax(-1) == labels).all()


def test_optimizer_decays_only_matrices():
    model = small(pos_enc="learned", pool="cls")
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[i].endswith(".weight") and "ln" not in names[i] and "emb" not in names[i]
               for i in decayed)
    assert id(model.blocks[0].attn.W_Q.weight) in decayed
    assert id(model.tok_emb.weight) not in decayed and id(model.cls_token) not in decayed


@pytest.mark.parametrize("kwargs,message", [
    (dict(pos_enc="relative"), r"pos_enc='relative' is unknown.*sinusoidal"),
    (dict(pool="sum"), r"pool='sum' is unknown.*mean"),
    (dict(n_embd=30, n_head=4), r"n_embd=30 is not divisible by n_head=4"),
    (dict(n_layer=0), r"n_layer=0 must be a positive integer"),
])
def test_bad_config_is_refused_with_the_allowed_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**kwargs)


def test_bad_input_is_refused_clearly():
    model = small()
    with pytest.raises(ValueError, match=r"length 30 exceeds max_len=24"):
        model(tokens(T=30))
    with pytest.raises(ValueError, match=r"token id 12 is outside the vocabulary \[0, 12\)"):
        model(torch.full((1, 5), 12))
    with pytest.raises(ValueError, match=r"unknown parameter group 'attention'"):
        select_params(model, "attention")


@pytest.mark.parametrize("pos_enc", ["sinusoidal", "alibi"])
def test_causal_reconstruction_never_sees_the_future(pos_enc):
    torch.manual_seed(0)
    model = small(pos_enc=pos_enc)
    idx = tokens(B=1)
    changed = idx.clone()
    changed[0, 12:] = (changed[0, 12:] + 1) % 10
    a, b = model.reconstruct(idx, causal=True), model.reconstruct(changed, causal=True)
    assert torch.allclose(a[0, :12], b[0, :12], atol=1e-5)
    assert not torch.allclose(a[0, 12:], b[0, 12:], atol=1e-4)
    _, maps = model.forward_with_maps(idx, causal=True)
    assert maps[0][0, :, 3, 4:].abs().max() == 0


def test_torch_init_is_pytorchs_default_layer_init_and_gpt2_is_small():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=300, n_embd=256, n_head=4, init="torch"))
    W = model.blocks[0].attn.W_Q.weight
    bound = 1 / math.sqrt(256)                        # kaiming_uniform(a=sqrt(5)): U(-1/sqrt(fan_in), ..)
    assert W.abs().max() <= bound and W.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    assert model.blocks[0].attn.W_Q.bias.abs().max() <= bound and model.blocks[0].attn.W_Q.bias.std() > 0
    assert model.tok_emb.weight.std().item() == pytest.approx(1.0, rel=0.02)   # nn.Embedding: N(0, 1)
    reference = torch.nn.Linear(256, 256)             # the same law as a fresh PyTorch layer
    assert W.std().item() == pytest.approx(reference.weight.std().item(), rel=0.03)
    gpt2 = Transformer(TransformerConfig(vocab_size=300, n_embd=256, n_head=4, init="gpt2"))
    assert gpt2.blocks[0].attn.W_Q.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert gpt2.blocks[0].attn.W_Q.bias.abs().max() == 0
    with pytest.raises(ValueError, match="init='xavier' is unknown"):
        TransformerConfig(init="xavier")


# --- Amos et al.'s tied attention init and their linear pixel encoder

ATTN = ("W_Q", "W_K", "W_V", "W_O")


def test_amos_init_copies_one_linear_into_q_k_v_o_and_one_step_unties_them():
    torch.manual_seed(0)
    model = small(init="amos").train()
    for block in model.blocks:
        first = getattr(block.attn, ATTN[0])
        for name in ATTN[1:]:
            other = getattr(block.attn, name)
            assert torch.equal(other.weight, first.weight) and torch.equal(other.bias, first.bias)
            assert other.weight is not first.weight                   # copies, not one shared tensor
    assert not torch.equal(model.blocks[0].attn.W_Q.weight, model.blocks[1].attn.W_Q.weight)
    bound = 1 / math.sqrt(32)                                         # the rest: PyTorch's defaults
    assert model.blocks[0].mlp.fc.weight.abs().max() <= bound and model.tok_emb.weight.std() > 0.8
    opt = model.configure_optimizers(weight_decay=0.0, learning_rate=1e-3)
    idx = tokens()
    loss = F.cross_entropy(model.classify(idx), torch.tensor([0, 1, 2])) + model.reconstruct(idx).logsumexp(-1).mean()
    loss.backward()
    opt.step()
    for block in model.blocks:
        weights = [getattr(block.attn, n).weight for n in ATTN]
        assert all(not torch.equal(a, b) for i, a in enumerate(weights) for b in weights[i + 1:])


def test_pixel_features_read_grey_in_minus_one_one_and_flag_only_the_mask():
    idx = torch.tensor([[0, 255, 127, 128, 257, 256]])               # ..., [MASK], pad
    feats = model_lib.pixel_features(idx, levels=256, mask_id=257)[0]
    assert torch.allclose(feats[:, 0], torch.tensor([-1.0, 1.0, -1 / 255, 1 / 255, 0.0, 0.0]), atol=1e-6)
    assert feats[:, 1].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def pixels(B=3, T=16, seed=0):
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


def test_linear_pixel_encoder_hides_a_masked_pixel_and_predicts_256_grey_levels():
    torch.manual_seed(0)
    model = small(vocab_size=258, pixel_encoder="linear", max_len=16)
    assert not hasattr(model, "tok_emb") and model.pix_emb.in_features == 2
    a, b = pixels(seed=1), pixels(seed=2)
    hide = torch.zeros_like(a, dtype=torch.bool)
    hide[:, 3:9] = True
    b = torch.where(hide, b, a)                                       # differ only under the mask
    assert not torch.equal(a, b)
    masked_a, masked_b = a.masked_fill(hide, 257), b.masked_fill(hide, 257)
    assert torch.equal(model.embed(masked_a), model.embed(masked_b))
    assert torch.equal(model.reconstruct(masked_a), model.reconstruct(masked_b))
    assert model.reconstruct(masked_a).shape == (3, 16, 256)           # Amos et al.'s 256-way CE
    grey = model.embed(torch.full((1, 1), 128))                       # the grey closest to 0 ...
    assert not torch.allclose(grey, model.embed(torch.full((1, 1), 257)))   # ... is not [MASK]
    darker = a.clone()
    darker[0, 0] = (a[0, 0] + 100) % 256                             # an unmasked pixel is seen
    assert not torch.allclose(model.reconstruct(darker)[0, 5], model.reconstruct(a)[0, 5])


@pytest.mark.parametrize("pixel_encoder", model_lib.PIXEL_ENCODERS)
@pytest.mark.parametrize("init", model_lib.INITS)
def test_both_pixel_encoders_train_under_every_init(pixel_encoder, init):
    torch.manual_seed(0)
    model = small(vocab_size=258, pixel_encoder=pixel_encoder, init=init, max_len=16, n_layer=1).train()
    idx, labels = pixels(B=8, seed=3), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    idx[:, 0] = torch.tensor([0, 255, 255, 0, 255, 0, 0, 255])      # the label is the first pixel
    loss = F.cross_entropy(model.classify(idx), labels) + model.reconstruct(idx).logsumexp(-1).mean()
    loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0] == []
    opt = model.configure_optimizers(weight_decay=0.0, learning_rate=3e-3)
    for _ in range(100):
        opt.zero_grad()
        loss = F.cross_entropy(model.classify(idx), labels)
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


@pytest.mark.parametrize("kwargs,message", [
    (dict(pixel_encoder="conv"), r"pixel_encoder='conv' is unknown.*linear"),
    (dict(pixel_encoder="linear", vocab_size=258, mask_id=100), r"2 <= pixel_levels <= mask_id < vocab_size"),
    (dict(pixel_encoder="linear", vocab_size=34), r"got pixel_levels=256, mask_id=257, vocab_size=34"),
])
def test_bad_pixel_encoder_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**kwargs)
