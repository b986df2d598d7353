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
  is claimed); a smaller one given leaves out the batches that do not fit.
- **DistServe** ``profiler-a100-80g.*.json`` (LLMServe, Apache-2.0): fitted
  coefficients, in ms, ``prefill = a + b·tokens + c·Σlen²`` and ``decode =
  a + b·Σcontext + c·batch`` (two decode fits split at a batch threshold).
  The fit is sampled on a grid of ISLs and of (batch, context) points;
  ``max_kv_tokens`` is, unless given, DistServe's KV capacity of one engine of
  that model and TP on A100s (``max_num_tokens.csv``, :data:`DISTSERVE_KV_TOKENS`:
  66,144 tokens for OPT-13B at TP1, 163,008 at TP2). The fits come
  from a kernel profiler, so they leave out what a serving engine's step
  costs on the host (scheduling, sampling, detokenising each sequence);
  ``host_ms_per_seq`` adds that as a cost per running sequence per decode
  step (0 by default; ``bench/calibrate.py`` fits it on measured TPOT).

Spec strings for ``--profile``: ``splitwise:FILE:MODEL:HARDWARE:TP[:MAX_KV_TOKENS]`` and
``distserve:FILE:MODEL:TP[:MAX_KV_TOKENS[:HOST_MS_PER_SEQ]]``. :func:`write_profile_json`
writes any profile as one Dynamo-style JSON file, which every fleetplan
command (``plan`` included) reads with ``--profile FILE``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from fleetplan.models.perf import InvalidProfile, ProfileData


class ProfileConvertError(ValueError):
    """A table that cannot be converted: names the file (and line, field) and what is wrong."""


_SPLITWISE_COUNTS = {"batch_size": 1, "prompt_size": 1, "token_size": 0}
"""Splitwise integer columns and their least valid value."""

_SPLITWISE_TIMES = ("prompt_time", "token_time")
_SPLITWISE_COLUMNS = ("model", "hardware", "tensor_parallel", *_SPLITWISE_COUNTS, *_SPLITWISE_TIMES)


def splitwise_profile(path: str | Path, model: str, hardware: str, tp: int, max_kv_tokens: int | None = None) -> ProfileData:
    p = Path(path)
    rows = _splitwise_rows(p)
    sel = [
        (line, r) for line, r in rows
        if r.get("model") == model and r.get("hardware") == hardware and r.get("tensor_parallel") == str(tp)
    ]
    if not sel:
        combos = sorted({(r.get("model"), r.get("hardware"), r.get("tensor_parallel")) for _, r in rows})
        raise ProfileConvertError(f"{p}: no rows for {model}/{hardware}/tp{tp}; have {combos[:12]}")
    prefill: dict[int, list[float]] = defaultdict(list)
    decode: dict[tuple[int, float], list[float]] = defaultdict(list)
    for line, r in sel:
        batch, prompt, tokens = (_splitwise_count(p, line, r, k) for k in _SPLITWISE_COUNTS)
        prompt_time, token_time = (_splitwise_time(p, line, r, k) for k in _SPLITWISE_TIMES)
        prefill[batch * prompt].append(prompt_time)
        decode[(batch, prompt + tokens / 2.0)].append(token_time)
    kv_cap = max_kv_tokens or int(max(b * ctx for b, ctx in decode) + 1)
    isl = sorted(prefill)
    # a batch whose KV does not fit was kept at usage 1.0, "a full cache takes the larger
    # batch's time"; it is left out, as DistServe's grid points beyond the cache are
    points = sorted(k for k in decode if k[0] * k[1] <= kv_cap)
    if not points:
        least = min(b * ctx for b, ctx in decode)
        raise ProfileConvertError(f"{p}: max_kv_tokens: {kv_cap} holds no measured batch of {model}/{hardware}/"
                                  f"tp{tp} (the smallest holds {least:g} KV tokens)")
    return _profile(
        p,
        prefill_isl=np.array(isl, dtype=float),
        prefill_ttft_ms=np.array([np.mean(prefill[i]) for i in isl]),
        x_kv_usage=np.array([b * c / kv_cap for b, c in points]),
        y_context_length=np.array([c for _, c in points]),
        z_itl_ms=np.array([np.mean(decode[k]) for k in points]),
        max_kv_tokens=kv_cap, name=f"splitwise-{model}-{hardware}-tp{tp}", model=model, gpu=hardware, tp=tp, engine_gpus=tp,
    )


def _splitwise_rows(p: Path) -> list[tuple[int, dict[str, str]]]:
    """``(line number, row)`` for every data row; the header must have the columns used."""
    reader = csv.DictReader(io.StringIO(_read_text(p), newline=""))
    missing = [c for c in _SPLITWISE_COLUMNS if c not in (reader.fieldnames or ())]
    if reader.fieldnames and missing:
        raise ProfileConvertError(f"{p}: line 1: header: missing column(s) {', '.join(missing)}")
    return [(reader.line_num, row) for row in reader]


