"""Presets: a research release's checkpoints into a directory Hugging Face loads.

A preset is data: a rules file shipped beside this module (``hf-bert.toml``: which
tensors, their names, their layouts) and a small translator of the release's own
config file (``bert_config.json``) into the ``config.json`` transformers reads, which
also names the architecture the checkpoint's tensors make (one module per family:
``bert.py``; what a preset is: ``family.py``). A family whose names follow a convention
rather than a list (``hf-tf2``: Hugging Face's TF models) makes its rules from the
source's names, shapes and config instead. :func:`export_preset` runs an export with
them; every tensor the rules do not name is an error listing them all.

>>> tfckpt.interop.presets.export_preset("uncased_L-12_H-768_A-12/bert_model.ckpt", "hf/")
>>> transformers.AutoModelForPreTraining.from_pretrained("hf/")
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.errors import CheckpointError, did_you_mean, option
from tfckpt.interop.comparing import compare, open_output
from tfckpt.interop.export import close_opened, plan_export
from tfckpt.interop.presets import (
    albert,
    bert,
    electra,
    gpt2,
    gpt_neo,
    hf_tf2,
    loading,
    mobilebert,
    mobilenet,
    openai_gpt,
    pegasus,
    roformer,
    t5,
    validation,
    xlnet,
)
from tfckpt.interop.presets.family import (
    MAX_CONFIG_BYTES,
    Preset,
    Refused,
    parse_json,
    read_json,
)
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.rewrite.edits import Rows
from tfckpt.rewrite.engine import Summary, execute
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.plans import Plan, PlannedTensor
from tfckpt.rewrite.rules import UNMAPPED, given_patterns
from tfckpt.rewrite.rulesfile import with_rules

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        bert.PRESET,
        albert.PRESET,
        electra.PRESET,
        electra.GENERATOR_PRESET,
        roformer.PRESET,
        mobilebert.PRESET,
        gpt2.PRESET,
        gpt_neo.PRESET,
        openai_gpt.PRESET,
        t5.PRESET,
        pegasus.PRESET,
        xlnet.PRESET,
        mobilenet.V1_PRESET,
        mobilenet.V2_PRESET,
        hf_tf2.PRESET,
    )
}


def find(name: str, names: list[str]) -> Preset:
    """The preset called ``name``, or with ``'auto'`` the one whose family the source
    ``names`` are of (its markers: no two families share one, so one preset at most
    recognises a checkpoint); an error naming the presets there are."""
    if name == "auto":
        found = [p for p in PRESETS.values() if p.knows(names)]
        if not found:
            raise CheckpointError(
                f"--preset auto: no preset recognises these tensors (presets: {', '.join(PRESETS)})"
            )
        if len(found) > 1:
            raise CheckpointError(
                f"--preset auto: these tensors are of {' and of '.join(p.name for p in found)} "
                "(name one with --preset)"
            )
        return found[0]
    if name not in PRESETS:
        near = did_you_mean(name, [*PRESETS, "auto"])
        raise CheckpointError(f"no preset {name!r}{near} (presets: {', '.join(PRESETS)}, auto)")
    return PRESETS[name]


def release_config(
    preset: Preset,
    config,
    store: Storage,
    directory: str,
    storage_options,
    values: Mapping[str, Any] | None = None,
) -> tuple[str, dict]:
    """The release's config: ``config`` if given (a path or URL), else the first of the
    preset's file names found in ``directory`` (the checkpoint's, on ``store``), read
    with the preset's reader, with ``values`` (``--config-value``) laid over it; its
    path and settings. Without a file, ``values`` alone where the preset can do
    without one."""
    if config is not None:
        path = normalize(config)
        candidates = [(storage_for(path, storage_options), path)]
    else:
        candidates = [(store, store.join(directory, n)) for n in preset.config_files]
    for where, path in candidates:
        if config is None and not where.isfile(path):
            continue
        try:
            data = preset.read(_read_bounded(where, path))
        except OSError as e:
            raise CheckpointError(f"cannot read the config: {e.strerror}", path=path) from None
        except Refused as e:
            raise CheckpointError(f"the config is refused: {e}", path=path) from None
        except ValueError as e:
            raise CheckpointError(f"the config cannot be read: {e}", path=path) from None
        return path, {**data, **(values or {})}
    if values or not preset.needs_config:
        return directory, dict(values or {})
    raise CheckpointError(
        f"{preset.name} needs the release's config ({' or '.join(preset.config_files)} "
        "beside the checkpoint, or --config, or its settings with --config-value)",
        path=directory,
    )


def _read_bounded(store: Storage, path: str) -> bytes:
    """A config file's bytes; :class:`Refused` past :data:`MAX_CONFIG_BYTES`, found from
    its size before it is read."""
    reader = store.open_reader(path)  # refuses what is not a regular file
    try:
        size = reader.size
    finally:
        reader.close()
    if size > MAX_CONFIG_BYTES:
        raise Refused(f"it is {size} bytes; a config is at most {MAX_CONFIG_BYTES >> 20} MiB")
    data = store.read_bytes(path)
    if len(data) > MAX_CONFIG_BYTES:  # it grew
        raise Refused(f"a config is at most {MAX_CONFIG_BYTES >> 20} MiB")
    return data


def config_values(given: list[str]) -> dict[str, Any]:
    """``--config-value KEY=VALUE``s as settings: VALUE as JSON where it is JSON (nested
    at most :data:`~tfckpt.interop.presets.family.MAX_DEPTH` levels, its numbers
    finite: an error otherwise), else as text."""
    out = {}
    for item in given:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise CheckpointError(f"--config-value {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = parse_json(text)
        except Refused as e:
            raise CheckpointError(f"--config-value {key.strip()}: {e}") from None
        except ValueError:
            out[key.strip()] = text
    return out


def plan_preset(
    src,
    out_dir,
    preset: str = "auto",
    options: Options | None = None,
    *,
    config=None,
    config_values: Mapping[str, Any] | None = None,
    output_config: bool = False,
    storage_options: StorageOptions | None = None,
    written_config: Mapping[str, Any] | None = None,
    **changes,
) -> tuple[Plan, Preset, str]:
    """The export plan of ``src`` into ``out_dir``'s ``model.safetensors`` with a
    preset's rules (those of ``options`` tried first), the tensors the architecture has
    no place for left out; the preset and the architecture chosen. The plan's sources
    are open: close them with :func:`~tfckpt.interop.export.close_opened`.

    A preset that makes its rules from the source (``hf-tf2``) reads the config here:
    ``config`` and ``config_values`` as for :func:`export_preset`; with ``output_config``,
    the ``config.json`` an export wrote into ``out_dir`` when none is beside the source.
    A preset that computes tensors the release does not store (``made``) makes them of
    ``written_config`` (the ``config.json`` it writes), or with ``output_config`` of the
    one in ``out_dir``; without either they are not planned."""
    with open_checkpoint(src, storage_options=storage_options) as ckpt:
        names = ckpt.keys()
        chosen = find(preset, names)
        made: dict[str, Any] | None = None
        if chosen.from_source is not None:
            shapes = {n: ckpt.info(n).shape for n in names}
            where = ckpt.storage, ckpt.storage.dirname(ckpt.prefix) or "."
            release = _source_config(
                chosen, config, where, out_dir, output_config, storage_options, config_values
            )
            made, arch = chosen.from_source(shapes, release)
    given = Options.of(options, **changes)
    # A preset's rules name what a family's releases may hold, not all of them: only the
    # caller's patterns must match a tensor (checked below).
    opts = with_rules(Options.of(given, allow_unmatched=True), chosen.rules())
    if made is not None:
        opts = with_rules(opts, made)
    out_dir = normalize(out_dir)
    out = storage_for(out_dir, storage_options).join(out_dir, "model.safetensors")
    p = _plan_pt(chosen, src, out, opts, storage_options)
    if made is None:
        arch = chosen.architecture(_shapes(p))
    unused = chosen.unused.get(arch, ())
    if chosen.made is not None and written_config is None and output_config:
        written_config = _written_config(out_dir, storage_options)
    computed = chosen.made(written_config) if chosen.made and written_config else {}
    planned = _shapes(p)  # what the source holds wins over what the preset would compute
    computed = {k: v for k, v in computed.items() if k not in planned}
    if unused or computed:  # planned again without them, or with the computed ones
        close_opened(p, src)
        opts = with_rules(opts, {"exclude": list(unused)}) if unused else opts
        p = _plan_pt(chosen, src, out, opts, storage_options, computed)
    if chosen.zeroed is not None and written_config:
        try:
            _zero_rows(p, chosen.zeroed(written_config))
        except CheckpointError as e:
            close_opened(p, src)
            raise _refused_by(chosen.name, e) from None
    mine = given_patterns(given)
    p.unmatched = [u for u in p.unmatched if u in mine]
    p.options = Options.of(p.options, allow_unmatched=given.allow_unmatched)
    try:
        p.check_matched()
    except BaseException:
        close_opened(p, src)
        raise
    return p, chosen, arch


def _plan_pt(
    chosen: Preset,
    src,
    out: str,
    opts: Options,
    storage_options: StorageOptions | None,
    made=None,
) -> Plan:
    """The export plan into ``out``, its tensors in a PyTorch model's layouts (the
    preset's rules) with the tensors it computes (``made``): its safetensors metadata
    says so, as PyTorch's writers do. What the rules refuse (a tensor none names) is
    said as the preset's refusal."""
    try:
        p = plan_export(
            src, out, opts, storage_options=storage_options, format="safetensors", made=made
        )
    except CheckpointError as e:
        if type(e) is not CheckpointError:  # a file not found, or damaged: not the rules'
            raise
        raise _refused_by(chosen.name, e) from None
    p.output.framework = "pt"
    return p


