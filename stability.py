"""
Paper B's stability measurements ("Simply Stabilizing the Loop via a Fully Looped
Transformer"): what train_flt.py records during a run, and how a run's curves are read.

  BlockGradRecorder   the gradient norm per (loop, block), as the authors' base_check.py logs it
  grad_norm           the total gradient L2 norm (what clip_grad_norm_ measures)

The statistics of a run's curves, in every summary.json (each docstring says what it measures):
  grad_volatility     how much the gradient norm moves from step to step, noise included
  grad_dlog_ac1, grad_zigzag   two tests of oscillation that tell a zig-zag from noise
  outcome             THE rule on a run's whole val curve: diverged / did not learn / collapsed /
                      lagging / learned. Every run's last line and summary say it.
  gradient_statistics, residual_statistics   the summary's fields, computed from log.jsonl
  separation_verdict  when one variant beats another on the same seeds, or "not separated"
"""

import math

import numpy as np
import torch

COLLAPSE_MARGIN = 0.05   # nats: a difference of val loss smaller than this is not read as a difference
NEAR_SHARE = 0.2         # "near the unigram level": within this share of the reference's gain below it
LOST_SHARE = 0.25        # a run that gave back more than this share of its best gain "lost what it learned"


# --- during a run: the gradients -------------------------------------------------------

def grad_norm(parameters):
    """Total L2 norm of the gradients (what clip_grad_norm_ measures)."""
    norms = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.zeros(())


class BlockGradRecorder:
    """||dL/dy||_2 of three outputs y per (loop, block), as the authors' base_check.py
    logs them: the block's ("out"), its attention's ("attn") and its MLP's ("mlp").
    norms(): per kind, n_loops lists of n_layer numbers, averaged over micro-batches."""

    # A forward hook on each module registers, on its output in loop t (a module runs once per loop,
    # so its call count gives t), a tensor hook that adds the norm over the micro-batch, on this rank
    # (before DDP averaging). Forwards without grad are skipped, and compiled ones too (the hooks would
    # break the graph): with --compile, train_flt.py runs the recorder's steps on the eager module.
    KINDS = ("out", "attn", "mlp")

    def __init__(self, blocks, enabled=True):
        self.sums, self.enabled = None, enabled
        for i, block in enumerate(blocks):
            for kind, module in zip(self.KINDS, (block, block.attn, block.mlp)):
                module.register_forward_hook(lambda m, args, out, key=(kind, i): self._forward(key, out))

    def start(self, n_loops, n_layer, on=True):   # before each step; on=False: nothing this step
        self.sums = {k: np.zeros((n_loops, n_layer)) for k in self.KINDS} if self.enabled and on else None

    def next_micro(self):                      # before each micro-batch's forward
        self.calls = {}

    def _forward(self, key, out):
        if torch.compiler.is_compiling() or self.sums is None or not (torch.is_grad_enabled() and out.requires_grad):
            return
        (kind, i), t = key, self.calls.get(key, 0)
        self.calls[key] = t + 1
        if t < len(self.sums[kind]):
            out.register_hook(lambda g: self._add(kind, t, i, g))

    def _add(self, kind, t, i, g):
        self.sums[kind][t, i] += g.norm().item()

    def norms(self, n_micro):
        """{kind: n_loops lists of n_layer numbers}; {} when nothing is recorded."""
        return {k: [[round(v / n_micro, 6) for v in row] for row in self.sums[k]] for k in self.KINDS} if self.sums else {}


# --- the statistics of a run's curves ---------------------------------------------------

def dlog(g):
    """d_t = log g_{t+1} - log g_t of a positive series (zeros clipped to 1e-30)."""
    return np.diff(np.log(np.maximum(np.asarray(g, dtype=float), 1e-30)))


def grad_volatility(g):
    """std of d_t = log g_{t+1} - log g_t: how much the gradient norm moves from one step to the
    next, whatever the pattern (noise, spikes or a zig-zag alike). NaN under 2 steps."""
    d = dlog(g)
    return float(np.std(d)) if len(d) else float("nan")


