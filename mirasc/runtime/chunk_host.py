"""The chunk kernels' host side, shared by every chunk family (a runtime piece: the functions an emitted module's
chunked Triton section names are copied into it by mirasc.codegen.triton_chunked): which kernel and tiles a launch
takes, whether a size fits the device (the one fit predicate, what backend='auto' and launch_plan ask), the forward and
backward launches of the chunk kernels (1)-(2) of docs/kernels.md, and the op that wraps them.

A schedule, never what is computed, except where the emitted module's choices below say so: they are set by every
emitted module in its chunked section's header; the values here are examples, so that these pieces import and test as
they are."""

import torch
import triton

from .chunk_space import SUB, _chunk_configs, _chunk_refusal, _scan_rows
from .custom_ops import _register_op
from .gpu_limits import _device_smem_limit
from .kernels.chunk import _chunk_output_fwd, _chunk_state_bwd, _chunk_state_fwd
from .kernels.chunk_head import _chunk_du_local_bwd, _chunk_grads_bwd
from .recurrent_spec import _WINDOW, _kernel_key_width  # (the recurrent section's, which every Triton section follows)

# ---- the emitted module's choices (examples; each module prints its own from these declarations with its spec's
# values: mirasc.codegen.triton_chunked)

CH_DECAY = False  # the decay is a vector over key channels (g [B, H, T, Dk]), else one log-decay per head (g [B, H, T])
DECAY = False  # retention=decay: a log-decay per token (else none: g = 0)
ETA_K = False  # lr=gate(k) (or a preconditioned η ⊙ m(a)): the written key is η ⊙ k, c["eta_ch"] the channel rates
IMPLICIT = False  # the delta rule's implicit (proximal) step: β = η / (1 + η‖k‖²)
PRE_DECAY = False  # order=pre: the gradient (or the erase) sees the decayed state W_{t-1} D_t, else W_{t-1}
LQ_SCALE = False  # readout=chunk of lq retention: the chunk's updates in weight space are η / n_c
COMPOSITE = False  # a feature map or normaliser around the memory (o returned in fp32 for 16-bit inputs)
_ROWS_PER_TOKEN = 1  # kernel rows per token (erase=kappa: an erase row and a write row)
_CHUNK_KERNELS = ("_chunk_state_fwd", "_chunk_output_fwd", "_chunk_du_local_bwd", "_chunk_state_bwd",
                  "_chunk_grads_bwd")  # the kernels whose space is _chunk_space

OP_ID = "0123456789ab"  # the ops' names: mirasc::<kind>_<OP_ID>, the spec's hash (the recurrent section's)
_CHUNK_LAUNCHED = _CHUNK_KERNELS  # the kernels the chunked path launches (forward and backward)


def _key_width():
    """How heads of width D reach the kernels' key width where a feature map widens them, else None."""
    return None


def _chunk_decays(c, chunks, B, H, NT, n, device):
    """The log-decays' cumulative sums g [B, H, NT, n] inside each chunk: log α with α = 0 clamped to the smallest
    normal float, padded tokens α = 1 (g stays put); zeros without a decay. (A decay over key channels:
    mirasc.runtime.chunk_channel_host's.)"""
    if not DECAY:
        return torch.zeros(B, H, NT, n, dtype=torch.float32, device=device)
    log_alpha = torch.log(c["alpha"].float().clamp_min(torch.finfo(torch.float32).tiny))
    return chunks(log_alpha).cumsum(3)


def _pair_scores(a, b, x, y, prec="ieee"):
    """P_ts = e^{x_t - y_s} (a_t·b_s) for s < t (0 elsewhere) of every chunk ([B, H, NT, n, Dk] each; x, y
    [B, H, NT, n] log-decays per head). (A decay over key channels: mirasc.runtime.chunk_channel_host's.)"""
    n = a.shape[3]
    strict = torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1)
    m = torch.exp(torch.where(strict, x.unsqueeze(-1) - y.unsqueeze(-2), -torch.inf))
    return m * (a @ b.transpose(-1, -2))


def _scores_preparation(scores, k, x, v, beta, prec):
    """The delta rule's preparation (Wk, U) as kernels on its scores, or None (torch solves it): none with one decay
    per head, whose preparation kernels run inside the one op (mirasc.runtime.chunk_ops)."""
    return None


