"""The chunked Triton path's torch pieces (mirasc/runtime/chunk_path.py, chunk_host.py), imported as they are: each
family's chunk-local preparation must hand the kernels (Wk, U, K, g) whose chunk form (1) of docs/kernels.md,
W_e = e^{g_e} W_0 - Σ_s e^{g_e - g_s} u_s K_sᵀ with u = Wk W_0ᵀ - U, reproduces the family's token recurrence,
written here in float64, chunk after chunk; and the decay layout's pieces (scores, decays, solves) their formulas.
The kernels themselves are checked through the emitted modules (tests/triton_backend)."""

import pytest
import torch

from mirasc.runtime import chunk_host, chunk_path

B, H, NT, N, DK, DV = 1, 2, 3, 5, 4, 3


def _chunks(x):
    return x.unflatten(2, (NT, N))


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    T = NT * N
    k = torch.nn.functional.normalize(rnd(B, H, T, DK), dim=-1)
    kappa = torch.nn.functional.normalize(rnd(B, H, T, DK), dim=-1)
    alpha = torch.sigmoid(rnd(B, H, T) + 2)
    eta = torch.sigmoid(rnd(B, H, T))
    eta_ch = torch.sigmoid(rnd(B, H, T, DK))
    return dict(q=rnd(B, H, T, DK), k=k, v=rnd(B, H, T, DV), kappa=kappa, alpha=alpha, eta=eta, eta_ch=eta_ch,
                w0=rnd(B, H, DV, DK))


def _chunk_states(w0, wc, wk, u, g):
    """The state after every chunk by the chunk form (1), from the kernels' inputs [B, H, NT, rows, ...]."""
    w, states = w0, []
    for c in range(NT):
        uu = (0 if wk is None else wk[:, :, c] @ w.transpose(-1, -2)) - u[:, :, c]  # u = Wk W_0ᵀ - U
        ge = g[:, :, c, -1]
        decay = torch.exp(ge[..., None] - g[:, :, c])  # e^{g_e - g_s}
        w = torch.exp(ge)[..., None, None] * w - (uu * decay[..., None]).transpose(-1, -2) @ wc[:, :, c]
        states.append(w)
    return torch.stack(states, 2)


def _token_states(x, step):
    """The state after every chunk's last token by the token recurrence W_t = step(W_{t-1}, t)."""
    w, states = x["w0"], []
    for t in range(NT * N):
        w = step(w, t)
        if t % N == N - 1:
            states.append(w)
    return torch.stack(states, 2)


def _outer(a, b):
    return a[..., :, None] * b[..., None, :]


def _mv(w, x):
    return (w @ x[..., None])[..., 0]


@pytest.fixture
def choices(monkeypatch):
    """Set the emitted module's choices the pieces read (each module's own binding)."""
    def set_(**values):
        for name, value in values.items():
            for mod in (chunk_host, chunk_path):
                if hasattr(mod, name):
                    monkeypatch.setattr(mod, name, value)
    return set_


def _prepare(x, prepare, decay=True, eta_k=False):
    g = _chunks(torch.log(x["alpha"])).cumsum(3) if decay else torch.zeros(B, H, NT, N, dtype=torch.float64)
    kc, vc = _chunks(x["k"]), _chunks(x["v"])
    wc = kc * _chunks(x["eta_ch"]) if eta_k else kc
    c = {"kappa": x["kappa"], "eta_ch": x["eta_ch"]}
    return prepare(_chunks(x["q"]), kc, vc, wc, c, _chunks(x["eta"]), g, _chunks, "ieee")


