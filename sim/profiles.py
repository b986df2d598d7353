"""Read engine profiles (Dynamo's profiler NPZ/JSON) into :class:`ProfileData`.

Layouts understood, as the Dynamo planner and its profiler write them:

- a profiling results directory: ``selected_prefill_interpolation/raw_data.npz``
  and ``selected_decode_interpolation/raw_data.npz``, or the JSON fallback
  ``prefill_raw_data.json`` / ``decode_raw_data.json`` with the same keys;
- a pre-swept pair ``<stem>__prefill.npz`` / ``<stem>__decode.npz`` (or
  ``prefill.npz`` / ``decode.npz``), whose arrays may be stacked over several
  parallel configs, shape (n_configs, n); ``tp`` picks one, else
  ``engine_gpus`` the one whose engine has that many GPUs (tp·dp·pp), else
  the config with the fewest GPUs;
- either file of a pair (its partner is found by name), or a bundled name
  (:data:`BUNDLED_PROFILES`) shipped as package data in ``profile_data/``.

Every problem is a :class:`ProfileError` naming the file and the key.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from fleetplan.models.perf import FILE_KEYS, InvalidProfile, ProfileData

BUNDLED_PROFILES = {
    "h200-llama3.1-8b": "h200_sxm__vllm__nvidia__Llama-3.1-8B-Instruct-FP8",
    "h100-llama3.3-70b": "h100_sxm__vllm__nvidia__Llama-3.3-70B-Instruct-FP8",
}
"""Bundled profile name -> file stem in ``fleetplan.sim/profile_data``."""

_PREFILL_KEYS = ("prefill_isl", "prefill_ttft")
_DECODE_KEYS = ("x_kv_usage", "y_context_length", "z_itl", "max_kv_tokens")
_DIR_CANDIDATES = {
    "prefill": (
        "selected_prefill_interpolation/raw_data.npz",
        "prefill_raw_data.json",
        "selected_prefill_interpolation/prefill_raw_data.json",
        "prefill.npz",
    ),
    "decode": (
        "selected_decode_interpolation/raw_data.npz",
        "decode_raw_data.json",
        "selected_decode_interpolation/decode_raw_data.json",
        "decode.npz",
    ),
}


class ProfileError(ValueError):
    """A profile that cannot be read; ``path`` and ``key`` (None if file-level) say where."""

    def __init__(self, path: object, key: str | None, message: str) -> None:
        where = f"{path}" if key is None else f"{path}: key {key!r}"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.key = key


@dataclass(frozen=True)
class _Source:
    label: str  # shown in errors
    data: dict[str, np.ndarray]


def bundled_profile_names() -> tuple[str, ...]:
    return tuple(BUNDLED_PROFILES)


def load_profile(
    name_or_path: str | os.PathLike[str], tp: int | None = None, engine_gpus: int | None = None
) -> ProfileData:
    """Load a bundled profile by name, or a profile file/directory by path.

    Of a file stacked over parallel configs, ``tp`` picks one; without it
    ``engine_gpus`` picks the config whose engine has that many GPUs, so a
    deployment of 8-GPU engines is timed on the TP8 rows, not the fewest.
    """
    key = os.fspath(name_or_path)
    if key in BUNDLED_PROFILES:
        prefill, decode = _bundled_sources(BUNDLED_PROFILES[key])
        return _build(prefill, decode, tp, engine_gpus, name=key)
    path = Path(key)
    if not path.exists():
        raise ProfileError(
            path, None, f"no such file or directory (bundled profiles: {', '.join(BUNDLED_PROFILES)})"
        )
    if path.is_dir():
        found = {role: _first_existing(path, names) for role, names in _DIR_CANDIDATES.items()}
        if found["prefill"] is None and found["decode"] is None:
            looked = ", ".join(n for names in _DIR_CANDIDATES.values() for n in names)
            raise ProfileError(path, None, f"no profiling data found (looked for {looked})")
        prefill = _read(found["prefill"]) if found["prefill"] else None
        decode = _read(found["decode"]) if found["decode"] else None
        return _build(prefill, decode, tp, engine_gpus, name=path.name)
    return _load_file(path, tp, engine_gpus)


# -- locating ------------------------------------------------------------------


def _bundled_sources(stem: str) -> tuple[_Source, _Source]:
    folder = resources.files("fleetplan.sim").joinpath("profile_data")
    sources = []
    for role in ("prefill", "decode"):
        entry = folder.joinpath(f"{stem}__{role}.npz")
        sources.append(_read_npz_bytes(entry.read_bytes(), str(entry)))
    return sources[0], sources[1]


def _first_existing(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def _partner(path: Path, role: str) -> Path | None:
    """The other half of a prefill/decode pair, found by name."""
    other = "decode" if role == "prefill" else "prefill"
    if path.name == "raw_data.npz" and path.parent.name == f"selected_{role}_interpolation":
        candidate = path.parent.parent / f"selected_{other}_interpolation" / "raw_data.npz"
    else:
        head, sep, tail = path.name.rpartition(role)
        if not sep:
            return None
        candidate = path.with_name(head + other + tail)
    return candidate if candidate.is_file() else None


def _load_file(path: Path, tp: int | None, engine_gpus: int | None) -> ProfileData:
    """One file: it holds one role (its partner, if any, holds the other) or both.

    A role is in the file when any of its keys is, as for decode: with ``all``, a file of
    both roles that lost ``prefill_ttft`` loaded as decode-only, its prefill rows dropped
    without a word; now the missing key is named.
    """
    source = _read(path)
    has_prefill = any(k in source.data for k in _PREFILL_KEYS)
    has_decode = any(k in source.data for k in _DECODE_KEYS)
    if not has_prefill and not has_decode:
        raise ProfileError(path, "prefill_isl", "missing key (no prefill or decode data in this file)")
    own_role = "prefill" if has_prefill else "decode"
    partner = None if has_prefill and has_decode else _partner(path, own_role)
    other = _read(partner) if partner is not None else None
    prefill = source if has_prefill else other
    decode = source if has_decode else other
    return _build(prefill, decode, tp, engine_gpus, name=_stem(path))


def _stem(path: Path) -> str:
    name = path.name.split(".")[0]
    for suffix in ("__prefill", "__decode", "_prefill", "_decode"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


# -- reading -------------------------------------------------------------------


def _read(path: Path) -> _Source:
    if path.suffix == ".json":
        try:
            raw = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is not JSON
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProfileError(path, None, f"not a readable JSON file ({exc})") from None
        if not isinstance(raw, dict):
            raise ProfileError(path, None, "JSON root must be an object of arrays")
        data = {}
        for k, v in raw.items():
            try:
                data[k] = np.asarray(v)
            except (TypeError, ValueError) as exc:
                raise ProfileError(path, k, f"not an array ({exc})") from None
        return _Source(str(path), data)
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise ProfileError(path, None, f"cannot read ({exc})") from None
    return _read_npz_bytes(content, str(path))


def _read_npz_bytes(content: bytes, label: str) -> _Source:
    if not content.startswith(b"PK"):
        # numpy reads anything else as a pickle and refuses it with advice to allow pickles
        raise ProfileError(label, None, "not a readable NPZ file (not a zip of arrays); a profile is an NPZ, "
                                        "a .json, a bundled name, or a splitwise: or distserve: spec")
    try:
        with np.load(io.BytesIO(content), allow_pickle=False) as npz:
            data = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ProfileError(label, None, f"not a readable NPZ file ({exc})") from None
    return _Source(label, data)


# -- assembling ----------------------------------------------------------------


def _build(
    prefill: _Source | None, decode: _Source | None, tp: int | None, engine_gpus: int | None, name: str
) -> ProfileData:
    fields: dict[str, Any] = {"name": name}
    meta: dict[str, Any] = {}
    if prefill is not None:
        row = _config_row(prefill, _PREFILL_KEYS, tp, engine_gpus)
        fields["prefill_isl"] = _pick(prefill, "prefill_isl", row)
        fields["prefill_ttft_ms"] = _pick(prefill, "prefill_ttft", row)
        meta = _metadata(prefill, row)
    else:
        fields["prefill_isl"] = fields["prefill_ttft_ms"] = np.zeros(0)
    if decode is not None:
        row = _config_row(decode, _DECODE_KEYS[:3], tp, engine_gpus)
        fields["x_kv_usage"] = _pick(decode, "x_kv_usage", row)
        fields["y_context_length"] = _pick(decode, "y_context_length", row)
        fields["z_itl_ms"] = _pick(decode, "z_itl", row)
        fields["max_kv_tokens"] = _max_kv_tokens(decode, row)
        meta = meta or _metadata(decode, row)
    else:
        fields["x_kv_usage"] = fields["y_context_length"] = fields["z_itl_ms"] = np.zeros(0)
    if meta.get("tp") is None:  # no metadata: the asked TP is taken on trust
        meta["tp"] = tp
        meta["engine_gpus"] = tp
    try:
        return ProfileData(**fields, **meta)
    except InvalidProfile as exc:
        key = FILE_KEYS.get(exc.key, exc.key)
        source = prefill if exc.key.startswith("prefill") and prefill is not None else decode
        label = (source or prefill or decode).label  # type: ignore[union-attr]
        raise ProfileError(label, key, str(exc).split(": ", 1)[-1]) from None


def _require(source: _Source, key: str) -> np.ndarray:
    if key not in source.data:
        raise ProfileError(source.label, key, "missing key")
    return source.data[key]


def _config_row(source: _Source, keys: tuple[str, ...], tp: int | None, engine_gpus: int | None) -> int | None:
    """Which config of a stacked file to use; None for a flat (single-config) file."""
    arrays = [_require(source, k) for k in keys]
    ndims = {a.ndim for a in arrays}
    if ndims == {1}:
        _check_tp_matches(source, tp, None)
        return None
    if ndims != {2}:
        raise ProfileError(source.label, keys[0], f"expected 1-D or (configs, n) arrays, got {[a.shape for a in arrays]}")
    n_configs = arrays[0].shape[0]
    for key, a in zip(keys, arrays, strict=True):
        if a.shape[0] != n_configs:
            raise ProfileError(source.label, key, f"has {a.shape[0]} configs, expected {n_configs}")
    if n_configs == 1:
        _check_tp_matches(source, tp, 0)
        return 0
    tps = _meta_column(source, "tp", n_configs)
    if tps is None:
        raise ProfileError(source.label, "tp", f"missing key: needed to choose among {n_configs} configs")
    if tp is not None:
        matches = [i for i, v in enumerate(tps) if v == tp]
        if not matches:
            raise ProfileError(source.label, "tp", f"no config with tp={tp} (have {tps})")
        return matches[0]
    dps = _meta_column(source, "dp", n_configs)
    pps = _meta_column(source, "pp", n_configs)
    gpus = [
        tps[i] * (dps[i] if dps is not None else 1) * (pps[i] if pps is not None else 1)
        for i in range(n_configs)
    ]
    if engine_gpus is not None:
        if engine_gpus not in gpus:
            raise ProfileError(source.label, "tp", f"no config whose engine has {engine_gpus} GPUs, as the config's "
                               f"*_engine_num_gpu say (have {sorted(set(gpus), reverse=True)}); set profile_tp "
                               "to choose one")
        return gpus.index(engine_gpus)
    return gpus.index(min(gpus))


def _check_tp_matches(source: _Source, tp: int | None, row: int | None) -> None:
    if tp is None or "tp" not in source.data:
        return
    have = _meta_value(source, "tp", row)
    if have is not None and _whole(source, "tp", have) != tp:
        raise ProfileError(source.label, "tp", f"file is tp={_whole(source, 'tp', have)}, asked for tp={tp}")


def _meta_column(source: _Source, key: str, n_configs: int) -> list[int] | None:
    """A parallelism column (tp, dp, pp) of a stacked file, one whole number per config."""
    if key not in source.data:
        return None
    column = np.asarray(source.data[key]).reshape(-1)
    if column.size != n_configs:
        raise ProfileError(source.label, key, f"expected {n_configs} values, got {column.size}")
    return [_whole(source, key, v) for v in column.tolist()]


def _whole(source: _Source, key: str, value: Any) -> int:
    """A parallelism degree as an int; anything else is a ProfileError naming the key.

    ``int()`` raised a bare "cannot convert float NaN to integer" for a NaN,
    one that named neither the file nor the key, and cut 2.5 to 2 silently.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 1 or value != int(value):
        raise ProfileError(source.label, key, f"expected a whole number >= 1, got {value!r}")
    return int(value)