def _output_scores(q, k, g, chunk, prec, tf):
    """The scores the output kernel reads where the caller has none: none with one decay per head (the output kernel
    forms them from q and k); a key-channel decay's are mirasc.runtime.chunk_channel_host's."""
    return q.new_empty(0)


_CHUNK_TUNED = {}  # (kernel, sizes, device) -> the autotuned kernel


def _chunk_kernel(kernel, x, Dk, Dv, BT, prec):
    """The kernel to launch for tensors like x, and its fixed tiles: on a GPU autotuned over the fitting
    configurations (first call per shape), on the CPU interpreter the smallest tiles (BV = 16, BK = 16
    for the kernels that tile Dk, so tests cover several tiles)."""
    name = kernel.fn.__name__
    if x.device.type == "cpu":
        full_k = max(16, triton.next_power_of_2(Dk))
        if name in ("_chunk_state_fwd", "_chunk_state_bwd"):  # two K blocks from Dk > 16 on, to test both forms;
            # the rows of the safest configuration (`_scan_rows`)
            two_k = full_k >= 32
            return kernel, {"BV": 16, "BK": full_k // 2 if two_k else full_k, "TWO_K": two_k,
                            "BC": _scan_rows(BT, two_k, CH_DECAY, prec)[0]}
        return kernel, {"BV": 16, "BK": 16}
    key = (name, Dk, Dv, BT, prec, x.device.index)
    if key not in _CHUNK_TUNED:
        limit = _device_smem_limit(x.device)
        configs = _chunk_configs(name, Dk, Dv, BT, limit, prec, CH_DECAY)
        if not configs:  # (_chunked_triton refuses such sizes before its first launch; this guards direct calls)
            raise RuntimeError(_chunk_fit_error(Dk, Dv, BT, prec, limit))
        keys = ["Nk", "Nv", "BT"] + (["HAS_WK"] if "HAS_WK" in kernel.arg_names else [])
        _CHUNK_TUNED[key] = triton.autotune(configs=configs, key=keys)(kernel)
    return _CHUNK_TUNED[key], {}


# kernel name -> its autotuning space at a launch's arguments (read by `mirasc kernels` and launch_plan)
_CHUNK_AUTOTUNE = {name: (lambda args, smem_limit, name=name: _chunk_configs(name, args["Nk"], args["Nv"], args["BT"],
                                                                            smem_limit, args["PREC"], CH_DECAY))
                   for name in _CHUNK_KERNELS}
# Shared memory per block to check the chunk kernels' fit against on the CPU, where there is no device to ask:
# None (the interpreter has no such limit); `mirasc kernels` sets its target's, so that it reports a refusal
# at the sizes a GPU of that target would refuse.
FIT_SMEM_LIMIT = None


def _chunk_fit_limit(device):
    """The shared memory per block the chunk kernels must fit on `device` (None: no limit, the interpreter)."""
    return _device_smem_limit(device) if device.type == "cuda" else FIT_SMEM_LIMIT


def _chunk_fit_error(Dk, Dv, BT, prec, smem_limit):
    """None where every kernel this module launches (_CHUNK_LAUNCHED) has a configuration at these sizes that fits
    `smem_limit`, else the refusal's message (_chunk_refusal). The one fit predicate: backend='auto'
    (_chunk_fit_reason) and the launches (_check_chunk_fits, _chunk_kernel) use it."""
    spaces = {name: _CHUNK_AUTOTUNE[name] for name in _CHUNK_LAUNCHED}
    return _chunk_refusal(Dk, Dv, BT, prec, smem_limit, CH_DECAY, spaces, _key_width(), _WINDOW)