def grad_dlog_ac1(g):
    """The lag-1 autocorrelation of d_t = log g_{t+1} - log g_t: -1 for a period-2 zig-zag (up,
    down, up, ...), -0.5 for independent noise around a trend and for isolated spikes, near 0 for
    a random walk, towards +1 for slow swings (noise on top of them pulls it back towards -0.5).
    So an oscillation reads clearly below -0.5 and noise at -0.5. NaN under 4 steps."""
    d = dlog(g)
    if len(d) < 3:
        return float("nan")
    d = d - d.mean()
    return float((d[:-1] * d[1:]).sum() / max((d * d).sum(), 1e-30))


def grad_zigzag(g):
    """-rho_1 of r, where r_t = log g_t - mean(log g_{t-2..t+2}) (the trace minus its centred 5-step
    running mean, over steps with a full window) and rho_1 is the lag-1 autocorrelation. Minibatch
    noise, independent from step to step around a slow trend, gives 0.3 (exactly, for i.i.d. noise:
    the running mean shares each point with its neighbours); a zig-zag (up, down, up, ...) gives
    close to 1; slow swings over many steps give less than noise. NaN under 8 steps."""
    x = np.log(np.maximum(np.asarray(g, dtype=float), 1e-30))
    if len(x) < 8:
        return float("nan")
    r = x[2:-2] - np.convolve(x, np.ones(5) / 5, mode="valid")
    r = r - r.mean()
    return float(-(r[:-1] * r[1:]).sum() / max((r * r).sum(), 1e-30))


