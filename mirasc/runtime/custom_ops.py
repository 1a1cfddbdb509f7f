"""A kernel path registered as a torch custom op whose backward is an op of its own (a runtime piece: its body is
copied, once per module, into the emitted modules that launch Triton kernels, by mirasc.codegen.standalone).
Registered ops are what torch.compile traces through (their fake implementations) without a graph break."""

import torch


def _register_op(kind, op_id, forward, forward_fake, backward, backward_fake, save, grads):
    """The ops `mirasc::<kind>_<op_id>` (`forward`, annotated with the op's schema) and `mirasc::<kind>_bwd_<op_id>`
    (`backward`), their fake implementations, and the autograd formula: `save(ctx, inputs, output)` keeps what the
    backward reads, `grads(ctx, backward_op, *grads_out)` returns one gradient (or None) per input (`grads_out`: one
    list for an op returning a list, one cotangent per element of a tuple). None where torch
    has no custom ops. Each module registers its own ops, which run its own functions: where the name is taken
    (`op_id` is the spec's hash, so the same spec loaded as a second module, e.g. its emitted file beside
    `mirasc.compile_spec`, finds it taken) the ops take the next free suffix, `<kind>_<op_id>_2` and so on."""
    if not hasattr(torch.library, "custom_op"):
        return None
    suffix, n = "", 1
    while getattr(getattr(torch.ops, "mirasc", None), f"{kind}_{op_id}{suffix}", None) is not None:
        n += 1
        suffix = f"_{n}"
    op = torch.library.custom_op(f"mirasc::{kind}_{op_id}{suffix}", mutates_args=())(forward)
    op.register_fake(forward_fake)
    backward_op = torch.library.custom_op(f"mirasc::{kind}_bwd_{op_id}{suffix}", mutates_args=())(backward)
    backward_op.register_fake(backward_fake)
    op.register_autograd(lambda ctx, *grads_out: grads(ctx, backward_op, *grads_out), setup_context=save)
    return op