def _zero_rows(p: Plan, rows: Mapping[str, tuple[int, ...]]) -> None:
    """The planned tensors named in ``rows`` written with those rows (along the first
    axis) zero, the others read from the source as they are: an edit the engine streams
    (and the verification reads) as ``tfckpt edit --remap-rows`` does."""
    where = {n: i for i, n in enumerate(p.tensors.new_name) if n in rows}
    for name, zero in rows.items():
        if name not in where:
            continue  # the tensor is not written (left out by the caller's rules)
        pt = PlannedTensor.at(p.tensors, where[name])
        if pt.perm is not None or pt.parts is not None or pt.shape is not None or pt.edit:
            raise CheckpointError(
                "its rows are zeroed as the preset writes it, which another transform of "
                "its values forbids",
                tensor=name,
            )
        shape = pt.info.shape
        if not shape or any(not 0 <= r < shape[0] for r in zero):
            raise CheckpointError(
                f"rows {list(zero)} are to be zeroed, but it has the shape {list(shape)}",
                tensor=name,
            )
        index = np.arange(shape[0], dtype=np.int64)
        index[list(zero)] = -1
        pt.edit = Rows(0, index)


def _refused_by(name: str, e: CheckpointError) -> CheckpointError:
    """``e`` said as preset ``name``'s refusal (on the command line too); a tensor no
    rule names, as one the family's model in transformers has no place for."""
    where = e.message[: len(e.message) - len(e.detail)]  # "path: tensor 'x': "
    reason = ", which transformers' model of this family has no place for"
    reason = reason if UNMAPPED in e.detail else ""
    out = CheckpointError(f"{name}: {e.detail}{reason}", path=e.path, tensor=e.tensor)
    out.cli_message = f"{where}{name}: {e.cli_message[len(where) :]}{reason}"
    return out