def _meta_value(source: _Source, key: str, row: int | None) -> Any:
    if key not in source.data:
        return None
    column = np.asarray(source.data[key]).reshape(-1)
    if column.size == 0:
        return None
    return column[0 if row is None or column.size == 1 else row].item()


def _metadata(source: _Source, row: int | None) -> dict[str, Any]:
    raw_tp = _meta_value(source, "tp", row)
    tp = None if raw_tp is None else _whole(source, "tp", raw_tp)
    gpu = _meta_value(source, "gpu_type", row)
    model = _meta_value(source, "model", row)
    dp, pp = (_whole(source, key, value) if (value := _meta_value(source, key, row)) is not None else 1
              for key in ("dp", "pp"))
    return {
        "gpu": None if gpu is None else str(gpu),
        "model": None if model is None else str(model),
        "tp": tp,
        "engine_gpus": None if tp is None else tp * dp * pp,
    }


def _pick(source: _Source, key: str, row: int | None) -> np.ndarray:
    array = _require(source, key)
    if array.dtype.kind not in "iuf":
        raise ProfileError(source.label, key, f"expected numbers, got dtype {array.dtype}")
    return array if row is None else array[row]


def _max_kv_tokens(source: _Source, row: int | None) -> int:
    values = np.asarray(_require(source, "max_kv_tokens")).reshape(-1)
    if values.dtype.kind not in "iuf" or values.size == 0:
        raise ProfileError(source.label, "max_kv_tokens", "expected a positive integer")
    value = values[0] if values.size == 1 or row is None else values[row] if row < values.size else None
    if value is None or not np.isfinite(value) or value <= 0 or value != np.floor(value):
        raise ProfileError(source.label, "max_kv_tokens", f"expected a positive integer, got {value!r}")
    return int(value)
