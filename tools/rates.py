"""Take-off rates: the rule for all-or-nothing seeds, written down before the runs it judges.

On PathFinder a seed either takes off (leaves chance, `lra_rescue.take_off_epoch`) or
stays stuck; little lies between. So an arm is measured by a count, k of its n seeds, not
by a mean accuracy, and two arms are compared by their counts:

    per arm      k of n took off, with an exact 95% interval (Clopper & Pearson 1934)
    two arms     a one-sided Fisher exact test on the 2x2 table of counts (Fisher 1922)
    how early    the Kaplan-Meier median take-off epoch, a stuck seed censored at the
                 arm's last epoch; a log-rank test beside it (Mantel 1966)
    beside them  the test accuracy of the seeds that took off

Only the standard library: a binomial tail, a hypergeometric tail and a normal tail.
tests/test_tools.py checks the rule on made-up counts, and tools/lra_rescue.py applies it.
"""

import math

ALPHA = 0.05          # the one-sided level of the Fisher test, fixed before the runs
MIN_SEEDS = 3         # below this an arm gets no verdict


def binomial_cdf(k, n, p):
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k, n, level=0.95):
    """The exact interval (lo, hi) of a rate from k successes in n trials: lo solves
    P(X >= k | lo) = (1 - level) / 2 and hi solves P(X <= k | hi) = (1 - level) / 2
    (0 and 1 at the ends, k = 0 and k = n). Found by bisection on the binomial tail."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"clopper_pearson: need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    tail = (1 - level) / 2

    def solve(f):                                   # f falls as p grows: the p where f(p) = tail
        a, b = 0.0, 1.0
        for _ in range(60):
            m = (a + b) / 2
            a, b = (m, b) if f(m) > tail else (a, m)
        return (a + b) / 2
    lo = 0.0 if k == 0 else solve(lambda p: binomial_cdf(k - 1, n, p) - (1 - 2 * tail))   # P(X >= k | lo) = tail
    hi = 1.0 if k == n else solve(lambda p: binomial_cdf(k, n, p))                        # P(X <= k | hi) = tail
    return lo, hi


def fisher_greater(k1, n1, k2, n2):
    """One-sided Fisher exact test: P(at least k1 of arm 1's seeds take off), given
    k1 + k2 take-offs among the n1 + n2 seeds, if the two arms had one rate. Small: arm 1
    takes off more often. (3 of 3 against 1 of 3 gives 4/20 = 0.2.)"""
    total, off = n1 + n2, k1 + k2
    p = lambda x: math.comb(off, x) * math.comb(total - off, n1 - x) / math.comb(total, n1)
    return sum(p(x) for x in range(k1, min(off, n1) + 1))


def rate_verdict(k, n, base_k, base_n, alpha=ALPHA):
    """An arm's take-off count against the baseline's (recorded from-scratch seeds):
        "takes off more often": fisher_greater(arm, base) < alpha;
        "takes off less often": fisher_greater(base, arm) < alpha;
        "not separated": neither (with few seeds, even 3 of 3 against 0 of 3: p = 0.05);
        "too few seeds": an arm with under MIN_SEEDS seeds."""
    if n < MIN_SEEDS or base_n < MIN_SEEDS:
        return f"too few seeds ({MIN_SEEDS} per arm needed)"
    if fisher_greater(k, n, base_k, base_n) < alpha:
        return "takes off more often"
    if fisher_greater(base_k, base_n, k, n) < alpha:
        return "takes off less often"
    return "not separated"


def km_median(epochs, last):
    """The Kaplan-Meier median of the take-off epoch: the first epoch at which the share
    of seeds still stuck falls to 1/2 or below. epochs: one a seed, None for a stuck one
    (censored at `last`, the arm's final epoch). None when the median is not reached
    (fewer than half the seeds take off): it lies past `last`."""
    times = sorted(e for e in epochs if e is not None)
    at_risk, stuck_share = len(epochs), 1.0
    for t in sorted(set(times)):
        events = times.count(t)
        stuck_share *= 1 - events / at_risk          # S(t) = prod (1 - d_t / n_t)
        at_risk -= events
        if stuck_share <= 0.5:
            return t
    return None


def logrank(epochs1, last1, epochs2, last2):
    """The log-rank test of "arm 1 takes off earlier than arm 2": (z, one-sided p).
    At each epoch where a seed takes off, arm 1 expects its share of the seeds at risk;
    z = (observed - expected) / sqrt(variance), summed over those epochs, and p = P(Z >= z)
    under a normal law (an approximation, rough at 3-10 seeds: read it beside the counts).
    A stuck seed is at risk until its arm's last epoch. (z, p) = (0, 0.5) with no take-off."""
    seeds = [(e if e is not None else last1, e is not None, 1) for e in epochs1] + \
            [(e if e is not None else last2, e is not None, 2) for e in epochs2]
    o_minus_e, var = 0.0, 0.0
    for t in sorted({s[0] for s in seeds if s[1]}):
        risk = [s for s in seeds if s[0] >= t]
        n, n1 = len(risk), sum(s[2] == 1 for s in risk)
        d = sum(1 for s in risk if s[0] == t and s[1])
        d1 = sum(1 for s in risk if s[0] == t and s[1] and s[2] == 1)
        o_minus_e += d1 - d * n1 / n
        var += d * (n1 / n) * (1 - n1 / n) * (n - d) / (n - 1) if n > 1 else 0.0
    if var == 0:
        return 0.0, 0.5
    z = o_minus_e / math.sqrt(var)
    return z, 0.5 * math.erfc(z / math.sqrt(2))


def rate_row(epochs, last, accs):
    """One arm's measures: dict(k, n, lo, hi, median, acc_off) where acc_off lists the test
    accuracies of the seeds that took off. epochs, accs: one a seed, in the same order."""
    k, n = sum(e is not None for e in epochs), len(epochs)
    lo, hi = clopper_pearson(k, n)
    return dict(k=k, n=n, lo=lo, hi=hi, median=km_median(epochs, last),
                acc_off=[a for e, a in zip(epochs, accs) if e is not None])
