"""Part (d): where pdm-agg's loss path spends its time, kernel by kernel (fused and chunked).

The ``loss`` part times whole paths against the bandwidth floor; this part says which kernels make
up the distance. One forward + backward of pdm-agg at the device's default chunk, on the ``loss``
part's inputs, runs under ``torch.profiler`` (after one warm-up call); the kernels are summed by
name and the largest reported with their call counts, next to the same profile of torch's fused
cross-entropy. Then pdm-agg's statistics alone (``compute_token_stats`` with its needs: on a GPU
``trust_region.triton_stats``), forward and backward profiled apart: the kernels each direction
launches and its device-to-host copies (the goal: at most two kernels per direction, no copy).
On CPU the profiler times operators instead of kernels: the tiny run checks the code only.
"""

from __future__ import annotations

import torch

from .loss_paths import loss_functions, make_inputs
from .measure import say

TOP = 12  # kernels reported per path
PATHS = ("pdm-agg", "pdm-agg-chunked", "torch-ce")


def _device_us(event, device: torch.device) -> float:
    """An averaged event's total self time on the device (CPU: on the host), microseconds."""
    if device.type == "cuda":
        return float(getattr(event, "self_device_time_total", 0.0))
    return float(event.self_cpu_time_total)


def _profile(call, device: torch.device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    call()  # warm-up outside the profile
    with profile(activities=activities) as prof:
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = [e for e in prof.key_averages() if _device_us(e, device) > 0]
    if device.type == "cuda":
        # Kernels and copies only: an operator's row repeats its kernels' time (counted twice in
        # the first H200 run), and the profiler's own buffer requests are no work of the path.
        events = [
            e
            for e in events
            if getattr(e, "device_type", None) != torch.autograd.DeviceType.CPU
            and not e.key.startswith("Activity Buffer")
        ]
    events.sort(key=lambda e: _device_us(e, device), reverse=True)
    total = sum(_device_us(e, device) for e in events)
    return {
        "total_ms": round(total / 1e3, 3),
        "kernels_launched": sum(e.count for e in events),
        "top": [
            {
                "name": e.key[:120],
                "calls": e.count,
                "ms": round(_device_us(e, device) / 1e3, 3),
                "share": round(_device_us(e, device) / total, 3) if total else None,
            }
            for e in events[:TOP]
        ],
    }


def _launches(events) -> dict:
    """Device work of one profiled call: kernels (copies and fills apart) and copies to the host."""
    device_events = [
        e
        for e in events
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CPU
        and not e.key.startswith("Activity Buffer")
    ]
    copies = [e for e in device_events if e.key.startswith("Memcpy") or e.key.startswith("Memset")]
    return {
        "kernels": sum(e.count for e in device_events) - sum(e.count for e in copies),
        "device_to_host": sum(e.count for e in copies if "DtoH" in e.key),
        "copies_and_fills": sum(e.count for e in copies),
        "names": sorted({e.key[:80] for e in device_events}),
    }


def statistics_by_direction(x: dict, device: torch.device) -> dict:
    """pdm-agg's statistics (``compute_token_stats``, the pass and every ``[N, K]`` statistic)
    forward, then the backward of ``log pi(y)``'s loss, each under its own profile."""
    from torch.profiler import ProfilerActivity, profile

    from pdmask.trust_region import compute_token_stats

    from .loss_paths import _methods

    needs = _methods()["pdm-agg"].needs
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)

    def forward():
        x["logits"].grad = None
        args = (x["sampled"], x["topk_ids"], x["topk_logp"], x["mu_logp"])
        return compute_token_stats(x["logits"], *args, inputs=needs)

    (forward().logp * x["adv"]).sum().backward()  # warm-up: compiles the kernels
    out = {}
    with profile(activities=activities) as prof:
        stats = forward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out["forward"] = _launches(prof.key_averages())
    loss = (stats.logp * x["adv"]).sum()  # the loss's own kernels, before the profile
    with profile(activities=activities) as prof:
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out["backward"] = _launches(prof.key_averages())
    return out


def run(device: torch.device, size) -> dict:
    """``size``: the ``loss`` part's size (``loss_paths.FULL`` or ``TINY``)."""
    x = make_inputs(size, device)
    losses = loss_functions(False, device, size.vocab)

    def backward_of(loss):
        def call():
            x["logits"].grad = None
            loss(x).backward()

        return call

    profiles = {name: _profile(backward_of(losses[name]), device) for name in PATHS}
    directions = statistics_by_direction(x, device)
    record = {
        "tokens": size.tokens, "vocab": size.vocab, "profiles": profiles,
        "statistics_by_direction": directions,
    }  # fmt: skip
    for name, prof in record["profiles"].items():
        say(
            f"\n(d) {name} fwd+bwd, N={size.tokens} x V={size.vocab}: "
            f"{prof['total_ms']} ms on the device in {prof['kernels_launched']} kernels"
        )
        for k in prof["top"]:
            say(f"    {k['ms']:9.3f} ms {k['calls']:6d} calls  {k['share']:.2f}  {k['name'][:90]}")
    where = "" if device.type == "cuda" else " (CPU: no device events, a code check)"
    for direction, launched in directions.items():
        say(
            f"\n(d) pdm-agg's statistics, {direction}{where}: {launched['kernels']} kernels "
            f"(goal <= 2; the forward's id check adds 3), "
            f"{launched['device_to_host']} device-to-host copies (goal 0), "
            f"{launched['copies_and_fills']} copies and fills: {', '.join(launched['names'])[:300]}"
        )
    return record