@pytest.mark.parametrize("pre", [True, False])
@pytest.mark.parametrize("implicit", [False, True])
@pytest.mark.parametrize("eta_k", [False, True])
def test_delta_preparation(choices, pre, implicit, eta_k):
    choices(PRE_DECAY=pre, IMPLICIT=implicit)
    choices(ETA_K=eta_k)
    x = _inputs(0)
    _, wc, wk, u, g = _prepare(x, chunk_path._delta_preparation, eta_k=eta_k)

    def step(w, t):
        k, v, a, eta = x["k"][:, :, t], x["v"][:, :, t], x["alpha"][:, :, t, None, None], x["eta"][:, :, t]
        beta = eta / (1 + eta * (k * k).sum(-1)) if implicit else eta
        read = a * w if pre else w
        w_key = k * x["eta_ch"][:, :, t] if eta_k else k
        return a * w - _outer(beta[..., None] * (_mv(read, k) - v), w_key)

    torch.testing.assert_close(_chunk_states(x["w0"], wc, wk, u, g), _token_states(x, step), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pre", [True, False])
def test_gdelta_read_kappa_preparation(choices, pre):
    choices(PRE_DECAY=pre, _ROWS_PER_TOKEN=1)
    x = _inputs(1)
    _, wc, wk, u, g = _prepare(x, chunk_path._gdelta_preparation)

    def step(w, t):
        k, v, kap, a, eta = (x[n][:, :, t] for n in ("k", "v", "kappa", "alpha", "eta"))
        read = a[..., None, None] * w if pre else w
        return a[..., None, None] * w - _outer(_mv(read, kap) - v, eta[..., None] * k)

    torch.testing.assert_close(_chunk_states(x["w0"], wc, wk, u, g), _token_states(x, step), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pre", [True, False])
@pytest.mark.parametrize("eta_k", [False, True])
def test_gdelta_erase_kappa_preparation(choices, pre, eta_k):
    """erase=kappa: an erase row and a write row per token, q on the write row."""
    choices(PRE_DECAY=pre, _ROWS_PER_TOKEN=2)
    choices(ETA_K=eta_k)
    x = _inputs(2)
    qc, wc, wk, u, g = _prepare(x, chunk_path._gdelta_preparation, eta_k=eta_k)
    assert qc.shape[3] == 2 * N and bool((qc[:, :, :, 0::2] == 0).all())
    torch.testing.assert_close(qc[:, :, :, 1::2], _chunks(x["q"]))

    def step(w, t):
        k, v, kap, a, eta = (x[n][:, :, t] for n in ("k", "v", "kappa", "alpha", "eta"))
        rate = eta[..., None] * (x["eta_ch"][:, :, t] if eta_k else 1)
        read = a[..., None, None] * w if pre else w
        return a[..., None, None] * w - _outer(_mv(read, kap), rate * kap) + _outer(v, k)

    torch.testing.assert_close(_chunk_states(x["w0"], wc, wk, u, g), _token_states(x, step), rtol=1e-10, atol=1e-10)


def test_minibatch_and_hebbian_preparations():
    """Mini-batch l2 takes every token's gradient at the chunk's anchor W_0; the Hebbian write adds η v kᵀ."""
    x = _inputs(3)
    _, wc, wk, u, g = _prepare(x, chunk_path._minibatch_preparation)
    w, expect = x["w0"], []
    for c in range(NT):
        anchor = w
        for t in range(c * N, (c + 1) * N):
            k, v, a, eta = (x[n][:, :, t] for n in ("k", "v", "alpha", "eta"))
            w = a[..., None, None] * w - _outer(eta[..., None] * (_mv(anchor, k) - v), k)
        expect.append(w)
    torch.testing.assert_close(_chunk_states(x["w0"], wc, wk, u, g), torch.stack(expect, 2), rtol=1e-10, atol=1e-10)

    _, wc, wk, u, g = _prepare(x, chunk_path._hebbian_preparation)
    assert wk is None

    def step(w, t):
        k, v, a, eta = (x[n][:, :, t] for n in ("k", "v", "alpha", "eta"))
        return a[..., None, None] * w + _outer(eta[..., None] * v, k)

    torch.testing.assert_close(_chunk_states(x["w0"], wc, wk, u, g), _token_states(x, step), rtol=1e-10, atol=1e-10)


def test_head_decay_pieces(choices):
    x = _inputs(4)
    a, b = _chunks(x["q"]), _chunks(x["k"])
    gx, gy = torch.randn(B, H, NT, N, dtype=torch.float64), _chunks(torch.log(x["alpha"])).cumsum(3)
    p = chunk_host._pair_scores(a, b, gx, gy)
    for t in range(N):
        for s in range(N):
            dot = (a[..., t, :] * b[..., s, :]).sum(-1)
            want = torch.exp(gx[..., t] - gy[..., s]) * dot if s < t else torch.zeros_like(dot)
            torch.testing.assert_close(p[..., t, s], want)
    lower = p.tril(-1) * 0.1
    rights = (torch.randn(B, H, NT, N, 2, dtype=torch.float64), torch.randn(B, H, NT, N, 3, dtype=torch.float64))
    eye = torch.eye(N, dtype=torch.float64)
    for r, sol in zip(rights, chunk_path._unit_lower_solves(lower, rights)):
        torch.testing.assert_close((eye + lower) @ sol, r)
    choices(PRE_DECAY=False)
    shifted = chunk_host._read_exponents(gy)
    torch.testing.assert_close(shifted[..., 1:], gy[..., :-1])
    assert bool((shifted[..., 0] == 0).all())
    choices(PRE_DECAY=True)
    assert chunk_host._read_exponents(gy) is gy


def test_chunk_decays(choices):
    """The log-decays' sums inside each chunk, α = 0 clamped to the smallest normal float, zeros without a decay."""
    alpha = torch.rand(B, H, 7, dtype=torch.float32) * 0.9 + 0.05
    alpha[0, 0, 2] = 0.0
    n, nt, pad = 3, 3, 2

    def chunks(x):
        return torch.nn.functional.pad(x, (0, pad)).unflatten(2, (nt, n))

    choices(DECAY=False)
    assert bool((chunk_host._chunk_decays({"alpha": alpha}, chunks, B, H, nt, n, "cpu") == 0).all())
    choices(DECAY=True)
    g = chunk_host._chunk_decays({"alpha": alpha}, chunks, B, H, nt, n, "cpu")
    la = torch.log(alpha.clamp_min(torch.finfo(torch.float32).tiny))
    want = torch.nn.functional.pad(la, (0, pad)).unflatten(2, (nt, n)).cumsum(3)
    torch.testing.assert_close(g, want)
    assert torch.isfinite(g).all()


def test_chunk_tiles_and_precision(choices):
    """The chunk tile's rows (a power of two >= 16; two rows per token for erase=kappa) and the interpreter's widened
    16-bit dots."""
    assert [chunk_host._tile_rows(n) for n in (1, 16, 17, 64)] == [16, 16, 32, 64]
    choices(_ROWS_PER_TOKEN=2)
    assert chunk_host._chunk_tile(33) == 32  # 16 tokens, 32 rows
    choices(_ROWS_PER_TOKEN=1)
    assert chunk_host._chunk_tile(33) == 64
    assert chunk_host._launch_prec("ieee") == "ieee"