def _written_config(out_dir: str, storage_options) -> dict | None:
    """The ``config.json`` an export wrote into ``out_dir`` (None where there is none),
    read as :func:`~tfckpt.interop.presets.loading.verify_config` reads it."""
    store = storage_for(out_dir, storage_options)
    path = store.join(out_dir, "config.json")
    if not store.isfile(path):
        return None
    try:
        return read_json(_read_bounded(store, path))
    except OSError as e:
        raise CheckpointError(f"cannot read the config: {e.strerror}", path=path) from None
    except ValueError as e:  # Refused too
        raise CheckpointError(f"the config cannot be read: {e}", path=path) from None


def _source_config(
    chosen: Preset,
    config,
    where: tuple[Storage, str],
    out_dir,
    output_config: bool,
    storage_options,
    values: Mapping[str, Any] | None,
) -> dict:
    """The release's config for a preset that plans from it (see :func:`plan_preset`):
    ``config``, else the one beside the source (``where``: its storage and directory),
    else with ``output_config`` the one an export copied into ``out_dir``."""
    store, directory = where
    if config is None and output_config:
        beside = [store.join(directory, n) for n in chosen.config_files]
        if not any(store.isfile(b) for b in beside):
            out = normalize(out_dir)
            config = storage_for(out, storage_options).join(out, "config.json")
    return release_config(chosen, config, store, directory, storage_options, values)[1]