def _splitwise_count(p: Path, line: int, row: dict[str, str], key: str) -> int:
    least = _SPLITWISE_COUNTS[key]
    text = (row.get(key) or "").strip()
    if not (text.isascii() and text.isdigit()) or int(text) < least:
        expected = "a positive integer" if least else "a non-negative integer"
        raise ProfileConvertError(f"{p}: line {line}: {key}: {expected}, got {row.get(key)!r}")
    return int(text)


def _splitwise_time(p: Path, line: int, row: dict[str, str], key: str) -> float:
    """A measured time in ms: a NaN or a non-positive time is a failed measurement, not a point."""
    try:
        value = float(row.get(key) or "")
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ProfileConvertError(f"{p}: line {line}: {key}: a finite number > 0, got {row.get(key)!r}")
    return value


DISTSERVE_KV_TOKENS = {
    ("facebook/opt-13b", 1): 66_144,
    ("facebook/opt-13b", 2): 163_008,
    ("facebook/opt-13b", 4): 356_736,
    ("facebook/opt-13b", 8): 744_208,
    ("facebook/opt-66b", 2): 11_600,
    ("facebook/opt-66b", 3): 45_056,
    ("facebook/opt-66b", 4): 78_496,
    ("facebook/opt-66b", 8): 212_304,
    ("facebook/opt-175b", 8): 59_520,
}
"""(model, TP) -> KV-cache tokens of one engine (TP A100-80GB GPUs, no pipeline), from
DistServe's ``max_num_tokens.csv`` (rows with pp = 1). DistServe measurements, LLMServe,
Apache-2.0. A converted profile's KV-usage axis and the simulated engine's cache are this
engine's: OPT-13B's one-GPU 66,144 given to every model and TP made a TP2 engine's cache
0.4 times DistServe's and an OPT-66B TP2 engine's 5.7 times."""

_DISTSERVE_ISL = (16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048)
_DISTSERVE_CONTEXTS = (64, 128, 256, 512, 768, 1024, 1536, 2048)
_DISTSERVE_BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)


def distserve_profile(
    path: str | Path, model: str = "facebook/opt-13b", tp: int = 1, max_kv_tokens: int | None = None,
    host_ms_per_seq: float = 0.0,
) -> ProfileData:
    if not (math.isfinite(host_ms_per_seq) and host_ms_per_seq >= 0):
        raise ProfileConvertError(f"host_ms_per_seq: expected a finite number >= 0, got {host_ms_per_seq}")
    if max_kv_tokens is None:
        max_kv_tokens = DISTSERVE_KV_TOKENS.get((model, tp))
        if max_kv_tokens is None:
            raise ProfileConvertError(f"max_kv_tokens: {_unknown_kv(model, tp)}")
    if max_kv_tokens < _DISTSERVE_CONTEXTS[0]:
        # no sampled (batch, context) point fits: the profile would have no decode rows
        raise ProfileConvertError(
            f"max_kv_tokens: at least {_DISTSERVE_CONTEXTS[0]} (one sequence at the shortest "
            f"sampled context), got {max_kv_tokens}"
        )
    p = Path(path)
    params, where = _distserve_params(p, model, tp)
    pa, pb, pc = _coefficients(p, where, params, "prefill")
    threshold = _threshold(p, where, params)
    small = _coefficients(p, where, params, "decoding_smallbs")
    large = _coefficients(p, where, params, "decoding_largebs")
    isl = np.array(_DISTSERVE_ISL, dtype=float)
    ttft = pa + pb * isl + pc * isl * isl
    _check_positive(p, where, ttft, [("prefill", f"{int(n)} tokens") for n in isl])
    usage, ctx, itl, at = [], [], [], []
    for c in _DISTSERVE_CONTEXTS:
        for batch in _DISTSERVE_BATCHES:
            kv = batch * c
            if kv > max_kv_tokens:
                break
            key, (a, b, cc) = ("decoding_smallbs", small) if batch < threshold else ("decoding_largebs", large)
            usage.append(kv / max_kv_tokens)
            ctx.append(float(c))
            itl.append(a + b * kv + (cc + host_ms_per_seq) * batch)
            at.append((key, f"batch {batch} at context {c}"))
    _check_positive(p, where, np.array(itl), at)
    return _profile(
        p,
        prefill_isl=isl, prefill_ttft_ms=ttft, x_kv_usage=np.array(usage), y_context_length=np.array(ctx),
        z_itl_ms=np.array(itl), max_kv_tokens=max_kv_tokens, name=f"distserve-{model}-tp{tp}", model=model,
        gpu="a100-80gb", tp=tp, engine_gpus=tp,
    )


def _distserve_params(p: Path, model: str, tp: int) -> tuple[dict, str]:
    """The coefficient block of one model and TP, and its name for errors."""
    try:
        data = json.loads(_read_text(p))
    except json.JSONDecodeError as err:
        raise ProfileConvertError(f"{p}: line {err.lineno}: not JSON ({err.msg})") from None
    if not isinstance(data, dict) or model not in data or not isinstance(data[model], dict):
        have = sorted(data) if isinstance(data, dict) else []
        raise ProfileConvertError(f"{p}: no coefficients for model {model!r}; have {have[:12]}")
    params = data[model].get(str(tp))
    if not isinstance(params, dict):
        raise ProfileConvertError(f"{p}: no coefficients for {model} tp{tp}; have tp {sorted(data[model])}")
    return params, f"{model} tp{tp}"


