"""L5: the case kinds of the golden suites beyond rounding — how each kind computes its outputs
from its inputs and parameters with mpt's public operations (``mpt.golden.cases`` lists the
kinds and builds the default suite's cases)."""
from __future__ import annotations

import numpy as np

from mpt import microscaling as _ms
from mpt.amp.scaler import GradScaler
from mpt.autograd.tensor import Tensor, tensor
from mpt.engines import gemm, get_mma_model, mma
from mpt.functional import scaled_dot_product_attention
from mpt.kernels.quant import fake_quant_per_channel, fake_quant_per_tensor
from mpt.nn import GPT, Parameter
from mpt.optim import SGD, AdamW
from mpt.train.trainer import TrainConfig, Trainer

__all__ = ["COMPUTE"]


# ---- kinds -------------------------------------------------------------------------------------
def _model(params):
    return get_mma_model(params["model"]).configure(**params.get("choices", {}))


def _compute_mma(inputs, params):
    return {"d": mma(inputs["a"], inputs["b"], inputs["c"], model=_model(params),
                     in_format=params["in_format"], out_format=params["out_format"],
                     variant=params.get("variant"), scale_a=inputs.get("scale_a"),
                     scale_b=inputs.get("scale_b"))}


def _compute_gemm(inputs, params):
    return {"d": gemm(inputs["a"], inputs["b"], inputs.get("c"), model=params["model"],
                      in_format=params["in_format"], split_k=params["split_k"],
                      promote_every=params["promote_every"], scale_a=inputs.get("scale_a"),
                      scale_b=inputs.get("scale_b"), out_format=params["out_format"],
                      variant=params.get("variant"), block_scale_a=inputs.get("block_scale_a"),
                      block_scale_b=inputs.get("block_scale_b"), **params.get("options", {}))}


def _compute_microscaling(inputs, params):
    params = dict(params)
    quantizer = params.pop("quantizer")
    if quantizer == "hadamard":
        return {"y": _ms.hadamard_transform(inputs["x"], axis=params["axis"])}
    if "random_bits" in inputs:
        params["random_bits"] = inputs["random_bits"]
    if quantizer == "mx":
        q = _ms.quantize_mx(inputs["x"], params.pop("format"), **params)
        return {"codes": q.codes, "scales": q.scales}
    q = _ms.quantize_nvfp4(inputs["x"], **params)
    return {"codes": q.codes, "scales": q.scales, "tensor_scale": q.tensor_scale.reshape(()),
            "amax": q.amax.reshape(())}


def _compute_fake_quant(inputs, params):
    qmin, qmax = params["quant_min"], params["quant_max"]
    if params["axis"] is None:
        y, mask, _ = fake_quant_per_tensor(inputs["x"], inputs["scale"], int(inputs["zero_point"]),
                                           qmin, qmax)
    else:
        y, mask, _ = fake_quant_per_channel(inputs["x"], inputs["scale"], inputs["zero_point"],
                                            params["axis"], qmin, qmax)
    return {"y": y, "mask": mask}


_OPTIMIZERS = {"sgd": SGD, "adamw": AdamW}


def _compute_optim(inputs, params):
    p = Parameter(inputs["p0"].copy())
    opt = _OPTIMIZERS[params["optimizer"]]([p], fma=params["fma"], **params["hyper"])
    after = []
    for g in inputs["grads"]:                                    # grads: (steps, n)
        p.grad = Tensor(g.copy())
        opt.step()
        after.append(p.data.copy())
    state = opt.state[p] if p in opt.state else next(iter(opt.state.values()))
    out = {"p": np.stack(after)}                                 # (steps, n)
    for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
        if key in state:
            out[key] = np.asarray(state[key], np.float32).copy()
    return out


def _compute_grad_scaler(inputs, params):
    scaler = GradScaler(**params)
    p = Parameter(np.zeros(1, np.float32))
    opt = SGD([p], lr=0.0)
    scales, trackers = [], []
    for found in inputs["found_inf"]:
        scaler.scale(tensor(np.float32(1.0)))
        p.grad = Tensor(np.array([np.inf if found else 1.0], np.float32))
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(scaler.get_growth_tracker())
    return {"scale": np.array(scales, np.float32), "growth_tracker": np.array(trackers, np.int32)}


def _compute_attention(inputs, params):
    fmt = params["format"]
    q, k, v = (tensor(inputs[n], fmt, requires_grad=True) for n in ("q", "k", "v"))
    out = scaled_dot_product_attention(q, k, v, is_causal=params["is_causal"],
                                       backend=params["backend"])
    out.backward(tensor(inputs["grad_out"], fmt))
    return {"out": out.data, "dq": q.grad.data, "dk": k.grad.data, "dv": v.grad.data}


def _compute_train_steps(inputs, params):
    model = GPT(*params["gpt"], seed=0, backend=params.get("backend", "flash"))  # (loaded)
    model.load_state_dict({k[len("init."):]: v for k, v in inputs.items() if k.startswith("init.")})
    trainer = Trainer(model, params["recipe"], TrainConfig(lr=params["lr"]))
    losses = [trainer.train_step([(idx, tgt)]).loss
              for idx, tgt in zip(inputs["idx"], inputs["targets"])]          # (steps, B, T)
    return {"loss": np.array(losses, np.float32),
            **{f"param.{k}": v for k, v in trainer.network.state_dict().items()}}


#: kind name -> compute function (registered by mpt.golden)
COMPUTE = {"mma": _compute_mma, "gemm": _compute_gemm, "fake_quant": _compute_fake_quant,
           "optim": _compute_optim, "grad_scaler": _compute_grad_scaler,
           "attention": _compute_attention, "train_steps": _compute_train_steps,
           "microscaling": _compute_microscaling}


