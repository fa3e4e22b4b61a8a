"""DistributedDataParallel's gradient all-reduce, timed for the doctor
without touching it.

DDP reduces gradient buckets while the backward pass runs; what the step
loses is the time the backward pass waits after its last gradient was
computed. The doctor marks when each parameter of a DDP-wrapped module gets
its gradient (a tensor hook that returns nothing, so the gradient is
unchanged) and when ``torch.autograd.backward`` returns: the time between
the last gradient and the return is communication. DDP's own reduction and
any comm hook the program registers are left as they are (registering a
Python comm hook of our own would change how torch 1.13 tears gloo down:
it aborts at exit in about one run in five). On CUDA the backward pass
returns once the reduction is queued, so CUDA gradients are not marked; the
GPU-side wait shows in NVML."""
import functools

_last_grad = [None]  # when the last CPU gradient of a DDP-wrapped parameter was computed (doctor's clock)


def _doctor():
    from . import _auto
    return _auto._doctor


def _mark(grad):
    d = _doctor()
    if d is not None and not grad.is_cuda:
        _last_grad[0] = d._clock()


def _hook_parameters(ddp):
    if ddp.__dict__.get("_stoker_grad_marks") is not None:
        return
    handles = []
    ddp.__dict__["_stoker_grad_marks"] = handles
    for p in ddp.module.parameters():
        if p.requires_grad:
            handles.append(p.register_hook(_mark))


def patch_ddp(module):
    cls = getattr(module, "DistributedDataParallel", None)
    forward = getattr(cls, "forward", None)
    if forward is None or getattr(forward, "__stoker_doctor__", False):
        return

    @functools.wraps(forward)
    def forward_marked(self, *args, **kwargs):
        try:
            _hook_parameters(self)
        except Exception:  # noqa: BLE001 - a module that refuses hooks is left untimed
            self.__dict__["_stoker_grad_marks"] = []
        return forward(self, *args, **kwargs)
    forward_marked.__stoker_doctor__ = True
    cls.forward = forward_marked


def patch_autograd(module):
    backward = getattr(module, "backward", None)
    if backward is None or getattr(backward, "__stoker_doctor__", False):
        return

    @functools.wraps(backward)
    def backward_timed(*args, **kwargs):
        d = _doctor()
        if d is None:
            return backward(*args, **kwargs)
        start = d._clock()
        _last_grad[0] = None
        result = backward(*args, **kwargs)
        last = _last_grad[0]
        if last is not None and last >= start:
            d.communication_waited(last, d._clock())
        return result
    backward_timed.__stoker_doctor__ = True
    module.backward = backward_timed