def outcome(losses, h_unigram, ref_losses=None, margin=COLLAPSE_MARGIN):
    """THE rule that says what a run of train_flt.py did: its run's last line and its
    summary.json ("outcome", "outcome_reason") say this, and the tables read nothing else.
    It reads the run's whole val curve (`losses`, at steps s_1..s_n) against H = h_unigram,
    the loss of a context-free model, and, when given, the 1-loop reference run's curve at
    the same steps (`ref_losses`: same recipe, lr, budget and eval set). "Near H" means
    within max(margin, NEAR_SHARE x the reference's gain H - min(ref_losses)) of it; within
    margin without a reference. Returns (verdict, reason):
      diverged       the loss or the gradient became NaN or inf (the run stopped there)
      undetermined   the reference itself never came `margin` below H
      did not learn  its best val loss stays near H: "never learned"
      collapsed      it learned, then ended near H again ("back at the unigram level"), or
                     ended more than max(margin, LOST_SHARE x its best gain H - min(losses))
                     above its own best ("lost what it learned")
      lagging        (a reference given) behind it at the last step by more than `margin`, without
                     having lost what it learned; the reason says whether it is still improving (its
                     last loss more than `margin` below the one a third of the curve earlier) or stalled
      learned        otherwise: with a reference, within `margin` of it at the last step or
                     better ("like the reference")
    A slow learner is "lagging", a spike that recovers is judged by where it ends."""
    losses = np.asarray(losses, dtype=float)
    ref = None if ref_losses is None else np.asarray(ref_losses, dtype=float)
    if len(losses) == 0 or not np.all(np.isfinite(losses)):
        return "diverged", "a NaN or inf loss"
    if ref is not None and len(ref) != len(losses):
        raise ValueError(f"the run's val curve has {len(losses)} points and the reference's {len(ref)}: "
                         f"they must be taken at the same steps")
    if ref is not None and h_unigram - ref.min() < margin:
        return "undetermined", "the reference never learned"
    best, final = losses.min(), losses[-1]
    near = margin if ref is None else max(margin, NEAR_SHARE * (h_unigram - ref.min()))
    if h_unigram - best < near:
        return "did not learn", "never learned"
    if h_unigram - final < near:
        return "collapsed", "back at the unigram level"
    if final - best > max(margin, LOST_SHARE * (h_unigram - best)):
        return "collapsed", "lost what it learned"
    if ref is not None and final > ref[-1] + margin:
        earlier = losses[len(losses) - 1 - max(1, len(losses) // 3)]
        return "lagging", "still improving" if final < earlier - margin else "stalled"
    return "learned", "like the reference" if ref is not None else "below the unigram level"


SEVERITY = {"learned": 0, "lagging": 1, "collapsed": 2, "did not learn": 2, "diverged": 3}   # "undetermined": none


def separation_verdict(a, b, a_name="A", b_name="B"):
    """Are two variants apart on the same seeds (B4-B6: FLT_res, LT_i, LT_ia against
    FLT)? a, b: {seed: (final val loss, outcome)}, the outcome from `outcome` (which
    reads the whole val curve against the seed's reference).
      "<B> beats <A>": on every shared seed (3 at least) B's final val loss is below A's
                       by more than the seed-to-seed spread (the larger sample sd of the
                       two variants' final losses over those seeds), and B's outcome is
                       no worse than A's (learned < lagging < collapsed = did not learn
                       < diverged);
      "<A> beats <B>": the same the other way round;
      "not separated": otherwise, a gap inside the spread included."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 3:
        return f"too few seeds ({len(seeds)} shared; 3 needed)"
    fa, fb = np.array([a[s][0] for s in seeds]), np.array([b[s][0] for s in seeds])
    spread = max(np.std(fa, ddof=1), np.std(fb, ddof=1))
    no_worse = lambda x, y: all(SEVERITY.get(x[s][1], 9) <= SEVERITY.get(y[s][1], 9) for s in seeds)
    if np.all(np.isfinite(fb)) and np.all(fa - fb > spread) and no_worse(b, a):
        return f"{b_name} beats {a_name}"
    if np.all(np.isfinite(fa)) and np.all(fb - fa > spread) and no_worse(a, b):
        return f"{a_name} beats {b_name}"
    return "not separated"


def judge_curves(val, ref, final_loss, h_unigram):
    """`outcome` on a val curve {step: loss}, against a reference's {step: loss} (or None)
    at the steps both have; a run whose final loss is not finite diverged."""
    steps = sorted(val if ref is None else set(val) & set(ref))
    return outcome([val[k] for k in steps] if math.isfinite(final_loss) else [], h_unigram,
                   None if ref is None else [ref[k] for k in steps])


# --- the summary's fields, from the log --------------------------------------------------

def gradient_statistics(g):
    """The summary's gradient fields from g, the total gradient L2 norms before clipping of
    the first N = osc_steps steps (fewer if the run is shorter): grad_volatility,
    grad_dlog_ac1 and grad_zigzag (defined above), and the largest norm."""
    return {"grad_volatility": grad_volatility(g), "grad_dlog_ac1": grad_dlog_ac1(g),
            "grad_zigzag": grad_zigzag(g), "grad_osc_steps": len(g),
            "max_grad_norm": float(max(g)) if len(g) else float("nan")}


def residual_statistics(steps, n_loops):
    """The summary's residual-norm fields, per loop (the residual norm of the log):
    at the first and last step; residual_norm_peak / _peak_step, its maximum over
    training and the step where it occurs; and the largest over loops and steps."""
    if not steps:
        return {"residual_norm_first": [], "residual_norm_last": [], "residual_norm_peak": [],
                "residual_norm_peak_step": [], "max_residual_norm": float("nan")}
    res = np.array([[np.inf if v is None else v for v in rec["residual_norms"]] for rec in steps],
                   dtype=float).reshape(len(steps), n_loops)              # null in the log: inf (strict JSON)
    return {"residual_norm_first": res[0].tolist(), "residual_norm_last": res[-1].tolist(),
            "residual_norm_peak": res.max(0).tolist(),
            "residual_norm_peak_step": [steps[i]["step"] for i in res.argmax(0)],
            "max_residual_norm": float(res.max())}
