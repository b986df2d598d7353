"""Other published performance tables, turned into Dynamo-layout profiles.

The planner and the simulator read one profile shape,
:class:`~fleetplan.models.perf.ProfileData` (prefill TTFT against ISL; decode
ITL against KV usage and context). Two more public sources convert to it:

- **Splitwise** ``perf_model.csv`` (Microsoft Research, MIT): measured prompt
  time for ``batch_size`` prompts of ``prompt_size`` tokens, and token time
  for that batch, per model / hardware / tensor parallelism. Prefill rows are
  ``(batch·prompt tokens, prompt_time)`` (duplicates averaged); decode rows
  put ``batch`` sequences at context ``prompt + tokens/2``. Splitwise does not
  record the KV-cache size, so ``max_kv_tokens`` defaults to the largest KV a
  measured batch held (every measured point is then feasible; nothing beyond
  is claimed).
- **DistServe** ``profiler-a100-80g.*.json`` (LLMServe, Apache-2.0): fitted
  coefficients, in ms, ``prefill = a + b·tokens + c·Σlen²`` and ``decode =
  a + b·Σcontext + c·batch`` (two decode fits split at a batch threshold).
  The fit is sampled on a grid of ISLs and of (batch, context) points;
  ``max_kv_tokens`` is DistServe's KV capacity for the model on one A100
  (``max_num_tokens.csv``, 66,144 tokens for OPT-13B at TP1). The fits come
  from a kernel profiler, so they leave out what a serving engine's step
  costs on the host (scheduling, sampling, detokenising each sequence);
  ``host_ms_per_seq`` adds that as a cost per running sequence per decode
  step (0 by default; ``bench/calibrate.py`` fits it on measured TPOT).

Spec strings for ``--profile``: ``splitwise:FILE:MODEL:HARDWARE:TP`` and
``distserve:FILE:MODEL:TP[:MAX_KV_TOKENS[:HOST_MS_PER_SEQ]]``. :func:`write_profile_json`
writes any profile as one Dynamo-style JSON file, which every fleetplan
command (``plan`` included) reads with ``--profile FILE``.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from fleetplan.models.perf import ProfileData


class ProfileConvertError(ValueError):
    """A table that cannot be converted: names the file and what is missing."""


def splitwise_profile(path: str | Path, model: str, hardware: str, tp: int, max_kv_tokens: int | None = None) -> ProfileData:
    p = Path(path)
    try:
        rows = list(csv.DictReader(p.open()))
    except OSError as err:
        raise ProfileConvertError(f"{p}: cannot read ({err.strerror})") from None
    sel = [
        r for r in rows
        if r.get("model") == model and r.get("hardware") == hardware and r.get("tensor_parallel") == str(tp)
    ]
    if not sel:
        combos = sorted({(r.get("model"), r.get("hardware"), r.get("tensor_parallel")) for r in rows})
        raise ProfileConvertError(f"{p}: no rows for {model}/{hardware}/tp{tp}; have {combos[:12]}")
    prefill: dict[int, list[float]] = defaultdict(list)
    decode: dict[tuple[int, float], list[float]] = defaultdict(list)
    try:
        for r in sel:
            batch, prompt, tokens = int(r["batch_size"]), int(r["prompt_size"]), int(r["token_size"])
            prefill[batch * prompt].append(float(r["prompt_time"]))
            decode[(batch, prompt + tokens / 2.0)].append(float(r["token_time"]))
    except (KeyError, ValueError) as err:
        raise ProfileConvertError(f"{p}: bad row ({err})") from None
    kv_cap = max_kv_tokens or int(max(b * ctx for b, ctx in decode) + 1)
    isl = sorted(prefill)
    points = sorted(decode)
    return ProfileData(
        prefill_isl=np.array(isl, dtype=float),
        prefill_ttft_ms=np.array([np.mean(prefill[i]) for i in isl]),
        x_kv_usage=np.array([min(1.0, b * c / kv_cap) for b, c in points]),
        y_context_length=np.array([c for _, c in points]),
        z_itl_ms=np.array([np.mean(decode[k]) for k in points]),
        max_kv_tokens=kv_cap, name=f"splitwise-{model}-{hardware}-tp{tp}", model=model, gpu=hardware, tp=tp,
    )


def distserve_profile(
    path: str | Path, model: str = "facebook/opt-13b", tp: int = 1, max_kv_tokens: int = 66_144,
    host_ms_per_seq: float = 0.0,
) -> ProfileData:
    if not (math.isfinite(host_ms_per_seq) and host_ms_per_seq >= 0):
        raise ProfileConvertError(f"host_ms_per_seq: expected a finite number >= 0, got {host_ms_per_seq}")
    p = Path(path)
    try:
        data = json.loads(p.read_text())
        params = data[model][str(tp)]
        pa, pb, pc = params["prefill"]
        threshold = params["decoding_large_small_bs_threshold"]
        small = params["decoding_smallbs"]
        large = params["decoding_largebs"]
    except OSError as err:
        raise ProfileConvertError(f"{p}: cannot read ({err.strerror})") from None
    except (KeyError, ValueError, TypeError) as err:
        raise ProfileConvertError(f"{p}: no usable coefficients for {model} tp{tp} ({err})") from None
    isl = np.array([16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048], dtype=float)
    ttft = pa + pb * isl + pc * isl * isl
    usage, ctx, itl = [], [], []
    for c in (64, 128, 256, 512, 768, 1024, 1536, 2048):
        for batch in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256):
            kv = batch * c
            if kv > max_kv_tokens:
                break
            a, b, cc = small if batch < threshold else large
            usage.append(kv / max_kv_tokens)
            ctx.append(float(c))
            itl.append(a + b * kv + (cc + host_ms_per_seq) * batch)
    return ProfileData(
        prefill_isl=isl, prefill_ttft_ms=ttft, x_kv_usage=np.array(usage), y_context_length=np.array(ctx),
        z_itl_ms=np.array(itl), max_kv_tokens=max_kv_tokens, name=f"distserve-{model}-tp{tp}", model=model,
        gpu="a100-80gb", tp=tp,
    )


def profile_from_spec(spec: str) -> ProfileData | None:
    """A converted profile for ``splitwise:...`` / ``distserve:...`` specs; None otherwise."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("splitwise", "distserve"):
        return None
    parts = rest.split(":")
    try:
        if kind == "splitwise":
            if len(parts) not in (4, 5):
                raise ValueError
            path, model, hardware, tp = parts[:4]
            return splitwise_profile(path, model, hardware, int(tp), int(parts[4]) if len(parts) == 5 else None)
        if len(parts) not in (3, 4, 5):
            raise ValueError
        path, model, tp = parts[:3]
        kv = int(parts[3]) if len(parts) >= 4 else 66_144
        return distserve_profile(path, model, int(tp), kv, float(parts[4]) if len(parts) == 5 else 0.0)
    except ValueError as err:
        if isinstance(err, ProfileConvertError):
            raise
        raise ProfileConvertError(
            f"{spec}: expected splitwise:FILE:MODEL:HARDWARE:TP[:MAX_KV] or "
            "distserve:FILE:MODEL:TP[:MAX_KV[:HOST_MS_PER_SEQ]]"
        ) from None


def write_profile_json(profile: ProfileData, path: str | Path) -> Path:
    """One JSON file with Dynamo's keys (``prefill_isl``, ``prefill_ttft``, ``x_kv_usage``...)."""
    p = Path(path)
    p.write_text(json.dumps({
        "prefill_isl": profile.prefill_isl.tolist(),
        "prefill_ttft": profile.prefill_ttft_ms.tolist(),
        "x_kv_usage": profile.x_kv_usage.tolist(),
        "y_context_length": profile.y_context_length.tolist(),
        "z_itl": profile.z_itl_ms.tolist(),
        "max_kv_tokens": profile.max_kv_tokens,
        "tp": profile.tp,
    }))
    return p
