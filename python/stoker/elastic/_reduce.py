"""The one buffer a step reduces: every gradient, a flag per parameter, and
the loss."""


def reduction_dtype(torch, params):
    """The gradients' own dtype when they share fp32 or fp64; fp32 otherwise."""
    dtypes = {p.grad.dtype for p in params if p.grad is not None}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def pack_gradients(torch, params, loss_sum, device):
    """[gradients..., flags..., loss] in the gradients' dtype: fp32 (or fp64)
    gradients are not converted; mixed or half-precision ones reduce in fp32
    (sums of many ranks' half-precision gradients lose too much). A flag is
    1 where this rank computed the parameter's gradient."""
    dtype = reduction_dtype(torch, params)
    grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=dtype, device=device)
             for p in params]
    flags = torch.tensor([p.grad is not None for p in params], dtype=dtype).to(device)
    return torch.cat([g.to(dtype) for g in grads] + [flags, loss_sum.to(dtype).reshape(1)])


def unpack_gradients(params, flat):
    """Sets each parameter's gradient from the reduced buffer; a parameter no
    rank computed a gradient for keeps None, as with DDP (optimizers skip
    it, weight decay included)."""
    flag_at = flat.numel() - 1 - len(params)
    present = flat[flag_at:flag_at + len(params)].tolist()
    offset = 0
    for p, flag in zip(params, present):
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype) if flag > 0 else None
        offset += n