def _chunk_tile(chunk):
    """The rows BT of the kernels' chunk tile when _chunked_triton is called with `chunk`."""
    return _tile_rows(_ROWS_PER_TOKEN * max(1, chunk // _ROWS_PER_TOKEN))


def _check_chunk_fits(Dk, Dv, chunk, prec, device):
    """Refuse, before anything launches, sizes at which a chunk kernel has no configuration on `device`."""
    limit = _chunk_fit_limit(device)
    if limit is not None:
        msg = _chunk_fit_error(Dk, Dv, _chunk_tile(chunk), prec, limit)
        if msg is not None:
            raise RuntimeError(msg)


def _chunk_launch_sizes(Dk, chunk):
    """The kernels' key width and chunk tile rows for heads the memory reads at width Dk and `chunk` tokens per chunk
    (what _on_chunk_kernels hands them: φ_p's width under feature=poly, an Omega window's rows per token)."""
    return _kernel_key_width(Dk), _chunk_tile(chunk * _WINDOW)


def _chunk_fit_reason(Dk, Dv, chunk, prec, device):
    """None where every chunk kernel has a configuration for these sizes on `device` (or there is no limit to fit:
    the interpreter), else the refusal: what backend='auto' asks before it hands a size to them (_route)."""
    limit = _chunk_fit_limit(device)
    if limit is None or chunk < 1:
        return None
    Dk, BT = _chunk_launch_sizes(Dk, chunk)
    return _chunk_fit_error(Dk, Dv, BT, prec, limit)


def _chunk_plan(Dk, Dv, chunk, prec, device):
    """launch_plan's kernels of the chunked path on a GPU `device`: each kernel it launches with the configurations
    its autotuner may try at these sizes; the refusal where one has none."""
    msg = _chunk_fit_reason(Dk, Dv, chunk, prec, device)
    if msg is not None:
        raise RuntimeError(msg)
    Dk, BT = _chunk_launch_sizes(Dk, chunk)
    args = {"Nk": Dk, "Nv": Dv, "BT": BT, "PREC": prec}
    return {name: _CHUNK_AUTOTUNE[name](args, _chunk_fit_limit(device)) for name in _CHUNK_LAUNCHED}


def _launch_prec(prec):
    """The PREC a launch passes its kernels: `prec`, except under the interpreter, whose tl.dot multiplies bf16
    tiles as their raw 16-bit patterns (triton-lang/triton#11584): there bf16 operands are rounded to bf16 and
    widened to fp32 just before each product, which is exact (a product of two bf16 values fits fp32's
    significand; the sums stay fp32 as on the tensor cores), so the interpreter computes what a GPU computes."""
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    return prec + "_widened" if prec in ("bf16", "bf16x2") and getattr(knobs, "interpret", False) else prec


def _split(prec):
    """The preparation's precision for products with the fp32 inverse and gradients: 16-bit operand dots become
    split bf16 (bf16x2, ~16 bits; one bf16 rounding of the inverse doubled the bf16 error), fp32 stays as is."""
    return "bf16x2" if prec in ("bf16", "fp16") else prec


def _sub_blocks(chunk):
    """Programs per chunk of the gradients kernel: one per 16-row sub-block with a key-channel decay."""
    return chunk // SUB if CH_DECAY else 1


def _sub(chunk):
    return {"BC": SUB} if CH_DECAY else {}


def _out_dtype(q):
    """The dtype the output kernels write: 16-bit inputs' own (docs/semantics.md "Numerics"), else fp32."""
    return q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.float32


def _o_dtype(q):
    """The dtype the memory returns o in: the inputs' own, but fp32 for 16-bit inputs under a feature map or a
    normaliser, whose caller divides by the normaliser's row and rounds once after (docs/semantics.md "Numerics")."""
    return torch.float32 if COMPOSITE and q.dtype in (torch.bfloat16, torch.float16) else q.dtype


def _o_written(q):
    """The dtype the output kernel writes o in: _out_dtype's, but fp32 under a feature map or a normaliser."""
    return torch.float32 if COMPOSITE else _out_dtype(q)


def _layout(H, tf):
    """The chunk kernels' layout arguments: q, k (v, dO and their gradients) as [B, T, H, ·] (tf) or
    [B, H, T, ·]; every other tensor is [B, H, T, ·]."""
    return {"H": H, "TF": tf}


def _in_place(q, g, chunks):
    """How a one-op path (plan.one_chunk_op) hands q, k, v to its kernels: tf where 16-bit inputs come as views of
    [B, T, H, D] (what apply passes) and T fills whole chunks, read in that layout in place; and flat(x), which
    gives x as [B, T, H, ...] (tf: no copy of a contiguous one) or [B, H, NT·n, ...] (zero-padded chunks, in a
    kernel dtype: fp32 for others)."""
    NT, n = g.shape[2:4]
    tf = NT * n == q.shape[2] and q.dtype in (torch.bfloat16, torch.float16)

    def flat(x):
        if tf:
            return x.transpose(1, 2).contiguous()
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            x = x.float()
        return chunks(x).flatten(2, 3).contiguous()

    return tf, flat


def _rows(x):
    """A per-token [B, H, NT, n, ...] as the kernels' [B, H, NT·n, ...] rows."""
    return x.flatten(2, 3).contiguous()


def _read_exponents(g):
    """The exponents x of the state the gradient reads, from the log-decays g [B, H, NT, n, ...]: g for order=pre
    (a_t = e^{g_t}, m_ts = e^{g_t - g_s}), else g one row back (W_{t-1}: a_t = e^{g_{t-1}},
    m_ts = e^{g_{t-1} - g_s})."""
    return g if PRE_DECAY else torch.cat([torch.zeros_like(g[:, :, :, :1]), g[:, :, :, :-1]], dim=3)


def _scan_cotangents(grads_out, q, v, B, H, Dk):
    """dO and the final state's cotangent for a one-op path's backward: zeros where autograd passes none (the op
    does not materialise them), 16-bit dO read as it is."""
    do, dw_final = grads_out[0], grads_out[1]
    if do is None:
        do = torch.zeros(*v.shape, dtype=torch.float32, device=q.device)
    if dw_final is None:
        dw_final = torch.zeros(B, H, v.shape[-1], Dk, dtype=torch.float32, device=q.device)
    do = do.contiguous() if do.dtype == _out_dtype(q) else do.float().contiguous()
    return do, dw_final.float().contiguous()


def _proximal_beta(eta, kf, tf):
    """The implicit step's β = η / (1 + η‖k‖²) per token (η [B, H, NT, n]), from the keys as the kernels take them."""
    sq = torch.linalg.vector_norm(kf, dim=-1, dtype=torch.float32).square()
    return eta / (1 + eta * (sq.transpose(1, 2) if tf else sq).unflatten(2, eta.shape[2:4]))


def _chunk_fwd(q, k, wk, u, g, w0, chunk, prec, tf=False, eta=None, a=None):
    """The forward kernels; u is U [B, H, T, Dv], or with eta ([B, H, T] fp32) the values v in q's layout and
    dtype, U = η v formed in the scan. a: a key-channel decay's scores of q against k where the caller has them."""
    B, H, T, Dk = (q.shape[0], q.shape[2], q.shape[1], q.shape[3]) if tf else q.shape
    Dv = u.shape[-1]
    NT = T // chunk
    f32 = dict(dtype=torch.float32, device=q.device)
    o = torch.empty(*((B, T, H) if tf else (B, H, T)), Dv, dtype=_o_written(q), device=q.device)
    # u and W_0 of every chunk are only ever dot operands: in 16-bit inputs' dtype, as FLA keeps them
    uu = torch.empty(B, H, T, Dv, dtype=_out_dtype(q), device=q.device)
    w_final = torch.empty(B, H, Dv, Dk, **f32)
    ckpt = torch.empty(B, H, NT, Dv, Dk, dtype=_out_dtype(q), device=q.device)
    kernel, tile = _chunk_kernel(_chunk_state_fwd, q, Dk, Dv, chunk, prec)
    kernel[lambda meta: (triton.cdiv(Dv, meta["BV"]), B * H)](
        k, q if wk is None else wk, u, g if eta is None else eta, g, w0, uu, w_final, ckpt, T, Dk, Dv,
        BT=chunk, HAS_WK=wk is not None, PREC=_launch_prec(prec), SCALE_U=eta is not None, CH=CH_DECAY,
        **_layout(H, tf), **tile)
    a = _output_scores(q, k, g, chunk, prec, tf) if a is None else a
    kernel, tile = _chunk_kernel(_chunk_output_fwd, q, Dk, Dv, chunk, prec)
    kernel[lambda meta: (triton.cdiv(Dv, meta["BV"]), NT, B * H)](
        q, a if CH_DECAY else k, uu, g, ckpt, o, T, Dk, Dv, BT=chunk, PREC=_launch_prec(prec), CH=CH_DECAY,
        **_layout(H, tf), **tile)
    return o, w_final, ckpt, uu, a


def _scores_fake(q, B, H, T, chunk):
    """The fake of _chunk_fwd's last output: a key-channel decay's scores, else an empty tensor."""
    return q.new_empty(B, H, T // chunk, chunk, chunk, dtype=_out_dtype(q)) if CH_DECAY else q.new_empty(0)


def _chunk_bwd(q, k, wk, uu, g, ckpt, a, do, dw_final, chunk, prec, raw_du=False, tf=False, v=None, eta=None):
    """The backward kernels: dq, dk, dWk, dU (-du; raw_du: du) or, with v and eta (U = η v, _chunk_fwd), dv in
    v's layout and dtype and dη, dg and dW_0. With eta, dk is the key's whole gradient (k's layout, dtype). a: the
    key-channel scores _chunk_fwd returned."""
    B, H, T, Dk = (q.shape[0], q.shape[2], q.shape[1], q.shape[3]) if tf else q.shape
    Dv = uu.shape[-1]
    NT = T // chunk
    f32 = dict(dtype=torch.float32, device=q.device)
    dh = torch.empty(B, H, NT, Dv, Dk, dtype=_out_dtype(q), device=q.device)  # (a dot operand only)
    du = torch.empty(B, H, T, Dv, **f32)
    dw0 = torch.empty(B, H, Dv, Dk, **f32)
    kernel, tile = _chunk_kernel(_chunk_du_local_bwd, q, Dk, Dv, chunk, prec)
    if CH_DECAY:  # du's chunk-local part and the scores' cotangent dA, one program per chunk
        da = torch.empty(B, H, NT, chunk, chunk, **f32)
        kernel[(NT, B * H)](a, uu, do, du, da, T, Dk, Dv, BT=chunk, PREC=_launch_prec(prec), **_layout(H, tf), **tile)
    else:
        kernel[lambda meta: (triton.cdiv(Dv, meta["BV"]), NT, B * H)](
            q, k, g, do, du, T, Dk, Dv, BT=chunk, PREC=_launch_prec(prec), **_layout(H, tf), **tile)
    scale_u = eta is not None
    if scale_u:  # dv written by the scan; dη as partial sums per Dv tile (sized for the smallest)
        dv = torch.empty(v.shape, dtype=_out_dtype(v), device=q.device)
        deta = torch.zeros(triton.cdiv(Dv, 16), B * H, T, **f32)
    kernel, tile = _chunk_kernel(_chunk_state_bwd, q, Dk, Dv, chunk, prec)
    kernel[lambda meta: (triton.cdiv(Dv, meta["BV"]), B * H)](
        q, k, q if wk is None else wk, g, do, dw_final, dh, du, dw0, v if scale_u else do, eta if scale_u else g,
        dv if scale_u else do, deta if scale_u else du, T, Dk, Dv, BT=chunk, HAS_WK=wk is not None,
        PREC=_launch_prec(prec), SCALE_U=scale_u, CH=CH_DECAY, **_layout(H, tf), **tile)
    dq = torch.empty(q.shape, dtype=_out_dtype(q), device=q.device)  # (q's last use: 16-bit q, 16-bit dq)
    # dk: k's whole gradient in its layout and dtype (scale_u), else a part the caller adds to (fp32)
    dk = torch.empty(k.shape, dtype=_out_dtype(k), device=q.device) if scale_u else torch.empty(B, H, T, Dk, **f32)
    dwk = torch.empty(B, H, T, Dk, **f32) if wk is not None else dq
    if CH_DECAY:  # dg per key channel, each Dk tile writes its own columns
        dg = torch.empty(B, H, T, Dk, **f32)
    else:
        dg = torch.zeros(triton.cdiv(Dk, 16), B * H, T, **f32)  # partial sums per Dk tile (sized for the smallest)
    kernel, tile = _chunk_kernel(_chunk_grads_bwd, q, Dk, Dv, chunk, prec)
    kernel[lambda meta: (triton.cdiv(Dk, meta["BK"]), NT * _sub_blocks(chunk), B * H)](
        q, k, uu, g, ckpt, dh, do, du, *((da,) if CH_DECAY else ()), dq, dk, dwk, dg, T, Dk, Dv, BT=chunk,
        HAS_WK=wk is not None, PREC=_launch_prec(prec), FINAL_DK=scale_u, **_sub(chunk), **_layout(H, tf), **tile)
    dg = dg if CH_DECAY else dg.sum(0).view(B, H, T)
    if scale_u:
        return dq, dk, dv, deta.sum(0).view(B, H, T), dg, dw0
    # the gradient of U is -du (raw_du: du itself, for a caller whose kernel folds the sign in)
    return dq, dk, None if wk is None else dwk, du if raw_du else -du, dg, dw0


def _register_chunk_op():
    if triton is None:
        return None

    def op(q: torch.Tensor, k: torch.Tensor, wk: torch.Tensor | None, u: torch.Tensor, g: torch.Tensor,
           w0: torch.Tensor, chunk: int, prec: str) -> list[torch.Tensor]:
        return list(_chunk_fwd(q, k, wk, u, g, w0, chunk, prec))

    def op_fake(q, k, wk, u, g, w0, chunk, prec):
        B, H, T, Dk = q.shape
        # o, the final state, W_0 of every chunk and u of every token (the last two for the backward)
        return [u.new_empty(B, H, T, u.shape[-1]), w0.new_empty(w0.shape),
                w0.new_empty(B, H, T // chunk, *w0.shape[2:], dtype=_out_dtype(q)),
                u.new_empty(B, H, T, u.shape[-1], dtype=_out_dtype(q)), _scores_fake(q, B, H, T, chunk)]

    # the backward is an op of its own, so compiled graphs trace it through its fake implementation
    def backward_op(q: torch.Tensor, k: torch.Tensor, wk: torch.Tensor | None, uu: torch.Tensor, g: torch.Tensor,
                    ckpt: torch.Tensor, a: torch.Tensor, do: torch.Tensor, dw_final: torch.Tensor, chunk: int,
                    prec: str) -> list[torch.Tensor]:
        dq, dk, dwk, du, dg, dw0 = _chunk_bwd(q, k, wk, uu, g, ckpt, a, do, dw_final, chunk, prec)
        return [dq, dk, dq.new_zeros(0) if dwk is None else dwk, du, dg, dw0]

    def backward_fake(q, k, wk, uu, g, ckpt, a, do, dw_final, chunk, prec):
        return [torch.empty_like(q, dtype=_out_dtype(q)), torch.empty_like(k, dtype=torch.float32),
                q.new_empty(0, dtype=torch.float32) if wk is None else torch.empty_like(wk, dtype=torch.float32),
                torch.empty_like(uu, dtype=torch.float32), torch.empty_like(g, dtype=torch.float32),
                dw_final.new_empty(dw_final.shape, dtype=torch.float32)]

    def setup_context(ctx, inputs, output):
        q, k, wk, u, g, w0, chunk, prec = inputs
        ctx.save_for_backward(q, k, wk, g, *output[2:])
        ctx.chunk, ctx.prec = chunk, prec
        ctx.set_materialize_grads(False)  # the saved intermediates are not read: no zero cotangents for them

    def backward(ctx, backward_op, grads_out):
        q, k, wk, g, ckpt, uu, a = ctx.saved_tensors
        do, dw_final = grads_out[0], grads_out[1]
        if do is None:
            do = torch.zeros(*q.shape[:3], uu.shape[-1], dtype=torch.float32, device=q.device)
        if dw_final is None:
            dw_final = torch.zeros(*q.shape[:2], uu.shape[-1], q.shape[-1], dtype=torch.float32, device=q.device)
        dq, dk, dwk, du, dg, dw0 = backward_op(q, k, wk, uu, g, ckpt, a, do.float().contiguous(),
                                               dw_final.float().contiguous(), ctx.chunk, ctx.prec)
        return dq, dk, None if wk is None else dwk, du, dg, dw0, None, None

    return _register_op("chunk", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_CHUNK_OP = _register_chunk_op()


def _tile_rows(chunk):
    """The rows of the tile that holds one chunk: the chunk rounded up to a power of two, at least 16."""
    return max(16, triton.next_power_of_2(chunk))