def _coefficients(p: Path, where: str, params: dict, key: str) -> tuple[float, float, float]:
    value = params.get(key)
    if not (isinstance(value, list) and len(value) == 3 and all(_is_number(v) for v in value)):
        raise ProfileConvertError(f"{p}: {where} {key}: three numbers, got {value!r}")
    return float(value[0]), float(value[1]), float(value[2])


def _threshold(p: Path, where: str, params: dict) -> float:
    key = "decoding_large_small_bs_threshold"
    value = params.get(key)
    if not _is_number(value):
        raise ProfileConvertError(f"{p}: {where} {key}: a number (a batch size), got {value!r}")
    return float(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_positive(p: Path, where: str, ms: np.ndarray, at: list[tuple[str, str]]) -> None:
    """A fit may have a negative coefficient, but every time it gives must be > 0 ms.

    ``at`` names, per sampled time, the coefficient key it came from and the point.
    """
    bad = np.flatnonzero(~(ms > 0))
    if bad.size:
        key, point = at[int(bad[0])]
        raise ProfileConvertError(
            f"{p}: {where} {key}: coefficients that give a time > 0 ms, got {ms[bad[0]]:.6g} ms at {point}"
        )


def _read_text(p: Path) -> str:
    """The file as UTF-8 text; a byte that is not UTF-8 is reported with its line."""
    try:
        content = p.read_bytes()
    except OSError as err:
        raise ProfileConvertError(f"{p}: cannot read ({err.strerror})") from None
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = content.count(b"\n", 0, err.start) + 1
        raise ProfileConvertError(f"{p}: line {line}: not UTF-8 (byte 0x{content[err.start]:02x})") from None


def _profile(p: Path, **fields) -> ProfileData:
    """``ProfileData`` of a converted table; a range error names the table."""
    try:
        return ProfileData(**fields)
    except InvalidProfile as err:
        raise ProfileConvertError(f"{p}: converted profile: {err}") from None


def profile_from_spec(spec: str) -> ProfileData | None:
    """A converted profile for ``splitwise:...`` / ``distserve:...`` specs; None otherwise.

    A spec of the wrong shape gets the syntax message; a bad number in it
    names its part (TP, MAX_KV, ...); a bad file gets the file's own error,
    not the syntax message: the spec was right.
    """
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("splitwise", "distserve"):
        return None
    parts = rest.split(":")
    if kind == "splitwise":
        if len(parts) not in (4, 5):
            raise _spec_syntax(spec)
        path, model, hardware, tp = parts[:4]
        kv = _spec_positive_int(spec, "MAX_KV", parts[4]) if len(parts) == 5 else None
        return splitwise_profile(path, model, hardware, _spec_positive_int(spec, "TP", tp), kv)
    if len(parts) not in (3, 4, 5):
        raise _spec_syntax(spec)
    path, model, tp = parts[:3]
    tp_value = _spec_positive_int(spec, "TP", tp)
    kv = _spec_positive_int(spec, "MAX_KV", parts[3]) if len(parts) >= 4 else DISTSERVE_KV_TOKENS.get((model, tp_value))
    if kv is None:
        raise ProfileConvertError(f"{spec}: MAX_KV: {_unknown_kv(model, tp_value)}")
    if kv < _DISTSERVE_CONTEXTS[0]:
        raise ProfileConvertError(
            f"{spec}: MAX_KV: at least {_DISTSERVE_CONTEXTS[0]} tokens (one sequence at the "
            f"shortest sampled context), got {kv}"
        )
    host = _spec_host_ms(spec, parts[4]) if len(parts) == 5 else 0.0
    return distserve_profile(path, model, tp_value, kv, host)


def _unknown_kv(model: str, tp: int) -> str:
    have = ", ".join(f"{m} tp{t}" for m, t in DISTSERVE_KV_TOKENS)
    return f"no KV capacity for {model} tp{tp} in DistServe's max_num_tokens.csv (have {have}); give it"


def _spec_syntax(spec: str) -> ProfileConvertError:
    return ProfileConvertError(
        f"{spec}: expected splitwise:FILE:MODEL:HARDWARE:TP[:MAX_KV] or "
        "distserve:FILE:MODEL:TP[:MAX_KV[:HOST_MS_PER_SEQ]]"
    )


def _spec_positive_int(spec: str, name: str, text: str) -> int:
    """A spec's TP or MAX_KV: blamed on the spec, since that is where the value came from."""
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise ProfileConvertError(f"{spec}: {name}: a positive integer, got {text!r}")
    return int(text)


def _spec_host_ms(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ProfileConvertError(f"{spec}: HOST_MS_PER_SEQ: a finite number >= 0, got {text!r}")
    return value


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