def export_preset(
    src,
    out_dir,
    preset: str = "auto",
    options: Options | None = None,
    *,
    config=None,
    config_values: Mapping[str, Any] | None = None,
    storage_options: StorageOptions | None = None,
    dry_run: bool = False,
    verify: bool = True,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    **changes,
) -> Summary:
    """Export ``src`` with a preset into ``out_dir``: ``config.json`` and
    ``model.safetensors`` (sharded with ``max_shard_bytes``, with its
    ``model.safetensors.index.json``), committed together, as transformers'
    ``from_pretrained(out_dir)`` loads them.

    ``preset`` names one of :data:`PRESETS`, or ``'auto'``: the family the source's
    names are of. ``config``: the release's config file (by default looked for beside
    the checkpoint); ``config_values``: settings laid over it (or, where the preset can
    do without a file, all of them). ``options`` and keyword arguments as for
    :func:`tfckpt.export` (``cast``, ``max_shard_bytes``, ``overwrite``,
    ``allow_unmapped``...): their rules are tried before the preset's. ``verify``:
    once written, every tensor of the output is read back and compared, bit for bit,
    with what the preset makes of the source (:mod:`tfckpt.interop.comparing`); a
    difference is an error naming each. The summary's ``warnings`` say which preset
    and architecture were chosen and what was verified; unmapped tensors left out
    (``allow_unmapped``) are in ``skipped``.

    >>> export_preset("uncased_L-12_H-768_A-12/bert_model.ckpt", "hf/", cast="bfloat16")
    """
    p, chosen, arch = plan_preset(
        src,
        out_dir,
        preset,
        options,
        config=config,
        config_values=config_values,
        storage_options=storage_options,
        **changes,
    )
    try:
        shapes = _shapes(p)
        ckpt = p.sources[0].ckpt
        store, directory = ckpt.storage, ckpt.storage.dirname(ckpt.prefix)
        config_path, release = release_config(
            chosen, config, store, directory or ".", storage_options, config_values
        )
        try:
            # Checked as transformers' config class and model take it, before any write.
            config_json = validation.config_json(chosen.translate(release, shapes, arch))
        except CheckpointError as e:  # said as the preset's refusal
            detail = e.detail + _given(e.detail, config_values)
            raise CheckpointError(f"{chosen.name}: {detail}", path=config_path) from None
        out_dir = p.storage.dirname(p.output.out)
        target = p.storage.join(out_dir, "config.json")
        if not p.options.overwrite and p.storage.exists(target):
            raise CheckpointError(
                f"the output already exists (use {option('overwrite=True', '--overwrite')})",
                path=target,
            )
        if chosen.made is not None or chosen.zeroed is not None:  # planned again with
            # the tensors it computes and the rows it zeroes
            close_opened(p, src)
            p, chosen, arch = plan_preset(
                src,
                out_dir,
                chosen.name,
                options,
                config=config,
                config_values=config_values,
                storage_options=storage_options,
                written_config=json.loads(config_json),
                **changes,
            )
        p.output.extra = ((target, config_json),)
        notes = [f"preset {preset}: {chosen.name} ({arch})"]
        if dry_run:
            summary = p.output.summary(p)
        else:
            if verify:  # transformers' own verdict on the config, before anything is written
                loading.load_config(config_json, config_path, made_of=True)
            if on_total is not None:
                on_total(p.output.summary(p).bytes_out)
            summary = execute(p, progress=progress)
            if verify:
                notes.append(_verified(p, out_dir))
                notes.append(loading.verify_config(p.storage, out_dir).note())
    finally:
        close_opened(p, src)
    summary.warnings += notes
    return summary


def _given(detail: str, values: Mapping[str, Any] | None) -> str:
    """Which of the settings ``values`` an error's ``detail`` names: they were given, not
    read from the config file."""
    named = [k for k in values or () if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", detail)]
    if not named:
        return ""
    return f" (set by {option('config_values', '--config-value')} {', '.join(named)})"


def _verified(p: Plan, out_dir: str) -> str:
    """The written export of ``p`` compared with its sources: a note, or an error."""
    with open_output(p.storage, out_dir) as output:
        proof = compare(p, output, out_dir)
    if not proof.written_ok:  # allowed unmapped tensors are listed in the summary's skipped
        problems = proof.problems(unaccounted=False)
        more = f" and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise CheckpointError(
            "the output does not hold what the preset makes of the source: "
            + "; ".join(problems[:10])
            + more,
            path=out_dir,
        )
    return f"verified: {proof.checked} tensors equal the source's bit for bit"


def _shapes(p) -> dict[str, tuple[int, ...]]:
    """The shape each tensor of an export's plan is written in, by its new name."""
    return {o.new_name: o.shape for _, outs in p.output.files for o in outs}
